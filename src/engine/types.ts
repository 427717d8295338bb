/**
 * The contract of one simulated vLLM V1 engine: its configuration, the requests it takes,
 * and what one step gives back. Pure data: times are simulated seconds passed in by the caller.
 */
import type { KVEventBatch } from "../kv/events.ts";
import type { Profile } from "./profile.ts";

export interface EngineConfig {
  /** Tokens per KV block (vLLM --block-size, default 16). */
  blockSize: number;
  /** Blocks in the GPU pool, including vLLM's null block 0. */
  numGpuBlocks: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  /** vLLM long_prefill_token_threshold; 0 = off. */
  longPrefillTokenThreshold: number;
  enablePrefixCaching: boolean;
  /** PYTHONHASHSEED: the root of the block-hash chain. */
  hashSeed: string;
  /** Seed of the deterministic output-token generator. */
  seed: number;
  /** Served model name, reported on finished requests. */
  modelName: string;
  /** Data-parallel rank reported in KV-event batches. */
  dataParallelRank: number;
  /** Whether to record KV events at all (vLLM enable_kv_cache_events). */
  enableKvCacheEvents: boolean;
  profile: Profile;
  /** vLLM --scheduling-policy: "fcfs" (default) or "priority" (lower priority value runs first). */
  schedulingPolicy?: "fcfs" | "priority";
  /** Range of generated token ids (default 128256). */
  vocabSize?: number;
  /** Token that ends a naturally stopping output (default 2). */
  eosTokenId?: number;
}

export type FinishReason = "stop" | "length" | "abort";

export interface EngineRequest {
  id: string;
  promptTokenIds: number[];
  /** Most tokens to generate. */
  maxTokens: number;
  /** When true the request generates exactly maxTokens tokens. */
  ignoreEos: boolean;
  /** vLLM cache_salt: mixed into the first block's hash. */
  cacheSalt?: string;
  loraName?: string;
  /** Lower runs earlier under priority scheduling; FCFS ignores it. */
  priority?: number;
  /** Per-request sampling seed; derived from the engine seed and id when absent. */
  seed?: number;
}

/** What the engine knows about a request; a copy is handed out when it finishes. */
export interface RequestRecord {
  id: string;
  promptTokens: number;
  maxTokens: number;
  arrivalTime: number;
  /** Time of the first step that scheduled this request (null until then). */
  firstScheduledTime: number | null;
  firstTokenTime: number | null;
  /** Completion time of every output token, in order. */
  tokenTimes: number[];
  outputTokenIds: number[];
  /** Prefix-cache hit of the first admission, in tokens (multiple of blockSize). */
  cachedTokens: number;
  numPreemptions: number;
  finishTime: number | null;
  finishReason: FinishReason | null;
}

/** New output of one request in one step. */
export interface TokenOutput {
  requestId: string;
  newTokenIds: number[];
  finishReason: FinishReason | null;
  /** Set on the step that finishes the request. */
  record?: RequestRecord;
}

export interface StepResult {
  /** When the step started and ended (end = start + modelled step time). */
  startTime: number;
  endTime: number;
  outputs: TokenOutput[];
  /** At most one batch per step, as vLLM publishes; null when nothing happened to the cache. */
  kvEvents: KVEventBatch | null;
  numPrefillTokens: number;
  numDecodeTokens: number;
  numScheduledRequests: number;
  numPreemptedThisStep: number;
}

/** Counters and gauges behind the vLLM metrics. Counters only grow. */
export interface EngineStats {
  numRequestsRunning: number;
  numRequestsWaiting: number;
  /** 1 - free / (numGpuBlocks - 1); free includes evictable cached blocks. */
  kvCacheUsage: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
  numPreemptions: number;
  promptTokens: number;
  generationTokens: number;
  requestSuccess: Record<FinishReason, number>;
  numSteps: number;
  /** Distinct block hashes currently cached (hittable) in the pool. */
  numCachedBlocks: number;
  numFreeBlocks: number;
}
