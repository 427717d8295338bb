/**
 * One simulated vLLM V1 engine, advanced step by step by its caller (an HTTP server in scaled real
 * time, or the fleet simulator in virtual time). Pure: `now` is always passed in.
 *
 * The scheduler follows vllm/v1/core/sched/scheduler.py (vllm-wire-formats.md §6): running requests
 * first, in order, each taking its remaining tokens within the max_num_batched_tokens budget (so
 * prefills are chunked); when blocks run out the newest running request is preempted by recompute
 * and put back at the front of the waiting queue; waiting requests are admitted only if nothing was
 * preempted this step, while max_num_seqs allows and their blocks allocate, each first taking its
 * prefix-cache hit (cached full blocks, at most num_tokens − 1 tokens).
 */
import type { KVEvent, KVEventBatch } from "../kv/events.ts";
import { blockExtraKeys, noneHash } from "../kv/vllm-block-hash.ts";
import { BlockPool } from "./block-pool.ts";
import { type BlockHasher, FastRequestBlockHasher, fastRoot, Sha256BlockHasher } from "./fast-block-hash.ts";
import { fnv1a32, mixSeed, Rng, sampleToken, targetOutputLength } from "./output-tokens.ts";
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

/** Bad request input (prompt too long, empty prompt...): the caller maps it to a 400. */
export class EngineInputError extends Error {
  override name = "EngineInputError";
}

/**
 * How prompt blocks are hashed for the prefix cache. "sha256_cbor" (the default) is vLLM's, and
 * what KV events must carry; "fast64" (fast-block-hash.ts) has the same chain structure and so the
 * same hits, for runs that consume no KV events (the fleet simulator).
 */
export type BlockHashAlgo = "sha256_cbor" | "fast64";

export interface EngineOptions {
  blockHashAlgo?: BlockHashAlgo;
}

/** The step's event list when KV events are off, and a running request's prefix hits (never mutated). */
const NO_EVENTS: KVEvent[] = [];
const NO_HITS: readonly number[] = [];

/** Shortest step the model may return, so a clock driven by steps always advances. */
const MIN_STEP_SECONDS = 1e-6;

interface Req {
  readonly input: EngineRequest;
  readonly record: RequestRecord;
  /**
   * Prompt then output token ids: the first numTokens entries of a buffer sized for the longest
   * the request can get (off the JS heap, so long prompts cost the garbage collector nothing).
   */
  readonly tokens: Float64Array;
  numTokens: number;
  readonly numPromptTokens: number;
  readonly targetOutput: number;
  readonly rng: Rng;
  readonly hasher: BlockHasher;
  numComputed: number;
  blocks: number[];
  /** Leading blocks already registered in the pool's hash map. */
  numCachedBlocks: number;
  /** The last prefix-cache hit computed while waiting, with each block's cache generation then. */
  readonly memoHits: number[];
  readonly memoGens: number[];
  admittedOnce: boolean;
  finished: boolean;
}

export class Engine {
  readonly config: EngineConfig;
  private readonly pool: BlockPool;
  private readonly root: Uint8Array;
  private readonly fastRoot: [number, number] | null;
  private readonly waiting: Req[] = [];
  private readonly running: Req[] = [];
  private readonly byId = new Map<string, Req>();
  private readonly vocabSize: number;
  private readonly eosTokenId: number;
  private readonly counters = {
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    numPreemptions: 0,
    promptTokens: 0,
    generationTokens: 0,
    numSteps: 0,
    requestSuccess: { stop: 0, length: 0, abort: 0 } as Record<FinishReason, number>,
  };
  /** Events from calls between steps (abort, reset), published with the next step's batch. */
  private pendingEvents: KVEvent[] = [];
  /** This step's scheduled requests and their token counts (reused across steps). */
  private readonly schedReq: Req[] = [];
  private readonly schedN: number[] = [];
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
    this.pool = new BlockPool(config.numGpuBlocks, config.enablePrefixCaching, config.enableKvCacheEvents);
    this.root = noneHash(config.hashSeed);
    const algo = options.blockHashAlgo ?? "sha256_cbor";
    if (algo !== "sha256_cbor" && algo !== "fast64") bad(`unknown blockHashAlgo ${algo}`);
    this.fastRoot = algo === "fast64" ? fastRoot(config.hashSeed) : null;
    this.vocabSize = config.vocabSize ?? 128256;
    this.eosTokenId = config.eosTokenId ?? 2;
  }

  /** Queues a request that arrived at `now`; it is considered at the next step. Throws EngineInputError. */
  addRequest(req: EngineRequest, now: number): void {
    const n = req.promptTokenIds.length;
    if (n === 0) throw new EngineInputError("The prompt must contain at least one token.");
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1)
      throw new EngineInputError(`max_tokens must be at least 1, got ${req.maxTokens}.`);
    if (n + req.maxTokens > this.config.maxModelLen)
      throw new EngineInputError(
        `This model's maximum context length is ${this.config.maxModelLen} tokens. However, you requested ${n + req.maxTokens} tokens (${n} in the messages, ${req.maxTokens} in the completion). Please reduce the length of the messages or completion.`,
      );
    if (this.byId.has(req.id)) throw new EngineInputError(`Request id ${req.id} is already running.`);
    const seed = req.seed ?? mixSeed(this.config.seed, fnv1a32(req.id));
    const capacity = Math.floor((n + req.maxTokens) / this.config.blockSize);
    const rng = new Rng(seed);
    const r: Req = {
      input: req,
      record: {
        id: req.id,
        promptTokens: n,
        maxTokens: req.maxTokens,
        arrivalTime: now,
        firstScheduledTime: null,
        firstTokenTime: null,
        tokenTimes: [],
        outputTokenIds: [],
        cachedTokens: 0,
        numPreemptions: 0,
        finishTime: null,
        finishReason: null,
      },
      tokens: new Float64Array(n + req.maxTokens),
      numTokens: n,
      numPromptTokens: n,
      targetOutput: targetOutputLength(rng, req.maxTokens, req.ignoreEos),
      rng,
      hasher:
        this.fastRoot === null
          ? new Sha256BlockHasher(this.root, this.config.blockSize, capacity, req.loraName, req.cacheSalt)
          : new FastRequestBlockHasher(
              this.fastRoot,
              this.config.blockSize,
              capacity,
              req.loraName,
              req.cacheSalt,
            ),
      numComputed: 0,
      blocks: [],
      numCachedBlocks: 0,
      memoHits: [],
      memoGens: [],
      admittedOnce: false,
      finished: false,
    };
    r.tokens.set(req.promptTokenIds);
    if (this.config.enablePrefixCaching) r.hasher.update(r.tokens, n);
    this.byId.set(req.id, r);
    this.enqueueWaiting(r, false);
  }

  private enqueueWaiting(r: Req, front: boolean): void {
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

  /** Aborts a request (client went away); its blocks are freed at once. Returns its record, or null if unknown. */
  abort(requestId: string, now: number): RequestRecord | null {
    const r = this.byId.get(requestId);
    if (r === undefined) return null;
    removeFrom(this.waiting, r);
    removeFrom(this.running, r);
    this.finish(r, "abort", now);
    return {
      ...r.record,
      tokenTimes: r.record.tokenTimes.slice(),
      outputTokenIds: r.record.outputTokenIds.slice(),
    };
  }

  /** True while any request is waiting or running: the caller keeps stepping. */
  hasUnfinishedRequests(): boolean {
    return this.waiting.length > 0 || this.running.length > 0;
  }

  /** Schedules and runs one step starting at `now`; outputs are due at `result.endTime`. */
  step(now: number): StepResult {
    const cfg = this.config;
    const bs = cfg.blockSize;
    let budget = cfg.maxNumBatchedTokens;
    const schedReq = this.schedReq;
    const schedN = this.schedN;
    schedReq.length = 0;
    schedN.length = 0;
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
      let selfPreempted = false;
      while (!this.allocateSlots(r, n, NO_HITS)) {
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
      while (this.waiting.length > 0 && budget > 0 && this.running.length < cfg.maxNumSeqs) {
        const r = this.waiting[0];
        let hitBlocks: readonly number[] = NO_HITS;
        if (r.numComputed === 0 && cfg.enablePrefixCaching) hitBlocks = this.longestCacheHit(r);
        const computed = hitBlocks.length * bs;
        let n = r.numTokens - computed;
        if (cfg.longPrefillTokenThreshold > 0 && n > cfg.longPrefillTokenThreshold)
          n = cfg.longPrefillTokenThreshold;
        n = Math.min(n, budget);
        if (!this.allocateSlots(r, n, hitBlocks)) break;
        this.waiting.shift();
        this.running.push(r);
        r.numComputed = computed;
        if (!r.admittedOnce) {
          // vLLM records prefix-cache stats for first admissions; resumed preemptions are counted apart.
          this.counters.prefixCacheQueries += r.numTokens;
          this.counters.prefixCacheHits += computed;
          r.record.cachedTokens = computed;
          r.admittedOnce = true;
        }
        if (r.record.firstScheduledTime === null) r.record.firstScheduledTime = now;
        schedReq.push(r);
        schedN.push(n);
        budget -= n;
      }
    }

    let events = NO_EVENTS;
    if (cfg.enableKvCacheEvents) {
      events = this.pendingEvents.concat(this.pool.takeEvents());
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
        removeFrom(this.running, r);
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

  /**
   * Cached leading blocks of `r`, capped so at least the last prompt token is recomputed. A request
   * that cannot be admitted is looked up again at every step, so the last answer is kept and only
   * its blocks that were evicted or re-cached since, and the blocks after it, are looked up again.
   * The returned array is the request's memo: valid until the next call.
   */
  private longestCacheHit(r: Req): readonly number[] {
    const { his, los, count } = r.hasher;
    const limit = Math.min(Math.floor((r.numTokens - 1) / this.config.blockSize), count);
    const hits = r.memoHits;
    const gens = r.memoGens;
    const pool = this.pool;
    let i = 0;
    const known = Math.min(hits.length, limit);
    while (i < known && pool.stillFirst(hits[i], gens[i])) i++;
    hits.length = i;
    gens.length = i;
    for (; i < limit; i++) {
      const b = pool.lookup(his[i], los[i]);
      if (b < 0) break;
      hits.push(b);
      gens.push(pool.generation(b));
    }
    return hits;
  }

  /** vLLM's allocate_slots: take hit blocks and new blocks for `n` more tokens, or fail leaving state untouched. */
  private allocateSlots(r: Req, n: number, hitBlocks: readonly number[]): boolean {
    const bs = this.config.blockSize;
    const computedAfter = r.numComputed + hitBlocks.length * bs;
    const required = Math.ceil((computedAfter + n) / bs);
    const numNew = Math.max(0, required - r.blocks.length - hitBlocks.length);
    let evictableHits = 0;
    for (const b of hitBlocks) if (this.pool.refCnt[b] === 0) evictableHits++;
    if (numNew > this.pool.numFreeBlocks - evictableHits) return false;
    if (hitBlocks.length > 0) {
      this.pool.touch(hitBlocks);
      for (const b of hitBlocks) r.blocks.push(b);
      r.numCachedBlocks = hitBlocks.length;
    }
    if (numNew > 0) for (const b of this.pool.getNewBlocks(numNew)) r.blocks.push(b);
    if (this.config.enablePrefixCaching) {
      const full = Math.floor(Math.min(computedAfter + n, r.numTokens) / bs);
      this.cacheFullBlocks(r, full);
    }
    return true;
  }

  private cacheFullBlocks(r: Req, numFull: number): void {
    const from = r.numCachedBlocks;
    if (numFull <= from) return;
    const h = r.hasher;
    for (let i = from; i < numFull; i++) this.pool.cacheBlock(r.blocks[i], h.his[i], h.los[i]);
    r.numCachedBlocks = numFull;
    if (!this.config.enableKvCacheEvents) return;
    // vLLM's cache_full_blocks publishes one BlockStored per newly cached run of blocks.
    const bs = this.config.blockSize;
    const values: bigint[] = [];
    const extra: (unknown[] | null)[] = [];
    for (let i = from; i < numFull; i++) {
      values.push(h.value(i));
      extra.push(blockExtraKeys(i, r.input.loraName, r.input.cacheSalt));
    }
    this.pool.pushEvent({
      type: "BlockStored",
      blockHashes: values,
      parentBlockHash: from === 0 ? null : h.value(from - 1),
      tokenIds: Array.from(r.tokens.subarray(from * bs, numFull * bs)),
      blockSize: bs,
      loraId: null,
      medium: "GPU",
      loraName: r.input.loraName ?? null,
      extraKeys: extra,
      groupIdx: 0,
      kvCacheSpecKind: "full_attention",
      kvCacheSpecSlidingWindow: null,
    });
  }

  private freeBlocks(r: Req): void {
    this.pool.freeReversed(r.blocks);
    r.blocks = [];
    r.numCachedBlocks = 0;
  }

  private preempt(r: Req, _now: number): void {
    removeFrom(this.running, r);
    this.freeBlocks(r);
    r.numComputed = 0;
    r.record.numPreemptions++;
    this.counters.numPreemptions++;
    this.enqueueWaiting(r, true);
  }

  private finish(r: Req, reason: FinishReason, now: number): void {
    this.freeBlocks(r);
    r.finished = true;
    r.record.finishReason = reason;
    r.record.finishTime = now;
    this.counters.requestSuccess[reason]++;
    this.byId.delete(r.record.id);
  }

  /** vLLM's reset_prefix_cache: drops every cached free block, emitting AllBlocksCleared. False if blocks are in use. */
  resetPrefixCache(_now: number): boolean {
    const ok = this.pool.resetPrefixCache();
    for (const e of this.pool.takeEvents()) this.pendingEvents.push(e);
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
      numRequestsRunning: this.running.length,
      numRequestsWaiting: this.waiting.length,
      kvCacheUsage: this.pool.usage(),
      prefixCacheQueries: c.prefixCacheQueries,
      prefixCacheHits: c.prefixCacheHits,
      numPreemptions: c.numPreemptions,
      promptTokens: c.promptTokens,
      generationTokens: c.generationTokens,
      requestSuccess: { ...c.requestSuccess },
      numSteps: c.numSteps,
      numCachedBlocks: this.pool.numCachedHashes,
      numFreeBlocks: this.pool.numFreeBlocks,
    };
  }

  /** Block-accounting invariants, checked against every live request. Throws on violation. For tests. */
  checkInvariants(): void {
    this.pool.checkInvariants();
    const refs = new Int32Array(this.config.numGpuBlocks);
    refs[0] = 1;
    for (const r of this.running) for (const b of r.blocks) refs[b]++;
    for (const r of this.waiting) {
      if (r.blocks.length !== 0) throw new Error(`waiting request ${r.record.id} holds blocks`);
    }
    for (let b = 0; b < refs.length; b++)
      if (refs[b] !== this.pool.refCnt[b])
        throw new Error(`block ${b}: refCnt ${this.pool.refCnt[b]} but held ${refs[b]} times`);
    for (const r of this.running) {
      const need = Math.ceil(r.numComputed / this.config.blockSize);
      if (r.blocks.length < need)
        throw new Error(
          `request ${r.record.id} computed ${r.numComputed} tokens in ${r.blocks.length} blocks`,
        );
    }
    if (this.running.length > this.config.maxNumSeqs) throw new Error("running exceeds maxNumSeqs");
  }
}

function removeFrom(list: Req[], r: Req): void {
  const i = list.indexOf(r);
  if (i >= 0) list.splice(i, 1);
}
