/**
 * msgpack codec for vLLM KV-event batches (vllm/distributed/kv_events.py). This file holds the decoder,
 * which accepts every layout vLLM has shipped (vllm/distributed/kv_events.py up to v0.26.0; PRs #19737,
 * #37688, #42892), and
 * re-exports the byte-exact encoder from event-encode.ts.
 *
 * Decoding rules:
 * - The batch is `[ts, events]` (first vLLM releases) or `[ts, events, data_parallel_rank]`; later
 *   elements are ignored. A missing rank decodes as null.
 * - An event is a tagged array (`["BlockStored", ...]`, any length from the required prefix on; fields
 *   added by later vLLM releases decode as null when absent, extra trailing elements are ignored) or a
 *   map with a "type" key (fields by name, unknown keys ignored, missing optional keys → null).
 *   Required: BlockStored needs block_hashes, parent_block_hash, token_ids, block_size, lora_id in array
 *   form (block_hashes, token_ids, block_size in map form); BlockRemoved needs block_hashes.
 * - Events whose type string is unknown (a later vLLM's new kind) are skipped and counted in
 *   `skippedEvents`; the rest of the batch is kept.
 * - Block hashes become uint64 bigints: ints as is (small ones arrive as JS numbers), negative int64
 *   (Python hash() before vLLM v0.10.2) cast with BigInt.asUintN(64, ·), bytes (int hashes disabled)
 *   → last 8 bytes big-endian, as llm-d's getHashAsUint64 does.
 * - A parent hash of 0 is kept as 0n. llm-d-inference-sim sends 0 for "no parent" in the array layout,
 *   but 0 is also a valid hash value, so the decoder does not reinterpret it; callers that know the
 *   sender is the sim may treat 0n as null.
 * - Anything else (not msgpack, trailing bytes, wrong shapes or types) throws KVEventDecodeError.
 */

import { Decoder } from "@msgpack/msgpack";
import type { BlockRemoved, BlockStored, KVEvent, KVEventBatch } from "./events.ts";

export { type EventFormat, encodeEventBatch } from "./event-encode.ts";

/** Thrown for any payload that is not a well-formed KV-event batch; the caller counts it and skips it. */
export class KVEventDecodeError extends Error {
  readonly code = "KVG_ERR_KV_EVENT_DECODE";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KVEventDecodeError";
  }
}

/** A decoded batch plus how many events of unknown type were skipped. */
export interface DecodedEventBatch extends KVEventBatch {
  skippedEvents: number;
}

/**
 * Map keys: @msgpack/msgpack caches only keys of at most 16 bytes, and vLLM's field names run to 28
 * ("kv_cache_spec_sliding_window"), so each long key would be UTF-8-decoded anew per event. This decoder
 * returns the interned field name after a byte compare; other keys are decoded normally.
 */
const FIELD_NAMES = [
  "type",
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window",
  "locality",
];
const MAX_FIELD_BYTES = 32;
const UTF8 = new TextDecoder();
const fieldsByLength: { bytes: Uint8Array; name: string }[][] = Array.from(
  { length: MAX_FIELD_BYTES + 1 },
  () => [],
);
for (const name of FIELD_NAMES)
  fieldsByLength[name.length].push({ bytes: new TextEncoder().encode(name), name });

const fieldKeyDecoder = {
  canBeCached(byteLength: number): boolean {
    return byteLength > 0 && byteLength <= MAX_FIELD_BYTES;
  },
  decode(bytes: Uint8Array, offset: number, byteLength: number): string {
    next: for (const f of fieldsByLength[byteLength]) {
      const fb = f.bytes;
      for (let j = byteLength - 1; j >= 0; j--) if (fb[j] !== bytes[offset + j]) continue next;
      return f.name;
    }
    return UTF8.decode(bytes.subarray(offset, offset + byteLength));
  },
};

// useBigInt64: uint64/int64 (0xcf/0xd3) come back as bigint instead of a lossy number.
const decoder = new Decoder({ useBigInt64: true, keyDecoder: fieldKeyDecoder });
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** Decodes one msgpack KV-event batch (the third frame of a vLLM KV-event message). */
export function decodeEventBatch(buf: Uint8Array): DecodedEventBatch {
  let root: unknown;
  try {
    root = decoder.decode(buf);
  } catch (err) {
    throw new KVEventDecodeError(`payload is not one msgpack value: ${(err as Error).message}`, {
      cause: err,
    });
  }
  if (!Array.isArray(root) || root.length < 2) {
    throw new KVEventDecodeError(
      `batch: expected an array [ts, events, data_parallel_rank?], got ${describe(root)}`,
    );
  }
  const ts = root[0];
  let tsNum: number;
  if (typeof ts === "number" && Number.isFinite(ts)) tsNum = ts;
  else if (typeof ts === "bigint") tsNum = Number(ts);
  else throw new KVEventDecodeError(`batch: ts: expected a finite number, got ${describe(ts)}`);

  const raw = root[1];
  if (!Array.isArray(raw))
    throw new KVEventDecodeError(`batch: events: expected an array, got ${describe(raw)}`);
  const dpRank = root.length > 2 ? optInt(root[2], -1, "data_parallel_rank") : null;

  const events: KVEvent[] = [];
  let skipped = 0;
  for (let i = 0; i < raw.length; i++) {
    const item: unknown = raw[i];
    let ev: KVEvent | null;
    if (Array.isArray(item)) ev = fromArray(item, i);
    else if (typeof item === "object" && item !== null && !(item instanceof Uint8Array)) {
      ev = fromMap(item as Record<string, unknown>, i);
    } else throw fail(i, "event", "a tagged array or a map", item);
    if (ev === null) skipped++;
    else events.push(ev);
  }
  return { ts: tsNum, events, dataParallelRank: dpRank, skippedEvents: skipped };
}

function fromArray(a: unknown[], i: number): KVEvent | null {
  const tag = a[0];
  if (typeof tag !== "string") throw fail(i, "tag (element 0)", "a string", tag);
  switch (tag) {
    case "BlockStored":
      if (a.length < 6) {
        throw new KVEventDecodeError(
          `events[${i}] BlockStored: expected at least 6 elements (tag, block_hashes, parent_block_hash, ` +
            `token_ids, block_size, lora_id), got ${a.length}`,
        );
      }
      return stored(i, a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]);
    case "BlockRemoved":
      if (a.length < 2) {
        throw new KVEventDecodeError(
          `events[${i}] BlockRemoved: expected at least 2 elements, got ${a.length}`,
        );
      }
      return removed(i, a[1], a[2], a[3]);
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
    default:
      return null;
  }
}

function fromMap(m: Record<string, unknown>, i: number): KVEvent | null {
  const tag = m["type"];
  if (typeof tag !== "string") throw fail(i, "type", "a string", tag);
  switch (tag) {
    case "BlockStored":
      return stored(
        i,
        m["block_hashes"],
        m["parent_block_hash"],
        m["token_ids"],
        m["block_size"],
        m["lora_id"],
        m["medium"],
        m["lora_name"],
        m["extra_keys"],
        m["group_idx"],
        m["kv_cache_spec_kind"],
        m["kv_cache_spec_sliding_window"],
      );
    case "BlockRemoved":
      return removed(i, m["block_hashes"], m["medium"], m["group_idx"]);
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
    default:
      return null;
  }
}

function stored(
  i: number,
  hashes: unknown,
  parent: unknown,
  tokens: unknown,
  blockSize: unknown,
  loraId: unknown,
  medium: unknown,
  loraName: unknown,
  extraKeys: unknown,
  groupIdx: unknown,
  kind: unknown,
  window: unknown,
): BlockStored {
  return {
    type: "BlockStored",
    blockHashes: hashList(hashes, i),
    parentBlockHash:
      parent === null || parent === undefined ? null : hashValue(parent, i, "parent_block_hash"),
    tokenIds: tokenList(tokens, i),
    blockSize: intValue(blockSize, i, "block_size"),
    loraId: optInt(loraId, i, "lora_id"),
    medium: optStr(medium, i, "medium"),
    loraName: optStr(loraName, i, "lora_name"),
    extraKeys: extraKeyList(extraKeys, i),
    groupIdx: optInt(groupIdx, i, "group_idx"),
    kvCacheSpecKind: optStr(kind, i, "kv_cache_spec_kind"),
    kvCacheSpecSlidingWindow: optInt(window, i, "kv_cache_spec_sliding_window"),
  };
}

function removed(i: number, hashes: unknown, medium: unknown, groupIdx: unknown): BlockRemoved {
  return {
    type: "BlockRemoved",
    blockHashes: hashList(hashes, i),
    medium: optStr(medium, i, "medium"),
    groupIdx: optInt(groupIdx, i, "group_idx"),
  };
}

/** Converts the decoded array in place (the decoder allocated it for us) to uint64 bigints. */
function hashList(v: unknown, i: number): bigint[] {
  if (!Array.isArray(v)) throw fail(i, "block_hashes", "an array of hashes", v);
  const a = v as unknown[];
  for (let j = 0; j < a.length; j++) a[j] = hashValue(a[j], i, "block_hashes");
  return a as bigint[];
}

function hashValue(v: unknown, i: number, field: string): bigint {
  if (typeof v === "bigint") return v < 0n ? BigInt.asUintN(64, v) : v;
  if (typeof v === "number") {
    if (Number.isInteger(v)) return v >= 0 ? BigInt(v) : BigInt.asUintN(64, BigInt(v));
  } else if (v instanceof Uint8Array && v.length > 0) {
    return lastEightBytes(v);
  }
  throw fail(i, field, "a uint64/int64 hash or non-empty bytes", v);
}

function lastEightBytes(b: Uint8Array): bigint {
  if (b.length >= 8) {
    return new DataView(b.buffer, b.byteOffset + b.length - 8, 8).getBigUint64(0);
  }
  let x = 0n;
  for (let k = 0; k < b.length; k++) x = (x << 8n) | BigInt(b[k]);
  return x;
}

function tokenList(v: unknown, i: number): number[] {
  if (!Array.isArray(v)) throw fail(i, "token_ids", "an array of ints", v);
  const a = v as unknown[];
  for (let j = 0; j < a.length; j++) {
    const t = a[j];
    if (typeof t === "number" && Number.isInteger(t)) continue;
    a[j] = intValue(t, i, "token_ids");
  }
  return a as number[];
}

function extraKeyList(v: unknown, i: number): (unknown[] | null)[] | null {
  if (v === null || v === undefined) return null;
  if (!Array.isArray(v)) throw fail(i, "extra_keys", "an array or nil", v);
  for (const entry of v as unknown[]) {
    if (entry !== null && !Array.isArray(entry)) throw fail(i, "extra_keys entry", "an array or nil", entry);
  }
  return v as (unknown[] | null)[];
}

function intValue(v: unknown, i: number, field: string): number {
  if (typeof v === "number") {
    if (Number.isInteger(v)) return v;
  } else if (typeof v === "bigint") {
    if (v >= MIN_SAFE && v <= MAX_SAFE) return Number(v);
  }
  throw fail(i, field, "an integer", v);
}

function optInt(v: unknown, i: number, field: string): number | null {
  return v === null || v === undefined ? null : intValue(v, i, field);
}

function optStr(v: unknown, i: number, field: string): string | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v;
  throw fail(i, field, "a string or nil", v);
}

function fail(i: number, field: string, expected: string, got: unknown): KVEventDecodeError {
  const where = i < 0 ? "batch" : `events[${i}]`;
  return new KVEventDecodeError(`${where}: ${field}: expected ${expected}, got ${describe(got)}`);
}

function describe(v: unknown): string {
  if (v === undefined) return "nothing (missing)";
  if (v === null) return "nil";
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (v instanceof Uint8Array) return `bytes(${v.length})`;
  switch (typeof v) {
    case "number":
      return `number ${v}`;
    case "bigint":
      return `int ${v}`;
    case "string":
      return `string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)}`;
    case "boolean":
      return `bool ${v}`;
    default:
      return "a map or extension value";
  }
}
