/**
 * What the CPU offload tier (cpu-tier.ts) hands out: its loads, copies and counters, and the KV
 * events it publishes for offloaded chunks, in vLLM's two forms
 * (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py take_events and
 * offloading/events.py): the default placeholder (one hash per chunk, the chunk's last GPU block
 * hash; no tokens, no parent, block_size 0) and the self-describing form of
 * kv_connector_extra_config.self_describing_kv_events (the chunk's per-block hashes, its parent,
 * its tokens, the GPU block size). Both carry medium "CPU". Pure.
 */
import type { KVEvent } from "../kv/events.ts";

/** A load the engine started: the caller completes it at `readyAt` (Engine.completeRemoteKv). */
export interface OffloadLoad {
  requestId: string;
  /** Prompt tokens the load brings (beyond the GPU hit). */
  tokens: number;
  bytes: number;
  startTime: number;
  readyAt: number;
  /** CPU chunk keys pinned by the load. */
  keys: string[];
  /** Shared-storage chunk keys pinned by the load (storage-tier.ts); absent without storage hits. */
  storageKeys?: string[];
  /** Prompt tokens of `tokens` that come from shared storage. */
  storageTokens?: number;
}

/** One finished or queued copy, for the size histograms. */
export interface OffloadTransfer {
  kind: "load" | "store";
  bytes: number;
  seconds: number;
}

/** Counters behind vllm:kv_offload_* (see EngineStats.offload). */
export interface OffloadCounters {
  loadBytes: number;
  loadTime: number;
  storeBytes: number;
  storeTime: number;
  allocationFailures: number;
  externalQueries: number;
  externalHits: number;
  numChunks: number;
  capacityChunks: number;
  /** Tokens of externalHits found in shared storage (0 without it). */
  storageHits: number;
}

/** vLLM's placeholder BlockStored for one store job's chunks (CPU; llm-d's storage tier uses it too). */
export function placeholderEvent(keys: bigint[], medium = "CPU"): KVEvent {
  return {
    type: "BlockStored",
    blockHashes: keys,
    parentBlockHash: null,
    tokenIds: [],
    blockSize: 0,
    loraId: null,
    medium,
    loraName: null,
    extraKeys: null,
    groupIdx: 0,
    kvCacheSpecKind: null,
    kvCacheSpecSlidingWindow: null,
  };
}

/** The self-describing CPU BlockStored of one chunk. */
export function describedEvent(
  hashes: bigint[],
  parent: bigint | null,
  tokens: number[],
  blockSize: number,
): KVEvent {
  return {
    type: "BlockStored",
    blockHashes: hashes,
    parentBlockHash: parent,
    tokenIds: tokens,
    blockSize,
    loraId: null,
    medium: "CPU",
    loraName: null,
    extraKeys: null,
    groupIdx: 0,
    kvCacheSpecKind: "full_attention",
    kvCacheSpecSlidingWindow: null,
  };
}
