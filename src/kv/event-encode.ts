/**
 * Encoder half of the KV-event codec: writes a KVEventBatch byte-for-byte as vLLM's msgspec does, in the
 * "array" layout (array_like tagged structs, vLLM <= v0.25) or the "map" layout (vLLM >= v0.26, PR #42892).
 * Schema: vLLM v0.26.0 vllm/distributed/kv_events.py (KVEventBatch, BlockStored, BlockRemoved,
 * AllBlocksCleared).
 */

import type { BlockRemoved, BlockStored, KVEvent, KVEventBatch } from "./events.ts";
import { MsgpackWriter } from "./msgpack-writer.ts";

export type EventFormat = "array" | "map";

const UINT64_LIMIT = 1n << 64n;

function writeHashes(w: MsgpackWriter, hashes: bigint[]): void {
  w.arrayHeader(hashes.length);
  for (const h of hashes) writeHash(w, h);
}

function writeHash(w: MsgpackWriter, h: bigint): void {
  if (h < 0n || h >= UINT64_LIMIT) throw new RangeError(`block hash ${h} is not a uint64`);
  w.bigint(h);
}

function writeOptInt(w: MsgpackWriter, n: number | null): void {
  if (n === null) w.nil();
  else w.int(n);
}

function writeOptStr(w: MsgpackWriter, s: string | null): void {
  if (s === null) w.nil();
  else w.str(s);
}

function writeTokens(w: MsgpackWriter, tokens: number[]): void {
  w.arrayHeader(tokens.length);
  for (const t of tokens) w.int(t);
}

function writeStoredArray(w: MsgpackWriter, e: BlockStored): void {
  w.arrayHeader(12);
  w.str("BlockStored");
  writeHashes(w, e.blockHashes);
  if (e.parentBlockHash === null) w.nil();
  else writeHash(w, e.parentBlockHash);
  writeTokens(w, e.tokenIds);
  w.int(e.blockSize);
  writeOptInt(w, e.loraId);
  writeOptStr(w, e.medium);
  writeOptStr(w, e.loraName);
  w.value(e.extraKeys);
  writeOptInt(w, e.groupIdx);
  writeOptStr(w, e.kvCacheSpecKind);
  writeOptInt(w, e.kvCacheSpecSlidingWindow);
}

// Map layout: msgspec omit_defaults drops only fields that have a default and equal it (all defaults are
// None here); fields without a default are always written, nil when None.
function writeStoredMap(w: MsgpackWriter, e: BlockStored): void {
  const n =
    8 +
    (e.extraKeys !== null ? 1 : 0) +
    (e.groupIdx !== null ? 1 : 0) +
    (e.kvCacheSpecKind !== null ? 1 : 0) +
    (e.kvCacheSpecSlidingWindow !== null ? 1 : 0);
  w.mapHeader(n);
  w.str("type");
  w.str("BlockStored");
  w.str("block_hashes");
  writeHashes(w, e.blockHashes);
  w.str("parent_block_hash");
  if (e.parentBlockHash === null) w.nil();
  else writeHash(w, e.parentBlockHash);
  w.str("token_ids");
  writeTokens(w, e.tokenIds);
  w.str("block_size");
  w.int(e.blockSize);
  w.str("lora_id");
  writeOptInt(w, e.loraId);
  w.str("medium");
  writeOptStr(w, e.medium);
  w.str("lora_name");
  writeOptStr(w, e.loraName);
  if (e.extraKeys !== null) {
    w.str("extra_keys");
    w.value(e.extraKeys);
  }
  if (e.groupIdx !== null) {
    w.str("group_idx");
    w.int(e.groupIdx);
  }
  if (e.kvCacheSpecKind !== null) {
    w.str("kv_cache_spec_kind");
    w.str(e.kvCacheSpecKind);
  }
  if (e.kvCacheSpecSlidingWindow !== null) {
    w.str("kv_cache_spec_sliding_window");
    w.int(e.kvCacheSpecSlidingWindow);
  }
}

function writeRemoved(w: MsgpackWriter, e: BlockRemoved, format: EventFormat): void {
  if (format === "array") {
    w.arrayHeader(4);
    w.str("BlockRemoved");
    writeHashes(w, e.blockHashes);
    writeOptStr(w, e.medium);
    writeOptInt(w, e.groupIdx);
    return;
  }
  w.mapHeader(e.groupIdx !== null ? 4 : 3);
  w.str("type");
  w.str("BlockRemoved");
  w.str("block_hashes");
  writeHashes(w, e.blockHashes);
  w.str("medium");
  writeOptStr(w, e.medium);
  if (e.groupIdx !== null) {
    w.str("group_idx");
    w.int(e.groupIdx);
  }
}

/**
 * Encodes a batch exactly as vLLM's `msgspec.msgpack.Encoder().encode(KVEventBatch)`: the batch is always
 * `[ts float64, events, data_parallel_rank]`; events are tagged arrays ("array") or maps ("map").
 * Throws RangeError/TypeError on values msgspec could not have produced (non-uint64 hash, fractional int).
 */
export function encodeEventBatch(batch: KVEventBatch, format: EventFormat): Uint8Array {
  const w = new MsgpackWriter(64 + batch.events.length * 96);
  w.arrayHeader(3);
  w.float64(batch.ts);
  w.arrayHeader(batch.events.length);
  for (const e of batch.events) writeEvent(w, e, format);
  writeOptInt(w, batch.dataParallelRank);
  return w.finish();
}

function writeEvent(w: MsgpackWriter, e: KVEvent, format: EventFormat): void {
  switch (e.type) {
    case "BlockStored":
      if (format === "array") writeStoredArray(w, e);
      else writeStoredMap(w, e);
      return;
    case "BlockRemoved":
      writeRemoved(w, e, format);
      return;
    case "AllBlocksCleared":
      if (format === "array") {
        w.arrayHeader(1);
        w.str("AllBlocksCleared");
      } else {
        w.mapHeader(1);
        w.str("type");
        w.str("AllBlocksCleared");
      }
      return;
  }
}
