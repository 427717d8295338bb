// Test helpers for KV-event tests: a seeded PRNG, random vLLM-like batches, and a shape checker for
// anything the decoder returns.

import assert from "node:assert/strict";
import type { DecodedEventBatch } from "../../src/kv/event-codec.ts";
import type { BlockStored, KVEvent, KVEventBatch } from "../../src/kv/events.ts";
import { type RandomFn, rng } from "./rng.ts";

export type Rng = RandomFn;

export { rng };

const int = (r: Rng, n: number): number => Math.floor(r() * n);
const pick = <T>(r: Rng, xs: readonly T[]): T => xs[int(r, xs.length)];
const orNull = <T>(r: Rng, p: number, f: () => T): T | null => (r() < p ? null : f());

function u32(r: Rng): bigint {
  return BigInt(int(r, 4294967296));
}

/** A uint64 from every msgpack width: fixint, uint8/16/32, and uint64 below and above 2^63. */
export function randomHash(r: Rng): bigint {
  switch (int(r, 6)) {
    case 0:
      return BigInt(int(r, 300));
    case 1:
      return u32(r);
    case 2:
      return (u32(r) << 32n) | u32(r);
    case 3:
      return (1n << 63n) | (u32(r) << 32n) | u32(r);
    case 4:
      return pick(r, [0n, 127n, 128n, 65535n, 65536n, (1n << 63n) - 1n, 1n << 63n, (1n << 64n) - 1n]);
    default:
      return BigInt(int(r, 2 ** 31)) * 1000003n;
  }
}

function randomExtraValue(r: Rng): unknown {
  switch (int(r, 7)) {
    case 0:
      return `mm-${int(r, 1e6).toString(16)}`;
    case 1:
      return int(r, 2 ** 31) - 2 ** 30;
    case 2:
      return int(r, 1000) + 0.5;
    case 3:
      return r() < 0.5;
    case 4:
      return (1n << 40n) + u32(r);
    case 5:
      return new Uint8Array(int(r, 20)).map(() => int(r, 256));
    default:
      return null;
  }
}

function randomStored(r: Rng): BlockStored {
  const blocks = 1 + int(r, 4);
  const blockSize = pick(r, [1, 4, 16]);
  return {
    type: "BlockStored",
    blockHashes: Array.from({ length: blocks }, () => randomHash(r)),
    parentBlockHash: orNull(r, 0.4, () => randomHash(r)),
    tokenIds: Array.from({ length: blocks * blockSize }, () =>
      r() < 0.1 ? int(r, 2 ** 31) : int(r, 200000),
    ),
    blockSize,
    loraId: orNull(r, 0.7, () => int(r, 70000)),
    medium: orNull(r, 0.2, () => pick(r, ["GPU", "CPU", "STORAGE"])),
    loraName: orNull(r, 0.7, () =>
      pick(r, ["", "sql-adapter", "ñandú-lora-✓", "l".repeat(40), "x".repeat(300)]),
    ),
    extraKeys: orNull(r, 0.5, () =>
      Array.from({ length: blocks }, () =>
        orNull(r, 0.5, () => Array.from({ length: 1 + int(r, 3) }, () => randomExtraValue(r))),
      ),
    ),
    groupIdx: orNull(r, 0.5, () => int(r, 4)),
    kvCacheSpecKind: orNull(r, 0.5, () => pick(r, ["full_attention", "sliding_window", "mamba"])),
    kvCacheSpecSlidingWindow: orNull(r, 0.7, () => pick(r, [128, 4096, 131072])),
  };
}

function randomEvent(r: Rng): KVEvent {
  const k = r();
  if (k < 0.6) return randomStored(r);
  if (k < 0.95) {
    return {
      type: "BlockRemoved",
      blockHashes: Array.from({ length: 1 + int(r, 3) }, () => randomHash(r)),
      medium: orNull(r, 0.2, () => pick(r, ["GPU", "CPU"])),
      groupIdx: orNull(r, 0.5, () => int(r, 4)),
    };
  }
  return { type: "AllBlocksCleared" };
}

/** A random batch with 0..maxEvents events, integral or fractional ts, and a null or small rank. */
export function randomBatch(r: Rng, maxEvents: number): KVEventBatch {
  return {
    ts: r() < 0.2 ? int(r, 2e9) : r() * 2e9,
    events: Array.from({ length: int(r, maxEvents + 1) }, () => randomEvent(r)),
    dataParallelRank: orNull(r, 0.3, () => int(r, 8)),
  };
}

const isHash = (h: unknown): boolean => typeof h === "bigint" && h >= 0n && h < 1n << 64n;
const isOptInt = (v: unknown): boolean => v === null || Number.isInteger(v);
const isOptStr = (v: unknown): boolean => v === null || typeof v === "string";

/** Asserts that a decoder result has exactly the types KVEventBatch promises. */
export function assertWellTyped(b: DecodedEventBatch): void {
  assert.ok(typeof b.ts === "number" && !Number.isNaN(b.ts), "ts");
  assert.ok(isOptInt(b.dataParallelRank), "dataParallelRank");
  assert.ok(Number.isInteger(b.skippedEvents) && b.skippedEvents >= 0, "skippedEvents");
  for (const e of b.events) {
    if (e.type === "AllBlocksCleared") continue;
    assert.ok(Array.isArray(e.blockHashes) && e.blockHashes.every(isHash), "blockHashes");
    assert.ok(isOptStr(e.medium) && isOptInt(e.groupIdx), "medium/groupIdx");
    if (e.type === "BlockRemoved") continue;
    assert.equal(e.type, "BlockStored");
    assert.ok(e.parentBlockHash === null || isHash(e.parentBlockHash), "parent");
    assert.ok(Array.isArray(e.tokenIds) && e.tokenIds.every((t) => Number.isInteger(t)), "tokenIds");
    assert.ok(Number.isInteger(e.blockSize), "blockSize");
    assert.ok(isOptInt(e.loraId) && isOptStr(e.loraName), "lora");
    assert.ok(isOptStr(e.kvCacheSpecKind) && isOptInt(e.kvCacheSpecSlidingWindow), "spec");
    assert.ok(
      e.extraKeys === null ||
        (Array.isArray(e.extraKeys) && e.extraKeys.every((x) => x === null || Array.isArray(x))),
      "extraKeys",
    );
  }
}
