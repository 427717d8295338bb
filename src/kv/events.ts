/**
 * KV-cache events as vLLM publishes them (vllm/distributed/kv_events.py), as plain data.
 * Block hashes are uint64 held as bigint: vLLM sends the low 64 bits of the digest
 * (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default), which do not fit a JS number.
 */

export interface BlockStored {
  type: "BlockStored";
  blockHashes: bigint[];
  /** Hash of the block before the first one here; null when the run starts at block 0. */
  parentBlockHash: bigint | null;
  /** All tokens of the blocks, concatenated: length = blockSize * blockHashes.length. */
  tokenIds: number[];
  blockSize: number;
  loraId: number | null;
  /** "GPU" from the GPU block pool; "CPU" and others from offload tiers. */
  medium: string | null;
  loraName: string | null;
  /** One entry per block (null for plain text), or null when absent. */
  extraKeys: (unknown[] | null)[] | null;
  groupIdx: number | null;
  kvCacheSpecKind: string | null;
  kvCacheSpecSlidingWindow: number | null;
}

export interface BlockRemoved {
  type: "BlockRemoved";
  blockHashes: bigint[];
  medium: string | null;
  groupIdx: number | null;
}

export interface AllBlocksCleared {
  type: "AllBlocksCleared";
}

export type KVEvent = BlockStored | BlockRemoved | AllBlocksCleared;

/** One published batch: vLLM publishes at most one per engine step. */
export interface KVEventBatch {
  /** Seconds since the epoch (time.time() in vLLM); simulated time in the simulator. */
  ts: number;
  events: KVEvent[];
  dataParallelRank: number | null;
}
