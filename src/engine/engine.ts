/**
 * One simulated vLLM V1 engine, advanced step by step by its caller (an HTTP server in scaled real
 * time, or the fleet simulator in virtual time). Pure: `now` is always passed in.
 *
 * A step schedules requests (engine-scheduler.ts: vllm/v1/core/sched/scheduler.py, running first,
 * chunked prefills, preemption by recompute, admission with the prefix-cache hit), takes its time
 * from the batch's shape (profile.ts), and samples one token for each request whose every token is
 * computed. Blocks and the prefix cache are kv-cache-manager.ts's; request state is engine-state.ts's.
 *
 * P/D disaggregation (vLLM NixlConnector semantics): a remoteDecode request that finishes "length"
 * leaves its blocks held under a lease (held-kv.ts) for a consumer, released by releaseHeld or by
 * expireLeases; a remotePrefill request is parked after allocation until the caller reports its
 * KV transfer with completeRemoteKv. Requests that use neither cost the step nothing extra.
 */
import type { KVEvent, KVEventBatch } from "../kv/events.ts";
import { CpuTier } from "./cpu-tier.ts";
import { checkEngineInvariants, engineStats } from "./engine-invariants.ts";
import { PdKv, type RemoteKvOutcome } from "./engine-pd.ts";
import { StepScheduler } from "./engine-scheduler.ts";
import {
  checkRequest,
  EngineInputError,
  newCounters,
  newReq,
  outputTokenIds,
  type Req,
  removeFrom,
  tokenTimes,
} from "./engine-state.ts";
import type { PromptHashMemo } from "./fast-block-hash.ts";
import { type BlockHashAlgo, KVCacheManager } from "./kv-cache-manager.ts";
import type { KvLeases } from "./kv-lease.ts";
import { adaptersOf, LoraSlots, type LoraState } from "./lora-slots.ts";
import { sampleToken } from "./output-tokens.ts";
import { type BatchShape, kvBytesPerToken, stepTime } from "./profile.ts";
import type { SharedStorage } from "./storage-tier.ts";
import type {
  EngineConfig,
  EngineRequest,
  EngineStats,
  FinishReason,
  RequestRecord,
  StepResult,
  TokenOutput,
} from "./types.ts";

export type { RemoteKvOutcome } from "./engine-pd.ts";
export { EngineInputError } from "./engine-state.ts";
export type { BlockHashAlgo } from "./kv-cache-manager.ts";

export interface EngineOptions {
  blockHashAlgo?: BlockHashAlgo;
  /**
   * Remembers prompt hashes across requests (and engines) given the same prompt array, which the
   * caller then must never modify. fast64 only; without it every prompt is hashed.
   */
  promptHashMemo?: PromptHashMemo;
  /** CPU tier: keep each copy for cpuTier.takeTransfers (the size histograms); off by default. */
  keepOffloadTransfers?: boolean;
  /** The fleet's shared-storage tier behind the CPU tier (storage-tier.ts); needs kvOffload. */
  sharedStorage?: SharedStorage;
  /**
   * "first-and-last": a step's outputs list only each request's first token and its finishing one
   * (the fleet simulator reads nothing between; every token's time is in the finished record).
   * Default "every-token", which a streaming server needs.
   */
  outputs?: "every-token" | "first-and-last";
}

/** The step's event list when KV events are off (never mutated). */
const NO_EVENTS: KVEvent[] = [];

/** Shortest step the model may return, so a clock driven by steps always advances. */
const MIN_STEP_SECONDS = 1e-6;

export class Engine {
  readonly config: EngineConfig;
  private readonly kv: KVCacheManager;
  private readonly sched: StepScheduler;
  private readonly byId = new Map<string, Req>();
  private readonly vocabSize: number;
  private readonly eosTokenId: number;
  private readonly counters = newCounters();
  /** Events from calls between steps (abort, reset), published with the next step's batch. */
  private pendingEvents: KVEvent[] = [];
  private readonly decodeContexts: number[] = [];
  private readonly pd: PdKv;
  /** The CPU offload tier (cpu-tier.ts), or null: then the step pays one null check for it. */
  readonly cpuTier: CpuTier | null;
  /** GPU adapter slots under --enable-lora (lora-slots.ts), or null. */
  private readonly lora: LoraSlots | null;
  private readonly everyToken: boolean;

  constructor(config: EngineConfig, options: EngineOptions = {}) {
    const bad = (what: string): never => {
      throw new RangeError(`engine config: ${what}`);
    };
    const posInt = (v: number, name: string) => {
      if (!Number.isInteger(v) || v <= 0) bad(`${name} must be a positive integer, got ${v}`);
    };
    posInt(config.blockSize, "blockSize");
    posInt(config.numGpuBlocks, "numGpuBlocks");
    posInt(config.maxNumSeqs, "maxNumSeqs");
    posInt(config.maxNumBatchedTokens, "maxNumBatchedTokens");
    posInt(config.maxModelLen, "maxModelLen");
    if (config.numGpuBlocks < 2) bad("numGpuBlocks must be ≥ 2 (block 0 is the null block)");
    if (Math.ceil(config.maxModelLen / config.blockSize) > config.numGpuBlocks - 1)
      bad(
        `the KV cache (${config.numGpuBlocks - 1} blocks of ${config.blockSize} tokens) cannot hold one request of max_model_len ${config.maxModelLen}; lower max_model_len or raise num_gpu_blocks`,
      );
    if (!Number.isInteger(config.longPrefillTokenThreshold) || config.longPrefillTokenThreshold < 0)
      bad("longPrefillTokenThreshold must be an integer ≥ 0");
    this.config = config;
    if (config.kvOffload !== undefined && !config.enablePrefixCaching)
      bad("kvOffload needs enablePrefixCaching (the CPU tier is keyed by block hashes)");
    if (options.sharedStorage !== undefined && config.kvOffload === undefined)
      bad(
        "shared storage needs kvOffload: it is the CPU tier's secondary tier (llm-d's CPU + filesystem tiering)",
      );
    this.cpuTier =
      config.kvOffload === undefined
        ? null
        : new CpuTier(
            config.kvOffload,
            config.blockSize,
            kvBytesPerToken(config.profile.model),
            config.enableKvCacheEvents,
            options.keepOffloadTransfers === true,
            options.sharedStorage ?? null,
          );
    this.lora = config.lora === undefined ? null : new LoraSlots(config.lora);
    this.kv = new KVCacheManager(config, options.blockHashAlgo ?? "sha256_cbor", options.promptHashMemo);
    this.sched = new StepScheduler(config, this.kv, this.counters, this.cpuTier);
    this.pd = new PdKv(
      config,
      this.kv,
      this.sched,
      this.counters,
      (r, reason, now) => this.finish(r, reason, now),
      this.cpuTier,
    );
    this.vocabSize = config.vocabSize ?? 128256;
    this.eosTokenId = config.eosTokenId ?? 2;
    this.everyToken = options.outputs !== "first-and-last";
  }

  /** Queues a request that arrived at `now`; it is considered at the next step. Throws EngineInputError. */
  addRequest(req: EngineRequest, now: number): void {
    checkRequest(req, this.config);
    if (this.byId.has(req.id)) throw new EngineInputError(`Request id ${req.id} is already running.`);
    const r = newReq(req, now, this.config.seed, this.kv.newHasher(req));
    if (this.config.enablePrefixCaching) this.kv.hashPrompt(r, req.promptTokenIds);
    this.byId.set(req.id, r);
    this.sched.enqueueWaiting(r, false);
  }

  /**
   * Aborts a request (client went away); its blocks are freed at once, a P/D consumer's included
   * (its caller tells the producer). Returns its record, or null if unknown.
   */
  abort(requestId: string, now: number): RequestRecord | null {
    const r = this.byId.get(requestId);
    if (r === undefined) return null;
    removeFrom(this.sched.waiting, r);
    removeFrom(this.sched.running, r);
    this.sched.deferred.delete(requestId);
    this.finish(r, "abort", now);
    return this.copyRecord(r);
  }

  private copyRecord(r: Req): RequestRecord {
    return { ...r.record, tokenTimes: tokenTimes(r), outputTokenIds: outputTokenIds(r) };
  }

  /**
   * True while any request is waiting, running or waiting for remote KV. A step may schedule
   * nothing while requests only wait for remote KV: the caller then waits for completeRemoteKv.
   */
  hasUnfinishedRequests(): boolean {
    return this.sched.waiting.length > 0 || this.sched.running.length > 0 || this.sched.deferred.size > 0;
  }

  /** Ids of the requests waiting for remote KV (WAITING_FOR_REMOTE_KVS), parked first first. */
  waitingForRemoteKv(): string[] {
    return [...this.sched.deferred.keys()];
  }

  /**
   * The KV transfer of parked consumer request `requestId` ended at `now` (see PdKv.complete):
   * ok → it decodes next with the transferred tokens computed; not ok → config.kvLoadFailurePolicy.
   */
  completeRemoteKv(requestId: string, now: number, ok: boolean): RemoteKvOutcome {
    return this.pd.complete(requestId, now, ok);
  }

  /**
   * CPU tier: when blocks of finished requests that wait for their stores are next freed, or null.
   * A caller whose step scheduled nothing steps again then (nothing else may free blocks).
   */
  nextOffloadFree(): number | null {
    return this.cpuTier === null ? null : this.cpuTier.nextFree();
  }

  /** P/D producer: frees the blocks held for `requestId` (read by the consumer, or released). */
  releaseHeld(requestId: string, _now: number): boolean {
    return this.pd.held.release(requestId);
  }

  /** P/D producer: frees the holds whose lease ran out by `now`, counting each; returns their ids. */
  expireLeases(now: number): string[] {
    return this.pd.expireLeases(now);
  }

  /** P/D producer: ids whose blocks are held. */
  heldRequestIds(): string[] {
    return this.pd.held.ids();
  }

  /** P/D producer: the blocks and tokens held for `requestId` (do not modify), or undefined. */
  heldKv(requestId: string): Readonly<{ blocks: number[]; tokens: number }> | undefined {
    return this.pd.held.get(requestId);
  }

  /**
   * P/D producer: the leases on held blocks (kv-lease.ts): `renew(id, now)` for a consumer's
   * heartbeat, `nextExpiry()` for the caller's next expireLeases, `heartbeatInterval`.
   */
  get leases(): KvLeases {
    return this.pd.held.leases;
  }

  /** Schedules and runs one step starting at `now`; outputs are due at `result.endTime`. */
  step(now: number): StepResult {
    const cfg = this.config;
    const bs = cfg.blockSize;
    const tier = this.cpuTier;
    // Events in the order they happened: the CPU copies that ended by `now` come before this
    // step's allocations, which may evict those very blocks from HBM (a consumer that saw the GPU
    // BlockRemoved first would not know the block survives in CPU).
    let early: KVEvent[] | null = null;
    if (tier !== null) {
      if (cfg.enableKvCacheEvents) early = this.kv.pool.takeEvents();
      tier.advance(now, this.kv.pool);
      if (early !== null) for (const e of tier.takeEvents()) early.push(e);
    }
    const preempted = this.sched.schedule(now);
    const { schedReq, schedN } = this.sched;

    let events = NO_EVENTS;
    if (cfg.enableKvCacheEvents) {
      // Usually only this step's own events: then the pool's list is the batch, uncopied.
      const own = this.kv.pool.takeEvents();
      events =
        this.pendingEvents.length === 0 && early === null
          ? own
          : this.pendingEvents.concat(early ?? NO_EVENTS, own);
      if (tier !== null) for (const e of tier.takeEvents()) events.push(e);
      if (this.pendingEvents.length > 0) this.pendingEvents = [];
    }
    if (schedReq.length === 0) {
      const empty: StepResult = {
        startTime: now,
        endTime: now,
        outputs: [],
        kvEvents: this.batch(events, now),
        numPrefillTokens: 0,
        numDecodeTokens: 0,
        numScheduledRequests: 0,
        numPreemptedThisStep: preempted,
      };
      if (this.sched.remoteNeeded.length > 0) empty.remoteKvNeeded = this.sched.remoteNeeded.slice();
      if (this.sched.offloadLoads.length > 0) empty.offloadLoads = this.sched.offloadLoads.slice();
      return empty;
    }

    // 3. Step time from the batch's shape.
    const shape: BatchShape = { prefills: [], decodeContexts: this.decodeContexts };
    shape.decodeContexts.length = 0;
    let numPrefill = 0;
    let numDecode = 0;
    const numScheduled = schedReq.length;
    for (let k = 0; k < numScheduled; k++) {
      const r = schedReq[k];
      const n = schedN[k];
      if (n === 1 && r.numComputed >= r.numPromptTokens) {
        shape.decodeContexts.push(r.numComputed + 1);
        numDecode++;
      } else {
        shape.prefills.push({ tokens: n, context: r.numComputed });
        numPrefill += n;
      }
    }
    // A batch that needs an adapter outside the GPU slots waits for its load.
    const loraLoad = this.lora === null ? 0 : this.lora.activate(adaptersOf(schedReq));
    const end = now + Math.max(MIN_STEP_SECONDS, stepTime(cfg.profile, shape).total) + loraLoad;
    this.counters.numSteps++;

    // 4. Advance computed tokens; requests whose every token is computed sample one more.
    const outputs: TokenOutput[] = [];
    for (let k = 0; k < numScheduled; k++) {
      const r = schedReq[k];
      r.numComputed += schedN[k];
      if (tier !== null) tier.storeNew(r, end);
      if (r.numComputed < r.numTokens) continue;
      const out = r.numTokens - r.numPromptTokens + 1;
      const last = out >= r.targetOutput;
      const tok =
        last && !r.input.ignoreEos && r.targetOutput < r.input.maxTokens
          ? this.eosTokenId
          : sampleToken(r.rng, this.vocabSize);
      // Output ids and times live in the request's buffers; the record gets them at the finish.
      r.tokenTimes[r.numTokens - r.numPromptTokens] = end;
      r.tokens[r.numTokens++] = tok;
      let emit = this.everyToken;
      if (r.record.firstTokenTime === null) {
        emit = true;
        r.record.firstTokenTime = end;
        this.counters.promptTokens += r.numPromptTokens;
        this.counters.promptCacheHit += r.record.cachedTokens - r.externalTokens;
        this.counters.promptExternal += r.externalTokens;
      }
      this.counters.generationTokens++;
      // Only a token that completes a block gives the hasher anything new to hash.
      if (cfg.enablePrefixCaching && r.numTokens % bs === 0) r.hasher.update(r.tokens, r.numTokens);
      let reason: FinishReason | null = null;
      if (last) reason = r.targetOutput < r.input.maxTokens ? "stop" : "length";
      else if (r.numTokens >= cfg.maxModelLen) reason = "length";
      if (reason === null) {
        if (emit) outputs.push({ requestId: r.record.id, newTokenIds: [tok], finishReason: null });
        continue;
      }
      removeFrom(this.sched.running, r);
      this.finish(r, reason, end);
      outputs.push({ requestId: r.record.id, newTokenIds: [tok], finishReason: reason, record: r.record });
    }
    const result: StepResult = {
      startTime: now,
      endTime: end,
      outputs,
      kvEvents: this.batch(events, now),
      numPrefillTokens: numPrefill,
      numDecodeTokens: numDecode,
      numScheduledRequests: numScheduled,
      numPreemptedThisStep: preempted,
    };
    if (this.sched.remoteNeeded.length > 0) result.remoteKvNeeded = this.sched.remoteNeeded.slice();
    if (this.sched.offloadLoads.length > 0) result.offloadLoads = this.sched.offloadLoads.slice();
    return result;
  }

  private batch(events: KVEvent[], ts: number): KVEventBatch | null {
    if (!this.config.enableKvCacheEvents || events.length === 0) return null;
    return { ts, events, dataParallelRank: this.config.dataParallelRank };
  }

  private finish(r: Req, reason: FinishReason, now: number): void {
    const tier = this.cpuTier;
    if (tier !== null && r.cpuLoad !== null) {
      tier.endLoad(r.cpuLoad);
      r.cpuLoad = null;
    }
    // A P/D producer's blocks wait for their consumer, a storing request's for its stores.
    const kept =
      (r.input.remoteDecode === true && this.pd.holdOnFinish(r, reason, now)) ||
      tier?.holdWhileStoring(r, now) === true;
    if (!kept) this.kv.freeBlocks(r);
    r.finished = true;
    if (this.everyToken) {
      r.record.outputTokenIds = outputTokenIds(r);
      r.record.tokenTimes = tokenTimes(r);
    } else {
      // The fleet simulator reads them once and lets go: no plain-array copies to collect.
      r.record.outputTokenIds = r.tokens.slice(r.numPromptTokens, r.numTokens);
      r.record.tokenTimes = r.tokenTimes.subarray(0, r.numTokens - r.numPromptTokens);
    }
    r.record.finishReason = reason;
    r.record.finishTime = now;
    this.counters.requestSuccess[reason]++;
    this.byId.delete(r.record.id);
  }

  /** vLLM's reset_prefix_cache: drops every cached free block, emitting AllBlocksCleared. False if blocks are in use. */
  resetPrefixCache(_now: number): boolean {
    const ok = this.kv.pool.resetPrefixCache();
    for (const e of this.kv.pool.takeEvents()) this.pendingEvents.push(e);
    return ok;
  }

  /** The record of a request still in the engine (copy), or null. */
  requestRecord(requestId: string): RequestRecord | null {
    const r = this.byId.get(requestId);
    return r === undefined
      ? null
      : { ...r.record, tokenTimes: tokenTimes(r), outputTokenIds: outputTokenIds(r) };
  }

  /** The adapters in use, waiting and resident (vllm:lora_requests_info); null without --enable-lora. */
  loraState(): LoraState | null {
    const l = this.lora;
    if (l === null) return null;
    return {
      maxLoras: l.config.maxLoras,
      running: adaptersOf(this.sched.running),
      waiting: adaptersOf(this.sched.waiting),
      resident: l.resident(),
      loads: l.loads,
    };
  }

  stats(): EngineStats {
    return engineStats(this.counters, this.sched, this.kv.pool, this.pd.held, this.cpuTier);
  }

  /** Block-accounting invariants, checked against every live request. Throws on violation. For tests. */
  checkInvariants(): void {
    checkEngineInvariants(this.config, this.kv.pool, this.sched, this.pd.held, this.cpuTier);
  }
}
