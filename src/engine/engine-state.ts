/**
 * The simulated engine's internal state: a request's progress (Req) and how it is built from its
 * input, the counters behind EngineStats, and the input checks that map to a 400
 * (EngineInputError). Pure.
 */
import type { OffloadLoad } from "./cpu-tier.ts";
import type { BlockHasher } from "./fast-block-hash.ts";
import { fnv1a32, mixSeed, Rng, targetOutputLength } from "./output-tokens.ts";
import type { EngineConfig, EngineRequest, FinishReason, RequestRecord } from "./types.ts";

/** Bad request input (prompt too long, empty prompt...): the caller maps it to a 400. */
export class EngineInputError extends Error {
  override name = "EngineInputError";
}

/** A request inside the engine: its input, its record, its tokens so far and its blocks. */
export interface Req {
  /** Without the prompt, which lives in `tokens`: the caller's prompt array is not kept alive. */
  readonly input: Omit<EngineRequest, "promptTokenIds">;
  readonly record: RequestRecord;
  /**
   * Prompt then output token ids: the first numTokens entries of a buffer sized for the longest
   * the request can get (off the JS heap, so long prompts cost the garbage collector nothing).
   * Int32: ids are below the vocabulary size (the replica refuses others with vLLM's 400), and half
   * a Float64Array's bytes made the 150 × 5 run's six routers ~19% faster (the same figures).
   */
  readonly tokens: Int32Array;
  numTokens: number;
  /**
   * Each output token's completion time, in order: the first numTokens − numPromptTokens entries
   * of a buffer sized for maxTokens. The record gets them, and the output ids, when it finishes.
   */
  readonly tokenTimes: Float64Array;
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
  /** P/D consumer progress: REMOTE_NONE, or REMOTE_PENDING → REMOTE_AWAITING → REMOTE_LOADED (or back to REMOTE_NONE on a failure). */
  remote: number;
  /** P/D consumer: prompt tokens the transfer computed (0 without one). */
  externalTokens: number;
  /** CPU tier: the next offload chunk to store (vLLM _next_stored_block_idx). */
  nextStoreChunk: number;
  /** CPU tier: when its last store's copy ends (0 before any). */
  storeDoneAt: number;
  /** CPU tier: the load this request waits for, or null. */
  cpuLoad: OffloadLoad | null;
}

/** Not a P/D consumer request, or its transfer is over (loaded, failed or skipped). */
export const REMOTE_NONE = 0;
/** remotePrefill, not yet admitted: admission allocates and parks it. */
export const REMOTE_PENDING = 1;
/** Parked in WAITING_FOR_REMOTE_KVS with its blocks allocated. */
export const REMOTE_AWAITING = 2;
/** Its transferred KV is in its blocks: it may wait holding them. */
export const REMOTE_LOADED = 3;

/** Running totals behind EngineStats. */
export interface EngineCounters {
  prefixCacheQueries: number;
  prefixCacheHits: number;
  numPreemptions: number;
  promptTokens: number;
  generationTokens: number;
  numSteps: number;
  requestSuccess: Record<FinishReason, number>;
  /** Of promptTokens: from the local prefix cache, and from a remote KV transfer. */
  promptCacheHit: number;
  promptExternal: number;
  numKvExpiredReqs: number;
}

/** All counters at zero. */
export function newCounters(): EngineCounters {
  return {
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    numPreemptions: 0,
    promptTokens: 0,
    generationTokens: 0,
    numSteps: 0,
    requestSuccess: { stop: 0, length: 0, abort: 0, error: 0 },
    promptCacheHit: 0,
    promptExternal: 0,
    numKvExpiredReqs: 0,
  };
}

/** Throws EngineInputError if `req` cannot run under `config`: empty prompt, bad max_tokens, too long. */
export function checkRequest(req: EngineRequest, config: EngineConfig): void {
  const n = req.promptTokenIds.length;
  if (n === 0) throw new EngineInputError("The prompt must contain at least one token.");
  if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1)
    throw new EngineInputError(`max_tokens must be at least 1, got ${req.maxTokens}.`);
  if (n + req.maxTokens > config.maxModelLen)
    throw new EngineInputError(
      `This model's maximum context length is ${config.maxModelLen} tokens. However, you requested ${n + req.maxTokens} tokens (${n} in the messages, ${req.maxTokens} in the completion). Please reduce the length of the messages or completion.`,
    );
}

/**
 * The state of a request that arrived at `now`, its prompt copied into its token buffer (not yet
 * hashed). Its sampling seed is `req.seed`, else derived from `engineSeed` and its id.
 */
export function newReq(req: EngineRequest, now: number, engineSeed: number, hasher: BlockHasher): Req {
  const n = req.promptTokenIds.length;
  const seed = req.seed ?? mixSeed(engineSeed, fnv1a32(req.id));
  const rng = new Rng(seed);
  const { promptTokenIds: prompt, ...input } = req;
  const r: Req = {
    input,
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
    tokens: new Int32Array(n + req.maxTokens),
    numTokens: n,
    tokenTimes: new Float64Array(req.maxTokens),
    numPromptTokens: n,
    targetOutput: targetOutputLength(rng, req.maxTokens, req.ignoreEos),
    rng,
    hasher,
    numComputed: 0,
    blocks: [],
    numCachedBlocks: 0,
    memoHits: [],
    memoGens: [],
    admittedOnce: false,
    finished: false,
    remote: req.remotePrefill === true ? REMOTE_PENDING : REMOTE_NONE,
    externalTokens: 0,
    nextStoreChunk: 0,
    storeDoneAt: 0,
    cpuLoad: null,
  };
  r.tokens.set(prompt);
  return r;
}

/** The output token ids `r` has generated so far (a new array; they live in `r.tokens` after the prompt). */
export function outputTokenIds(r: Req): number[] {
  const out: number[] = [];
  for (let i = r.numPromptTokens; i < r.numTokens; i++) out.push(r.tokens[i]);
  return out;
}

/** The completion times of the output tokens `r` has generated so far (a new array). */
export function tokenTimes(r: Req): number[] {
  const out: number[] = [];
  for (let i = 0, m = r.numTokens - r.numPromptTokens; i < m; i++) out.push(r.tokenTimes[i]);
  return out;
}

/** Removes `r` from `list` if it is there. */
export function removeFrom(list: Req[], r: Req): void {
  const i = list.indexOf(r);
  if (i >= 0) list.splice(i, 1);
}
