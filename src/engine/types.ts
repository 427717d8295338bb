/**
 * The contract of one simulated vLLM V1 engine: its configuration, the requests it takes,
 * and what one step gives back. Pure data: times are simulated seconds passed in by the caller.
 */
import type { KVEventBatch } from "../kv/events.ts";
import type { OffloadCounters, OffloadLoad } from "./cpu-tier.ts";
import type { LoraConfig } from "./lora-slots.ts";
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
  /**
   * P/D consumer: what a failed KV load does (vLLM kv_connector_extra_config.kv_load_failure_policy).
   * "fail" (vLLM's default) ends the request with finishReason "error"; "recompute" prefills locally.
   */
  kvLoadFailurePolicy?: "fail" | "recompute";
  /**
   * P/D producer: seconds held blocks stay leased to a consumer (vLLM v0.22+
   * kv_connector_extra_config.kv_lease_duration, default 30). See kv-lease.ts.
   */
  kvLeaseDuration?: number;
  /** CPU offload tier (vLLM --kv-offloading-size with the native OffloadingConnector); absent = none. */
  kvOffload?: OffloadConfig;
  /**
   * vLLM --enable-lora (lora-slots.ts): at most maxLoras adapters per batch, loads timed. Absent:
   * requests' loraName still salts their block hashes, but adapters are not limited or timed.
   */
  lora?: LoraConfig;
}

/** The CPU tier of vLLM's native OffloadingConnector (see cpu-tier.ts). */
export interface OffloadConfig {
  /** Host bytes for KV (vLLM cpu_bytes_to_use = --kv-offloading-size × 2^30). */
  cpuBytes: number;
  /** Tokens per offloaded chunk (kv_connector_extra_config.block_size; default the GPU block size). */
  chunkTokens?: number;
  /** Host→device and device→host bytes per second (default DEFAULT_HOST_LINK_BYTES_PER_SECOND). */
  loadBandwidth?: number;
  storeBandwidth?: number;
  /** kv_connector_extra_config.self_describing_kv_events: CPU events carry tokens and per-block hashes. */
  selfDescribingEvents?: boolean;
}

/**
 * Why a request ended. "error" is vLLM's FinishReason.ERROR: a P/D consumer whose KV load failed
 * under kv_load_failure_policy "fail" (the HTTP layer answers 500).
 */
export type FinishReason = "stop" | "length" | "abort" | "error";

export interface EngineRequest {
  id: string;
  promptTokenIds: number[];
  /** Most tokens to generate. */
  maxTokens: number;
  /** When true the request generates exactly maxTokens tokens. */
  ignoreEos: boolean;
  /** vLLM cache_salt: mixed into the first block's hash. */
  cacheSalt?: string;
  /** The LoRA adapter the request runs with (vLLM lora_request.lora_name); mixed into every block hash. */
  loraName?: string;
  /** Its vLLM lora_int_id (adapter_id), reported as lora_id in KV events. */
  loraId?: number;
  /** Lower runs earlier under priority scheduling; FCFS ignores it. */
  priority?: number;
  /** Per-request sampling seed; derived from the engine seed and id when absent. */
  seed?: number;
  /**
   * P/D producer (vLLM kv_transfer_params.do_remote_decode on a kv_producer/kv_both engine): when
   * the request finishes "length" (FINISHED_LENGTH_CAPPED) its blocks are held for a consumer
   * under a lease instead of freed, and its record carries remoteBlockIds/remoteNumTokens.
   * Finishing "stop" or "abort" frees them as usual (vLLM nixl scheduler.py request_finished).
   */
  remoteDecode?: boolean;
  /**
   * P/D consumer (kv_transfer_params.do_remote_prefill with valid params on a kv_consumer/kv_both
   * engine): at admission the engine takes the local prefix hit, allocates blocks for the rest of
   * the prompt without caching them, and parks the request in WAITING_FOR_REMOTE_KVS (waiting,
   * reason "deferred"; not running, not stepped). The step reports it in `remoteKvNeeded`; the
   * caller moves the KV and calls `completeRemoteKv`.
   */
  remotePrefill?: boolean;
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
  /**
   * Completion time of every output token, in order (filled when the request finishes, and in copies
   * handed out). An engine with `outputs: "first-and-last"` fills a finished record with typed arrays
   * (tokenTimes a view of the request's own buffer) instead of copying into plain ones.
   */
  tokenTimes: number[] | Float64Array;
  /** Every output token id, in order (filled likewise). */
  outputTokenIds: number[] | Int32Array;
  /** Prefix-cache hit of the first admission, in tokens (multiple of blockSize). */
  cachedTokens: number;
  numPreemptions: number;
  finishTime: number | null;
  finishReason: FinishReason | null;
  /**
   * P/D producer, set when a remoteDecode request finished "length": its blocks, one list per KV
   * group (one group for our models), held for a consumer (vLLM remote_block_ids).
   */
  remoteBlockIds?: number[][];
  /** The tokens those held blocks cover (vLLM remote_num_tokens): the request's computed tokens. */
  remoteNumTokens?: number;
  /** P/D consumer: prompt tokens that came over the KV transfer (0 or absent otherwise). */
  externalTokens?: number;
  /** CPU tier: prompt tokens loaded from it (part of cachedTokens; absent without a load). */
  offloadedTokens?: number;
}

/**
 * A consumer request the step parked in WAITING_FOR_REMOTE_KVS: the caller transfers `tokens`
 * prompt tokens in `blocks` blocks (the last `blocks` of the producer's remote_block_ids, as
 * vLLM's NIXL worker reads them) and then calls Engine.completeRemoteKv.
 */
export interface RemoteKvNeed {
  requestId: string;
  /** Prompt tokens to load: the prompt minus the local prefix-cache hit. */
  tokens: number;
  /** Blocks allocated for them. */
  blocks: number;
  /** Local prefix-cache hit, tokens (a multiple of blockSize). */
  localHitTokens: number;
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
  /** One per token sampled this step (EngineOptions.outputs: or only first and finishing tokens). */
  outputs: TokenOutput[];
  /** At most one batch per step, as vLLM publishes; null when nothing happened to the cache. */
  kvEvents: KVEventBatch | null;
  numPrefillTokens: number;
  numDecodeTokens: number;
  numScheduledRequests: number;
  numPreemptedThisStep: number;
  /** Consumer requests this step parked waiting for remote KV; absent when there are none. */
  remoteKvNeeded?: RemoteKvNeed[];
  /**
   * CPU-tier loads this step started (requests parked waiting for them); absent when none. The
   * caller calls Engine.completeRemoteKv(requestId, readyAt, true) when each one's copy ends.
   */
  offloadLoads?: OffloadLoad[];
}

/** Counters and gauges behind the vLLM metrics. Counters only grow. */
export interface EngineStats {
  numRequestsRunning: number;
  /** Every waiting request, deferred ones (waiting for remote KV) included. */
  numRequestsWaiting: number;
  /** Waiting for remote KV (vllm:num_requests_waiting_by_reason{reason="deferred"}). */
  numRequestsWaitingDeferred: number;
  /** 1 - free / (numGpuBlocks - 1); free includes evictable cached blocks. */
  kvCacheUsage: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
  numPreemptions: number;
  promptTokens: number;
  /**
   * promptTokens by where their KV came from (vllm:prompt_tokens_by_source_total); the three sum
   * to promptTokens. A consumer's transferred tokens are external_kv_transfer except the last
   * prompt token, which vLLM recomputes (local_compute).
   */
  promptTokensBySource: { local_compute: number; local_cache_hit: number; external_kv_transfer: number };
  generationTokens: number;
  requestSuccess: Record<FinishReason, number>;
  numSteps: number;
  /** Distinct block hashes currently cached (hittable) in the pool. */
  numCachedBlocks: number;
  numFreeBlocks: number;
  /** P/D producer: finished requests whose blocks are held for a consumer. */
  numHeldRequests: number;
  /** P/D producer: leases that expired before a consumer read the blocks (vllm:nixl_num_kv_expired_reqs). */
  numKvExpiredReqs: number;
  /** The CPU tier's counters (vllm:kv_offload_*, vllm:external_prefix_cache_*); absent without one. */
  offload?: OffloadCounters;
}
