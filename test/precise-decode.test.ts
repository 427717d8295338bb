/** The specialised KV-event decoder gives exactly decodeEventBatch's result (or its error) on random
 * batches in both encodings, on older and newer layouts, and on corrupted bytes; and it takes its fast
 * path (no fallback) for the batches vLLM usually sends. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { encode } from "@msgpack/msgpack";
import { decodeEventBatch, encodeEventBatch, KVEventDecodeError } from "../src/kv/event-codec.ts";
import type { KVEvent } from "../src/kv/events.ts";
import { decodeEventBatchFast, fastDecodeCounts } from "../src/kv/precise-decode.ts";
import { type Rng, randomBatch, randomHash, rng } from "./helpers/kv-event-fixtures.ts";

/** Both decoders agree: equal results, or both throw KVEventDecodeError. */
function same(buf: Uint8Array, what: string): "ok" | "error" {
  let want: unknown;
  let wantErr: unknown = null;
  try {
    want = decodeEventBatch(buf);
  } catch (e) {
    wantErr = e;
  }
  let got: unknown;
  let gotErr: unknown = null;
  try {
    got = decodeEventBatchFast(buf);
  } catch (e) {
    gotErr = e;
  }
  if (wantErr !== null) {
    assert.ok(wantErr instanceof KVEventDecodeError, `${what}: reference threw ${wantErr}`);
    assert.ok(gotErr instanceof KVEventDecodeError, `${what}: fast decoder did not throw the same error`);
    return "error";
  }
  assert.equal(gotErr, null, `${what}: fast decoder threw ${gotErr}`);
  assert.deepStrictEqual(got, want, what);
  return "ok";
}

const int = (r: Rng, n: number) => Math.floor(r() * n);

/** vLLM-like batches the fast path must handle without falling back. */
function plainBatch(r: Rng) {
  const events: KVEvent[] = [];
  for (let i = 0; i < 1 + int(r, 6); i++) {
    const n = 1 + int(r, 8);
    if (r() < 0.7)
      events.push({
        type: "BlockStored",
        blockHashes: Array.from({ length: n }, () => randomHash(r)),
        parentBlockHash: r() < 0.5 ? null : randomHash(r),
        tokenIds: Array.from({ length: n * 16 }, () => int(r, r() < 0.1 ? 2 ** 31 : 200_000)),
        blockSize: 16,
        loraId: null,
        medium: ["GPU", "CPU", null, "STORAGE"][int(r, 4)],
        loraName: r() < 0.8 ? null : "ñandú-lora",
        extraKeys: r() < 0.5 ? null : Array.from({ length: n }, () => null),
        groupIdx: r() < 0.5 ? null : int(r, 3),
        kvCacheSpecKind: r() < 0.5 ? null : "full_attention",
        kvCacheSpecSlidingWindow: r() < 0.8 ? null : 4096,
      });
    else if (r() < 0.9)
      events.push({
        type: "BlockRemoved",
        blockHashes: Array.from({ length: n }, () => randomHash(r)),
        medium: r() < 0.2 ? null : "GPU",
        groupIdx: r() < 0.5 ? null : 0,
      });
    else events.push({ type: "AllBlocksCleared" });
  }
  return { ts: r() * 2e9, events, dataParallelRank: r() < 0.3 ? null : int(r, 4) };
}

describe("fast KV-event decoder = decodeEventBatch", () => {
  it("takes the fast path for vLLM-like batches in both encodings", () => {
    const r = rng(11);
    const before = { ...fastDecodeCounts };
    for (let i = 0; i < 400; i++) {
      for (const format of ["array", "map"] as const)
        same(encodeEventBatch(plainBatch(r), format), `plain ${i}`);
    }
    assert.equal(fastDecodeCounts.fallback, before.fallback, "no fallback");
    assert.equal(fastDecodeCounts.fast - before.fast, 800);
  });

  it("agrees on random batches (extra keys of every type, LoRA names, all hash widths), both encodings", () => {
    const r = rng(12);
    for (let i = 0; i < 600; i++) {
      const batch = randomBatch(r, 6);
      for (const format of ["array", "map"] as const)
        assert.equal(same(encodeEventBatch(batch, format), `${i}`), "ok");
    }
  });

  it("agrees on older and newer layouts: short arrays, extra elements, unknown keys and kinds, bytes hashes", () => {
    const h = (1n << 63n) + 5n;
    const toks = Array.from({ length: 4 }, (_, i) => i + 1);
    const shapes: unknown[] = [
      [1.5, [["BlockStored", [1, h], null, [...toks, ...toks], 4, null]]], // [ts, events], 6-element event
      [1.5, [["BlockStored", [h], 7, toks, 4, null, "GPU"]], 0],
      [
        1.5,
        [["BlockStored", [h], 7, toks, 4, null, "GPU", null, [null], 0, "full_attention", null, "LOCAL"]],
        0,
      ],
      [
        1.5,
        [
          ["BlockRemoved", [h]],
          ["BlockRemoved", [h], "CPU"],
          ["BlockRemoved", [h], "GPU", 0, "LOCAL"],
        ],
        0,
      ],
      [
        1.5,
        [
          ["AllBlocksCleared", 1, 2],
          ["Snapshot", [1, 2]],
          ["BlockStored", [h], null, toks, 4, null],
        ],
        3,
        "extra",
      ],
      [
        17,
        [
          { block_hashes: [h], type: "BlockRemoved", medium: "GPU", locality: "REMOTE", x: { a: [1] } },
          { type: "BlockStored", block_hashes: [2], token_ids: toks, block_size: 4, extra_keys: [["salt"]] },
          { type: "Unknown", block_hashes: "whatever" },
        ],
        null,
      ],
      [1.5, [["BlockStored", [new Uint8Array(32).fill(7)], null, toks, 4, null]], 0], // bytes hashes
      [1.5, [["BlockRemoved", [-5n, -1]]], 0], // Python hash() era: negative int64
      [1.5, [["BlockStored", [1], null, toks, 4.0, null]], 0],
      [1.5, [["BlockStored", [1], null, toks, 4.5, null]], 0],
      [1.5, [{ type: 3 }], 0],
      [1.5, [{ __proto__x: 1, type: "AllBlocksCleared" }], 0],
      [Number.NaN, [], 0],
      [1.5, []],
      [1.5],
      { ts: 1 },
    ];
    const results = shapes.map((v, i) => same(encode(v, { useBigInt64: true }), `shape ${i}`));
    assert.deepEqual(results.slice(0, 9), Array(9).fill("ok"));
    assert.deepEqual(results.slice(-4), ["error", "ok", "error", "error"]);
  });

  it("agrees on corrupted bytes: truncations, flipped and inserted bytes (errors included)", () => {
    const r = rng(13);
    let errors = 0;
    for (let i = 0; i < 1500; i++) {
      const good = encodeEventBatch(
        r() < 0.5 ? plainBatch(r) : randomBatch(r, 4),
        r() < 0.5 ? "array" : "map",
      );
      const bad = good.slice();
      const k = int(r, 3);
      let buf: Uint8Array;
      if (k === 0) buf = bad.subarray(0, int(r, bad.length));
      else if (k === 1) {
        for (let j = 0; j < 1 + int(r, 3); j++) bad[int(r, bad.length)] = int(r, 256);
        buf = bad;
      } else {
        const at = int(r, bad.length);
        buf = new Uint8Array([...bad.subarray(0, at), int(r, 256), ...bad.subarray(at)]);
      }
      if (same(buf, `corrupt ${i}`) === "error") errors++;
    }
    assert.ok(errors > 300, `${errors} corrupted payloads were rejected by both`);
  });
});
