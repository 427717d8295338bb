/**
 * What the engine reports about its state: its stats (the counters and gauges behind the vLLM
 * metrics) and its block-accounting invariants, checked against every live request (for tests): each
 * block's reference count equals the references running, parked, waiting (a consumer request back
 * from its KV transfer) and held (a producer's) requests make; no plain waiting request holds
 * blocks; every running request has blocks for its computed tokens. With a CPU tier, blocks waiting
 * for a store count too, and the tier's capacity and pins hold. Pure.
 */
import type { BlockPool } from "./block-pool.ts";
import type { CpuTier } from "./cpu-tier.ts";
import type { StepScheduler } from "./engine-scheduler.ts";
import type { EngineCounters } from "./engine-state.ts";
import { REMOTE_LOADED } from "./engine-state.ts";
import type { HeldKv } from "./held-kv.ts";
import type { EngineConfig, EngineStats } from "./types.ts";

/** Throws an Error describing the first violation. */
export function checkEngineInvariants(
  config: EngineConfig,
  pool: BlockPool,
  sched: StepScheduler,
  held: HeldKv,
  tier: CpuTier | null = null,
): void {
  pool.checkInvariants();
  const refs = new Int32Array(config.numGpuBlocks);
  refs[0] = 1;
  for (const r of sched.running) for (const b of r.blocks) refs[b]++;
  for (const r of sched.deferred.values()) for (const b of r.blocks) refs[b]++;
  held.countRefs(refs);
  tier?.countRefs(refs);
  for (const r of sched.waiting) {
    if (r.blocks.length !== 0 && r.remote !== REMOTE_LOADED)
      throw new Error(`waiting request ${r.record.id} holds blocks`);
    for (const b of r.blocks) refs[b]++;
  }
  for (let b = 0; b < refs.length; b++)
    if (refs[b] !== pool.refCnt[b])
      throw new Error(`block ${b}: refCnt ${pool.refCnt[b]} but held ${refs[b]} times`);
  for (const r of sched.running) {
    const need = Math.ceil(r.numComputed / config.blockSize);
    if (r.blocks.length < need)
      throw new Error(`request ${r.record.id} computed ${r.numComputed} tokens in ${r.blocks.length} blocks`);
  }
  if (sched.running.length > config.maxNumSeqs) throw new Error("running exceeds maxNumSeqs");
  if (tier === null) return;
  tier.checkInvariants();
  let pins = 0;
  for (const r of sched.deferred.values()) if (r.cpuLoad !== null) pins += r.cpuLoad.keys.length;
  if (pins !== tier.totalPins)
    throw new Error(`cpu tier: ${tier.totalPins} pins but ${pins} loads in flight`);
}

/** The engine's stats now (a fresh object; counters only grow). */
export function engineStats(
  c: EngineCounters,
  sched: StepScheduler,
  pool: BlockPool,
  held: HeldKv,
  tier: CpuTier | null,
): EngineStats {
  const deferred = sched.deferred.size;
  const s: EngineStats = {
    numRequestsRunning: sched.running.length,
    numRequestsWaiting: sched.waiting.length + deferred,
    numRequestsWaitingDeferred: deferred,
    kvCacheUsage: pool.usage(),
    prefixCacheQueries: c.prefixCacheQueries,
    prefixCacheHits: c.prefixCacheHits,
    numPreemptions: c.numPreemptions,
    promptTokens: c.promptTokens,
    promptTokensBySource: {
      local_compute: c.promptTokens - c.promptCacheHit - c.promptExternal,
      local_cache_hit: c.promptCacheHit,
      external_kv_transfer: c.promptExternal,
    },
    generationTokens: c.generationTokens,
    requestSuccess: { ...c.requestSuccess },
    numSteps: c.numSteps,
    numCachedBlocks: pool.numCachedHashes,
    numFreeBlocks: pool.numFreeBlocks,
    numHeldRequests: held.size,
    numKvExpiredReqs: c.numKvExpiredReqs,
  };
  if (tier !== null) s.offload = { ...tier.counters };
  return s;
}
