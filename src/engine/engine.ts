/**
 * One simulated vLLM V1 engine, advanced step by step by its caller (an HTTP server in scaled real
 * time, or the fleet simulator in virtual time). Pure: `now` is always passed in.
 *
 * A step schedules requests (engine-scheduler.ts: vllm/v1/core/sched/scheduler.py, running first,
 * chunked prefills, preemption by recompute, admission with the prefix-cache hit), takes its time
 * from the batch's shape (profile.ts), and samples one token for each request whose every token is
 * computed. Blocks and the prefix cache are kv-cache-manager.ts's; request state is engine-state.ts's.
 */
import type { KVEvent, KVEventBatch } from "../kv/events.ts";
import { StepScheduler } from "./engine-scheduler.ts";
import { checkRequest, EngineInputError, newCounters, newReq, type Req, removeFrom } from "./engine-state.ts";
import type { PromptHashMemo } from "./fast-block-hash.ts";
import { type BlockHashAlgo, KVCacheManager } from "./kv-cache-manager.ts";
import { sampleToken } from "./output-tokens.ts";
import { type BatchShape, stepTime } from "./profile.ts";
import type {
  EngineConfig,
  EngineRequest,
  EngineStats,
  FinishReason,
  RequestRecord,
  StepResult,
  TokenOutput,
} from "./types.ts";

export { EngineInputError } from "./engine-state.ts";
export type { BlockHashAlgo } from "./kv-cache-manager.ts";

export interface EngineOptions {
  blockHashAlgo?: BlockHashAlgo;
  /**
   * Remembers prompt hashes across requests (and engines) given the same prompt array, which the
   * caller then must never modify. fast64 only; without it every prompt is hashed.
   */
  promptHashMemo?: PromptHashMemo;
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
    this.kv = new KVCacheManager(config, options.blockHashAlgo ?? "sha256_cbor", options.promptHashMemo);
    this.sched = new StepScheduler(config, this.kv, this.counters);
    this.vocabSize = config.vocabSize ?? 128256;
    this.eosTokenId = config.eosTokenId ?? 2;
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

  /** Aborts a request (client went away); its blocks are freed at once. Returns its record, or null if unknown. */
  abort(requestId: string, now: number): RequestRecord | null {
    const r = this.byId.get(requestId);
    if (r === undefined) return null;
    removeFrom(this.sched.waiting, r);
    removeFrom(this.sched.running, r);
    this.finish(r, "abort", now);
    return {
      ...r.record,
      tokenTimes: r.record.tokenTimes.slice(),
      outputTokenIds: r.record.outputTokenIds.slice(),
    };
  }

  /** True while any request is waiting or running: the caller keeps stepping. */
  hasUnfinishedRequests(): boolean {
    return this.sched.waiting.length > 0 || this.sched.running.length > 0;
  }

  /** Schedules and runs one step starting at `now`; outputs are due at `result.endTime`. */
  step(now: number): StepResult {
    const cfg = this.config;
    const bs = cfg.blockSize;
    const preempted = this.sched.schedule(now);
    const { schedReq, schedN } = this.sched;

    let events = NO_EVENTS;
    if (cfg.enableKvCacheEvents) {
      events = this.pendingEvents.concat(this.kv.pool.takeEvents());
      this.pendingEvents = [];
    }
    if (schedReq.length === 0) {
      return {
        startTime: now,
        endTime: now,
        outputs: [],
        kvEvents: this.batch(events, now),
        numPrefillTokens: 0,
        numDecodeTokens: 0,
        numScheduledRequests: 0,
        numPreemptedThisStep: preempted,
      };
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
    const end = now + Math.max(MIN_STEP_SECONDS, stepTime(cfg.profile, shape).total);
    this.counters.numSteps++;

    // 4. Advance computed tokens; requests whose every token is computed sample one more.
    const outputs: TokenOutput[] = [];
    for (let k = 0; k < numScheduled; k++) {
      const r = schedReq[k];
      r.numComputed += schedN[k];
      if (r.numComputed < r.numTokens) continue;
      const out = r.record.outputTokenIds.length + 1;
      const last = out >= r.targetOutput;
      const tok =
        last && !r.input.ignoreEos && r.targetOutput < r.input.maxTokens
          ? this.eosTokenId
          : sampleToken(r.rng, this.vocabSize);
      r.tokens[r.numTokens++] = tok;
      r.record.outputTokenIds.push(tok);
      r.record.tokenTimes.push(end);
      if (r.record.firstTokenTime === null) {
        r.record.firstTokenTime = end;
        this.counters.promptTokens += r.numPromptTokens;
      }
      this.counters.generationTokens++;
      // Only a token that completes a block gives the hasher anything new to hash.
      if (cfg.enablePrefixCaching && r.numTokens % bs === 0) r.hasher.update(r.tokens, r.numTokens);
      let reason: FinishReason | null = null;
      if (last) reason = r.targetOutput < r.input.maxTokens ? "stop" : "length";
      else if (r.numTokens >= cfg.maxModelLen) reason = "length";
      const o: TokenOutput = { requestId: r.record.id, newTokenIds: [tok], finishReason: reason };
      if (reason !== null) {
        removeFrom(this.sched.running, r);
        this.finish(r, reason, end);
        o.record = r.record;
      }
      outputs.push(o);
    }
    return {
      startTime: now,
      endTime: end,
      outputs,
      kvEvents: this.batch(events, now),
      numPrefillTokens: numPrefill,
      numDecodeTokens: numDecode,
      numScheduledRequests: numScheduled,
      numPreemptedThisStep: preempted,
    };
  }

  private batch(events: KVEvent[], ts: number): KVEventBatch | null {
    if (!this.config.enableKvCacheEvents || events.length === 0) return null;
    return { ts, events, dataParallelRank: this.config.dataParallelRank };
  }

  private finish(r: Req, reason: FinishReason, now: number): void {
    this.kv.freeBlocks(r);
    r.finished = true;
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
    return r === undefined ? null : { ...r.record };
  }

  stats(): EngineStats {
    const c = this.counters;
    return {
      numRequestsRunning: this.sched.running.length,
      numRequestsWaiting: this.sched.waiting.length,
      kvCacheUsage: this.kv.pool.usage(),
      prefixCacheQueries: c.prefixCacheQueries,
      prefixCacheHits: c.prefixCacheHits,
      numPreemptions: c.numPreemptions,
      promptTokens: c.promptTokens,
      generationTokens: c.generationTokens,
      requestSuccess: { ...c.requestSuccess },
      numSteps: c.numSteps,
      numCachedBlocks: this.kv.pool.numCachedHashes,
      numFreeBlocks: this.kv.pool.numFreeBlocks,
    };
  }

  /** Block-accounting invariants, checked against every live request. Throws on violation. For tests. */
  checkInvariants(): void {
    this.kv.pool.checkInvariants();
    const refs = new Int32Array(this.config.numGpuBlocks);
    refs[0] = 1;
    for (const r of this.sched.running) for (const b of r.blocks) refs[b]++;
    for (const r of this.sched.waiting) {
      if (r.blocks.length !== 0) throw new Error(`waiting request ${r.record.id} holds blocks`);
    }
    for (let b = 0; b < refs.length; b++)
      if (refs[b] !== this.kv.pool.refCnt[b])
        throw new Error(`block ${b}: refCnt ${this.kv.pool.refCnt[b]} but held ${refs[b]} times`);
    for (const r of this.sched.running) {
      const need = Math.ceil(r.numComputed / this.config.blockSize);
      if (r.blocks.length < need)
        throw new Error(
          `request ${r.record.id} computed ${r.numComputed} tokens in ${r.blocks.length} blocks`,
        );
    }
    if (this.sched.running.length > this.config.maxNumSeqs) throw new Error("running exceeds maxNumSeqs");
  }
}
