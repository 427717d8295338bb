/**
 * One simulated replica in the fleet: an Engine stepped back to back in virtual time, the metrics
 * it publishes, and the EndpointState the router sees. Staleness is modelled in two layers
 * (BLIS INV-7): vLLM publishes its scheduler stats once per step, at the step's end, and the
 * gateway's data layer reads them only at each scrape; between scrapes the router works from the
 * last scrape. (The gateway's own in-flight counters, kept by the scheduler's hooks, are exact.)
 */

import type { FleetResult } from "../../bench/results.ts";
import { type BlockHashAlgo, Engine } from "../../engine/engine.ts";
import type { PromptHashMemo } from "../../engine/fast-block-hash.ts";
import { mixSeed } from "../../engine/output-tokens.ts";
import type { Profile } from "../../engine/profile.ts";
import type { SharedStorage, SharedStorageConfig } from "../../engine/storage-tier.ts";
import type { EngineStats, OffloadConfig, StepResult, TokenOutput } from "../../engine/types.ts";
import type { EndpointMetrics, EndpointState } from "../../scheduler/types.ts";
import { StepTimeline } from "./step-timeline.ts";

/** A fleet of identical replicas, fully resolved (profile defaults applied, numbers checked). */
export interface FleetConfig {
  replicas: number;
  profile: Profile;
  /** Model name in requests (the profile's model). */
  model: string;
  blockSize: number;
  /** Including vLLM's null block. */
  numGpuBlocks: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  labels: Record<string, string>;
  blockHashAlgo: BlockHashAlgo;
  enableKvCacheEvents: boolean;
  /** The replicas' CPU offload tier, if any. */
  kvOffload?: OffloadConfig;
  /** The fleet's shared-storage tier behind the CPU tiers (one per fleet run), if any. */
  sharedStorage?: SharedStorageConfig;
}

/** The gauges vLLM publishes at the end of each step. */
export interface PublishedStats {
  waiting: number;
  running: number;
  kvUsage: number;
}

export class Replica {
  readonly index: number;
  readonly engine: Engine;
  readonly state: EndpointState;
  /** A step is in flight (between its start and end events). */
  busy = false;
  /** A step-start event is queued. */
  startPending = false;
  /** Outputs of the step in flight, due at its end. */
  inFlight: StepResult | null = null;
  published: PublishedStats;
  /** KV usage seen at scrapes: sum, max, count. */
  kvSum = 0;
  kvMax = 0;
  scrapes = 0;
  steps = 0;
  prefillTokens = 0;
  decodeTokens = 0;
  /** Every step's end time: finished requests' token times are views of it. */
  readonly timeline = new StepTimeline();
  readonly #blockSize: number;
  readonly #numBlocks: number;
  /** outputIndices' result, reused. */
  #idx: number[] = [];

  /** `memo`: prompt hashes shared by the fleet's engines (prompt arrays are never modified). */
  constructor(index: number, cfg: FleetConfig, seed: number, memo?: PromptHashMemo, storage?: SharedStorage) {
    this.index = index;
    this.engine = new Engine(
      {
        blockSize: cfg.blockSize,
        numGpuBlocks: cfg.numGpuBlocks,
        maxNumSeqs: cfg.maxNumSeqs,
        maxNumBatchedTokens: cfg.maxNumBatchedTokens,
        maxModelLen: cfg.maxModelLen,
        longPrefillTokenThreshold: 0,
        enablePrefixCaching: true,
        hashSeed: "0",
        seed: mixSeed(seed >>> 0, index + 1),
        modelName: cfg.model,
        dataParallelRank: 0,
        enableKvCacheEvents: cfg.enableKvCacheEvents,
        profile: cfg.profile,
        ...(cfg.kvOffload !== undefined && { kvOffload: cfg.kvOffload }),
      },
      {
        blockHashAlgo: cfg.blockHashAlgo,
        outputs: "first-and-last",
        ...(memo !== undefined ? { promptHashMemo: memo } : {}),
        ...(storage !== undefined && cfg.kvOffload !== undefined ? { sharedStorage: storage } : {}),
      },
    );
    const id = replicaId(index);
    this.state = { id, address: id.split(":")[0], labels: { ...cfg.labels }, metrics: null };
    this.#blockSize = cfg.blockSize;
    this.#numBlocks = cfg.numGpuBlocks;
    this.published = publish(this.engine.stats());
  }

  /** vLLM publishes its gauges after each step's outputs are processed. */
  publish(): void {
    this.published = publish(this.engine.stats());
  }

  /** The data layer's scrape at `now`: the router sees the last published gauges from here on. */
  scrape(now: number): EndpointMetrics {
    const p = this.published;
    const m: EndpointMetrics = {
      waitingQueueSize: p.waiting,
      runningRequestsSize: p.running,
      kvCacheUsagePercent: p.kvUsage,
      cacheBlockSize: this.#blockSize,
      cacheNumBlocks: this.#numBlocks,
      updateTime: now,
    };
    this.state.metrics = m;
    this.kvSum += p.kvUsage;
    if (p.kvUsage > this.kvMax) this.kvMax = p.kvUsage;
    this.scrapes++;
    return m;
  }

  /**
   * Starts a step at `now`; returns its end time, or null when it scheduled nothing because the
   * engine waits on P/D KV (requests parked for a transfer, or blocks held for a decoder, that a
   * transfer's end will change) or on CPU-tier copies. A step that only parks requests (P/D or a
   * CPU-tier load) ends at once. Throws if the
   * engine has work but schedules none otherwise.
   */
  startStep(now: number): number | null {
    const r = this.engine.step(now);
    if (r.numScheduledRequests === 0) {
      if (r.remoteKvNeeded === undefined && r.offloadLoads === undefined) {
        const s = this.engine.stats();
        if (s.numRequestsWaitingDeferred > 0 || s.numHeldRequests > 0) return null;
        // Blocks of finished requests wait for their CPU-tier stores: the caller steps again then.
        if (this.engine.nextOffloadFree() !== null) return null;
        throw new Error(
          `replica ${this.state.id} stalled at t=${now}: requests waiting but none schedulable`,
        );
      }
      this.busy = true;
      this.inFlight = r;
      return r.endTime;
    }
    this.busy = true;
    this.inFlight = r;
    this.steps++;
    this.prefillTokens += r.numPrefillTokens;
    this.decodeTokens += r.numDecodeTokens;
    this.timeline.push(r.endTime);
    return r.endTime;
  }

  /** Ends the step in flight and hands back its outputs. */
  endStep(): StepResult {
    const r = this.inFlight;
    if (r === null) throw new Error(`replica ${this.state.id}: step end without a step in flight`);
    this.busy = false;
    this.inFlight = null;
    return r;
  }

  /**
   * The workload index of each output of a step (the engine lists only first and finishing tokens,
   * a few a step). The array is reused.
   */
  outputIndices(outputs: readonly TokenOutput[], indexOf: ReadonlyMap<string, number>): number[] {
    const idx = this.#idx;
    for (let k = 0; k < outputs.length; k++) {
      const i = indexOf.get(outputs[k].requestId);
      if (i === undefined)
        throw new Error(`replica ${this.state.id}: output for unknown request ${outputs[k].requestId}`);
      idx[k] = i;
    }
    idx.length = outputs.length;
    return idx;
  }

  stats(): EngineStats {
    return this.engine.stats();
  }
}

function publish(s: EngineStats): PublishedStats {
  return { waiting: s.numRequestsWaiting, running: s.numRequestsRunning, kvUsage: s.kvCacheUsage };
}

/** Endpoint id of replica i ("host:port", the identity the scheduler keys its state by). */
export function replicaId(i: number): string {
  return `sim-${i}:8000`;
}

/** Sums of KV usage over scrapes: per scrape the min, mean and max across replicas. */
export interface KvTicks {
  min: number;
  mean: number;
  max: number;
  peak: number;
  count: number;
}

/** The fleet's figures in the results schema: engine counters and KV usage seen at scrapes. */
export function fleetResult(replicas: Replica[], kv: KvTicks): FleetResult {
  let hits = 0;
  let queries = 0;
  let preemptions = 0;
  const endpoints = replicas.map((rep) => {
    const s = rep.stats();
    hits += s.prefixCacheHits;
    queries += s.prefixCacheQueries;
    preemptions += s.numPreemptions;
    return {
      url: rep.state.id,
      prefix_cache_hit_rate: s.prefixCacheQueries > 0 ? s.prefixCacheHits / s.prefixCacheQueries : null,
      preemptions: s.numPreemptions,
      kv_usage_mean: rep.scrapes > 0 ? rep.kvSum / rep.scrapes : null,
      kv_usage_max: rep.scrapes > 0 ? rep.kvMax : null,
      scrape_errors: 0,
      requests: s.requestSuccess.length + s.requestSuccess.stop,
      steps: rep.steps,
    };
  });
  const avg = (x: number) => (kv.count > 0 ? x / kv.count : null);
  return {
    prefix_cache_hit_rate: queries > 0 ? hits / queries : null,
    prefix_cache_queries: queries,
    preemptions,
    kv_usage_min: avg(kv.min),
    kv_usage_mean: avg(kv.mean),
    kv_usage_max: avg(kv.max),
    kv_usage_peak: kv.count > 0 ? kv.peak : null,
    samples: kv.count,
    endpoints,
  };
}
