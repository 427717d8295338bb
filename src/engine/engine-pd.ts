/**
 * The engine's P/D-disaggregation state, after vLLM's NixlConnector (vllm/distributed/kv_transfer/
 * kv_connector/v1/nixl/scheduler.py) and the scheduler's WAITING_FOR_REMOTE_KVS handling
 * (vllm/v1/core/sched/scheduler.py): the producer's held blocks (held-kv.ts) and what happens to a
 * consumer request when its KV transfer ends. Pure: `now` is passed in.
 */
import type { CpuTier } from "./cpu-tier.ts";
import type { StepScheduler } from "./engine-scheduler.ts";
import {
  type EngineCounters,
  REMOTE_AWAITING,
  REMOTE_LOADED,
  REMOTE_NONE,
  type Req,
} from "./engine-state.ts";
import { HeldKv } from "./held-kv.ts";
import type { KVCacheManager } from "./kv-cache-manager.ts";
import type { EngineConfig, RequestRecord } from "./types.ts";

/**
 * What Engine.completeRemoteKv did: "loaded" (the request goes on to decode), "recompute" (it
 * prefills locally), "failed" (it ended with finishReason "error"; `record` is its final record),
 * "unknown" (no request of that id waits for remote KV).
 */
export interface RemoteKvOutcome {
  outcome: "loaded" | "recompute" | "failed" | "unknown";
  record: RequestRecord | null;
}

export class PdKv {
  readonly held: HeldKv;

  constructor(
    private readonly config: EngineConfig,
    private readonly kv: KVCacheManager,
    private readonly sched: StepScheduler,
    private readonly counters: EngineCounters,
    /** Ends a request (the engine's finish). */
    private readonly finish: (r: Req, reason: "error", now: number) => void,
    private readonly tier: CpuTier | null = null,
  ) {
    this.held = new HeldKv(kv.pool, config.kvLeaseDuration);
  }

  /**
   * vLLM request_finished on a producer: a remoteDecode request that ends "length" with blocks keeps
   * them for the consumer, leased from `now`; its record gets remoteBlockIds (one list per KV group)
   * and remoteNumTokens. Returns false when the blocks are to be freed as usual.
   */
  holdOnFinish(r: Req, reason: string, now: number): boolean {
    if (reason !== "length" || r.input.remoteDecode !== true || r.blocks.length === 0) return false;
    r.record.remoteBlockIds = [r.blocks.slice()];
    r.record.remoteNumTokens = r.numComputed;
    this.held.hold(r.record.id, r.blocks, r.numComputed, now);
    r.blocks = [];
    r.numCachedBlocks = 0;
    return true;
  }

  /**
   * The KV transfer of parked consumer request `id` ended at `now`. ok: every allocated block's
   * tokens count as computed except the last prompt token, which vLLM recomputes
   * (_update_waiting_for_remote_kv); the blocks are hashed into the prefix cache (BlockStored) and
   * the request rejoins the front of the waiting queue to decode. Not ok: kvLoadFailurePolicy
   * "recompute" frees its blocks and requeues it for a local prefill (its local prefix is found
   * again); "fail" (the default) ends it with finishReason "error".
   */
  complete(id: string, now: number, ok: boolean): RemoteKvOutcome {
    const r = this.sched.deferred.get(id);
    if (r === undefined || r.remote !== REMOTE_AWAITING) return { outcome: "unknown", record: null };
    const load = r.cpuLoad;
    if (load !== null) {
      // A CPU-tier load is done only when its modelled copy is: never a free hit.
      if (ok && now < load.readyAt - 1e-9)
        throw new RangeError(
          `request ${id}: its CPU-tier load ends at ${load.readyAt}, not ${now}; complete it at result.offloadLoads[].readyAt`,
        );
      this.tier?.endLoad(load);
      r.cpuLoad = null;
    }
    this.sched.deferred.delete(id);
    if (ok) {
      let computed = Math.min(r.blocks.length * this.config.blockSize, r.numTokens);
      if (computed === r.numTokens) computed--;
      r.remote = REMOTE_LOADED;
      r.externalTokens = Math.max(0, computed - r.record.cachedTokens);
      // A CPU-tier hit is a cached_tokens hit to the client; a P/D transfer is not a cache hit.
      if (load === null) r.record.externalTokens = r.externalTokens;
      else r.record.offloadedTokens = r.externalTokens;
      r.record.cachedTokens = computed;
      r.numComputed = computed;
      this.kv.cacheComputed(r, computed);
      this.sched.enqueueWaiting(r, true);
      return { outcome: "loaded", record: null };
    }
    r.remote = REMOTE_NONE;
    if (this.config.kvLoadFailurePolicy === "recompute") {
      this.kv.freeBlocks(r);
      r.numComputed = 0;
      this.sched.enqueueWaiting(r, true);
      return { outcome: "recompute", record: null };
    }
    this.finish(r, "error", now);
    return {
      outcome: "failed",
      record: { ...r.record, tokenTimes: r.record.tokenTimes.slice(), outputTokenIds: [] },
    };
  }

  /** Frees the holds whose lease ran out by `now`, counting each (vllm:nixl_num_kv_expired_reqs). */
  expireLeases(now: number): string[] {
    const ids = this.held.expire(now);
    this.counters.numKvExpiredReqs += ids.length;
    return ids;
  }
}
