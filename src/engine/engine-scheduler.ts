/**
 * The simulated engine's scheduler (vLLM v0.26.0 vllm/v1/core/sched/scheduler.py): the
 * waiting and running queues, and which requests run how many tokens in a step. Running requests
 * go first, in order, each taking its remaining tokens within the max_num_batched_tokens budget
 * (so prefills are chunked); when blocks run out the newest running request (under priority
 * scheduling, the least urgent) is preempted by recompute and put back at the front of the waiting
 * queue; waiting requests are admitted only if nothing was preempted this step. A P/D consumer
 * request (remotePrefill) is admitted as vLLM admits one whose connector loads KV asynchronously:
 * local prefix hit, blocks for the whole prompt, then parked in WAITING_FOR_REMOTE_KVS (`deferred`)
 * without using the token budget or a running slot. Pure.
 */

import type { CpuTier, OffloadLoad } from "./cpu-tier.ts";
import {
  type EngineCounters,
  REMOTE_AWAITING,
  REMOTE_NONE,
  REMOTE_PENDING,
  type Req,
  removeFrom,
} from "./engine-state.ts";
import type { KVCacheManager } from "./kv-cache-manager.ts";
import { adaptersOf } from "./lora-slots.ts";
import type { EngineConfig, RemoteKvNeed } from "./types.ts";

/** A running request's prefix hits (never mutated). */
const NO_HITS: readonly number[] = [];

export class StepScheduler {
  readonly waiting: Req[] = [];
  readonly running: Req[] = [];
  /** The last step's scheduled requests and their token counts (reused across steps). */
  readonly schedReq: Req[] = [];
  readonly schedN: number[] = [];
  /** WAITING_FOR_REMOTE_KVS, by request id in parking order. */
  readonly deferred = new Map<string, Req>();
  /** Requests the last step parked (reused across steps; usually empty). */
  readonly remoteNeeded: RemoteKvNeed[] = [];
  /** CPU-tier loads the last step started (reused across steps; usually empty). */
  readonly offloadLoads: OffloadLoad[] = [];

  constructor(
    private readonly config: EngineConfig,
    private readonly kv: KVCacheManager,
    private readonly counters: EngineCounters,
    /** The CPU offload tier, or null. */
    private readonly tier: CpuTier | null = null,
  ) {}

  /** Queues `r` by arrival (at the front if `front`), or by priority then arrival under priority scheduling. */
  enqueueWaiting(r: Req, front: boolean): void {
    if (this.config.schedulingPolicy === "priority") {
      const key = (x: Req) => [x.input.priority ?? 0, x.record.arrivalTime] as const;
      const [p, t] = key(r);
      let i = 0;
      while (i < this.waiting.length) {
        const [q, u] = key(this.waiting[i]);
        if (p < q || (p === q && t < u)) break;
        i++;
      }
      this.waiting.splice(i, 0, r);
    } else if (front) this.waiting.unshift(r);
    else this.waiting.push(r);
  }

  /**
   * Fills schedReq and schedN for a step starting at `now`, allocating the blocks it needs and
   * preempting when they run out. Returns the number of requests preempted.
   */
  schedule(now: number): number {
    const cfg = this.config;
    const bs = cfg.blockSize;
    let budget = cfg.maxNumBatchedTokens;
    const schedReq = this.schedReq;
    const schedN = this.schedN;
    schedReq.length = 0;
    schedN.length = 0;
    if (this.remoteNeeded.length > 0) this.remoteNeeded.length = 0;
    if (this.offloadLoads.length > 0) this.offloadLoads.length = 0;
    let preempted = 0;

    // 1. Running requests, in order.
    for (let i = 0; i < this.running.length && budget > 0; ) {
      const r = this.running[i];
      let n = r.numTokens - r.numComputed;
      if (cfg.longPrefillTokenThreshold > 0 && n > cfg.longPrefillTokenThreshold)
        n = cfg.longPrefillTokenThreshold;
      n = Math.min(n, budget, cfg.maxModelLen - 1 - r.numComputed);
      if (n <= 0) {
        i++;
        continue;
      }
      // Most steps are decodes whose token fits the last block and completes no uncached one:
      // allocate_slots would take no block and cache none, so it is skipped (the same state).
      const fits =
        n === 1 &&
        r.numComputed < r.blocks.length * bs &&
        (!cfg.enablePrefixCaching || r.numComputed + 1 < (r.numCachedBlocks + 1) * bs);
      let selfPreempted = false;
      while (!fits && !this.kv.allocateSlots(r, n, NO_HITS)) {
        const victim = this.pickVictim();
        const at = this.running.indexOf(victim);
        // Under priority scheduling the victim may already be scheduled this step: unschedule it.
        const s = schedReq.indexOf(victim);
        if (s >= 0) {
          budget += schedN[s];
          schedReq.splice(s, 1);
          schedN.splice(s, 1);
        }
        this.preempt(victim, now);
        preempted++;
        if (victim === r) {
          selfPreempted = true;
          break;
        }
        if (at < i) i--;
      }
      if (selfPreempted) break;
      schedReq.push(r);
      schedN.push(n);
      budget -= n;
      i++;
    }

    // 2. Waiting requests, only if nothing was preempted.
    if (preempted === 0) {
      const maxLoras = cfg.lora?.maxLoras ?? 0;
      // vLLM counts the adapters of this step's scheduled running requests; those are all of the
      // running ones unless the token budget ran out, and then nothing is admitted anyway. Counting
      // every running request keeps a batch within max_loras in the corner cases too.
      const loras = maxLoras > 0 ? adaptersOf(this.running) : null;
      const skipped: Req[] = [];
      while (this.waiting.length > 0 && budget > 0 && this.running.length < cfg.maxNumSeqs) {
        const r = this.waiting[0];
        const lora = r.input.loraName;
        if (loras !== null && lora) {
          if (loras.length >= maxLoras && !loras.includes(lora)) {
            // vLLM: "Scheduling would exceed max_loras, skip" — it waits, keeping its place.
            skipped.push(this.waiting.shift() as Req);
            continue;
          }
        }
        let hitBlocks: readonly number[] = NO_HITS;
        if (r.numComputed === 0 && cfg.enablePrefixCaching) hitBlocks = this.kv.longestCacheHit(r);
        // A loaded P/D consumer request comes back with its transferred tokens computed.
        const computed = r.numComputed + hitBlocks.length * bs;
        if (r.remote === REMOTE_PENDING) {
          if (!this.park(r, hitBlocks, computed)) break;
          continue;
        }
        const tier = this.tier;
        if (tier !== null && r.numComputed === 0 && r.remote === REMOTE_NONE) {
          // vLLM's connector lookup continues past the GPU hit into the CPU tier.
          const cpu = tier.lookup(r, computed, now);
          if (cpu > 0) {
            if (!this.parkForCpu(tier, r, hitBlocks, computed, cpu, now)) break;
            continue;
          }
        }
        let n = r.numTokens - computed;
        if (cfg.longPrefillTokenThreshold > 0 && n > cfg.longPrefillTokenThreshold)
          n = cfg.longPrefillTokenThreshold;
        n = Math.min(n, budget);
        if (!this.kv.allocateSlots(r, n, hitBlocks)) break;
        this.waiting.shift();
        this.running.push(r);
        if (loras !== null && lora && !loras.includes(lora)) loras.push(lora);
        r.numComputed = computed;
        if (!r.admittedOnce) {
          // vLLM records prefix-cache stats for first admissions; resumed preemptions are counted apart.
          this.counters.prefixCacheQueries += r.numTokens;
          this.counters.prefixCacheHits += computed;
          if (this.tier !== null) this.tier.counters.externalQueries += r.numTokens;
          r.record.cachedTokens = computed;
          r.admittedOnce = true;
        }
        if (r.record.firstScheduledTime === null) r.record.firstScheduledTime = now;
        schedReq.push(r);
        schedN.push(n);
        budget -= n;
      }
      if (skipped.length > 0) this.waiting.unshift(...skipped);
    }
    return preempted;
  }

  /**
   * Allocates blocks for the whole prompt of P/D consumer request `r` after its local hit (vLLM
   * get_num_new_matched_tokens then allocate_slots with delay_cache_blocks) and parks it. False if
   * the blocks do not fit (it stays first in the queue).
   */
  private park(r: Req, hitBlocks: readonly number[], localHit: number): boolean {
    const ext = r.numPromptTokens - localHit;
    if (!this.kv.allocateSlots(r, ext, hitBlocks, true)) return false;
    this.waiting.shift();
    r.remote = REMOTE_AWAITING;
    this.deferred.set(r.record.id, r);
    this.counters.prefixCacheQueries += r.numTokens;
    this.counters.prefixCacheHits += localHit;
    r.record.cachedTokens = localHit;
    r.admittedOnce = true;
    this.remoteNeeded.push({
      requestId: r.record.id,
      tokens: ext,
      blocks: r.blocks.length - hitBlocks.length,
      localHitTokens: localHit,
    });
    return true;
  }

  /**
   * Allocates blocks for `r`'s GPU hit plus its CPU hit of `cpuTokens` (vLLM allocate_slots with
   * delay_cache_blocks for an asynchronous load), starts the load and parks `r` until the caller
   * completes it. False if the blocks do not fit (it stays first in the queue).
   */
  private parkForCpu(
    tier: CpuTier,
    r: Req,
    hitBlocks: readonly number[],
    gpuHit: number,
    cpuTokens: number,
    now: number,
  ): boolean {
    if (!this.kv.allocateSlots(r, cpuTokens, hitBlocks, true)) return false;
    this.waiting.shift();
    r.remote = REMOTE_AWAITING;
    this.deferred.set(r.record.id, r);
    if (!r.admittedOnce) {
      this.counters.prefixCacheQueries += r.numTokens;
      this.counters.prefixCacheHits += gpuHit;
      tier.counters.externalQueries += r.numTokens;
      tier.counters.externalHits += cpuTokens;
      r.admittedOnce = true;
    }
    r.record.cachedTokens = gpuHit;
    const load = tier.startLoad(r, gpuHit, cpuTokens, now);
    r.cpuLoad = load;
    this.offloadLoads.push(load);
    return true;
  }

  private pickVictim(): Req {
    if (this.config.schedulingPolicy === "priority") {
      let v = this.running[0];
      for (const r of this.running) {
        const a = r.input.priority ?? 0;
        const b = v.input.priority ?? 0;
        if (a > b || (a === b && r.record.arrivalTime > v.record.arrivalTime)) v = r;
      }
      return v;
    }
    return this.running[this.running.length - 1];
  }

  private preempt(r: Req, _now: number): void {
    removeFrom(this.running, r);
    this.kv.freeBlocks(r);
    r.numComputed = 0;
    r.record.numPreemptions++;
    this.counters.numPreemptions++;
    this.enqueueWaiting(r, true);
  }
}
