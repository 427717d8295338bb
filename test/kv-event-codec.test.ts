// Tests for the vLLM KV-event codec: byte vectors msgspec 0.22 writes for vLLM's KVEventBatch structs
// (vLLM v0.26.0 vllm/distributed/kv_events.py), msgspec's layout rules, round-trips over random batches, every legacy/variant input vLLM has shipped, and garbage.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Decoder, encode as genericEncode } from "@msgpack/msgpack";
import { decodeEventBatch, encodeEventBatch, KVEventDecodeError } from "../src/kv/event-codec.ts";
import type { BlockStored, KVEventBatch } from "../src/kv/events.ts";
import { assertWellTyped, randomBatch, rng } from "./helpers/kv-event-fixtures.ts";

const hex = (u: Uint8Array): string => Buffer.from(u).toString("hex");
const unhex = (s: string): Uint8Array => new Uint8Array(Buffer.from(s.replace(/\s+/g, ""), "hex"));
const generic = new Decoder({ useBigInt64: true });
const H63_5 = (1n << 63n) + 5n;

function stored(p: Partial<BlockStored>): BlockStored {
  return {
    type: "BlockStored",
    blockHashes: [],
    parentBlockHash: null,
    tokenIds: [],
    blockSize: 16,
    loraId: null,
    medium: null,
    loraName: null,
    extraKeys: null,
    groupIdx: null,
    kvCacheSpecKind: null,
    kvCacheSpecSlidingWindow: null,
    ...p,
  };
}

const VEC_A = "93cb3ff80000000000009194ac426c6f636b52656d6f7665649107a3475055c000";
const VEC_B =
  "93cb3ff80000000000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d656469756da347505500";
const VEC_C = `93cb41d954fc40200000 93
  9c ab426c6f636b53746f726564 92 01 cf8000000000000005 c0 98 0102030405060708 04 c0 a3475055 c0 c0 c0 c0 c0
  94 ac426c6f636b52656d6f766564 91 cf8000000000000005 a3475055 c0
  91 b0416c6c426c6f636b73436c6561726564
  00`;

const batchA: KVEventBatch = {
  ts: 1.5,
  events: [{ type: "BlockRemoved", blockHashes: [7n], medium: "GPU", groupIdx: null }],
  dataParallelRank: 0,
};
const batchC: KVEventBatch = {
  ts: 1700000000.5,
  events: [
    stored({ blockHashes: [1n, H63_5], tokenIds: [1, 2, 3, 4, 5, 6, 7, 8], blockSize: 4, medium: "GPU" }),
    { type: "BlockRemoved", blockHashes: [H63_5], medium: "GPU", groupIdx: null },
    { type: "AllBlocksCleared" },
  ],
  dataParallelRank: 0,
};

test("vector (a): legacy array format encodes byte for byte and decodes back", () => {
  assert.equal(hex(encodeEventBatch(batchA, "array")), VEC_A);
  assert.deepEqual(decodeEventBatch(unhex(VEC_A)), { ...batchA, skippedEvents: 0 });
});

test("vector (b): map format omits group_idx=None and decodes back", () => {
  assert.equal(hex(encodeEventBatch(batchA, "map")), VEC_B);
  assert.deepEqual(decodeEventBatch(unhex(VEC_B)), { ...batchA, skippedEvents: 0 });
});

test("vector (c): full legacy batch, 104 bytes, with a hash >= 2^63", () => {
  const bytes = encodeEventBatch(batchC, "array");
  assert.equal(bytes.length, 104);
  assert.equal(hex(bytes), hex(unhex(VEC_C)));
  const got = decodeEventBatch(unhex(VEC_C));
  assert.deepEqual(got, { ...batchC, skippedEvents: 0 });
  const first = got.events[0] as BlockStored;
  assert.equal(first.blockHashes[1], 9223372036854775813n);
  assert.equal(typeof first.blockHashes[0], "bigint");
});

test("map version of (c) decodes generically to msgspec's dict", () => {
  const m: KVEventBatch = {
    ...batchC,
    events: [
      { ...(batchC.events[0] as BlockStored), groupIdx: 0, kvCacheSpecKind: "full_attention" },
      { type: "BlockRemoved", blockHashes: [H63_5], medium: "GPU", groupIdx: 0 },
      { type: "AllBlocksCleared" },
    ],
  };
  const g = generic.decode(encodeEventBatch(m, "map")) as [number, Record<string, unknown>[], number];
  assert.deepEqual(Object.keys(g[1][0]), [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "group_idx",
    "kv_cache_spec_kind",
  ]);
  assert.deepEqual(g[1][0]["block_hashes"], [1, H63_5]);
  assert.deepEqual(g[1][1], { type: "BlockRemoved", block_hashes: [H63_5], medium: "GPU", group_idx: 0 });
  assert.deepEqual(g[1][2], { type: "AllBlocksCleared" });
  assert.equal(g[2], 0);
});

test("ts is float64 even when integral; a null rank is written as nil", () => {
  const bytes = encodeEventBatch({ ts: 1700000000, events: [], dataParallelRank: null }, "array");
  assert.equal(hex(bytes), "93cb41d954fc4000000090c0");
  assert.deepEqual(decodeEventBatch(bytes), {
    ts: 1700000000,
    events: [],
    dataParallelRank: null,
    skippedEvents: 0,
  });
});

test("array layout always writes every field; map layout omits exactly the defaulted None fields", () => {
  const r = rng(7);
  for (let i = 0; i < 300; i++) {
    const b = randomBatch(r, 10);
    const arr = generic.decode(encodeEventBatch(b, "array")) as [number, unknown[][], unknown];
    const map = generic.decode(encodeEventBatch(b, "map")) as [number, Record<string, unknown>[], unknown];
    assert.equal(arr.length, 3);
    b.events.forEach((e, k) => {
      const want = e.type === "BlockStored" ? 12 : e.type === "BlockRemoved" ? 4 : 1;
      assert.equal(arr[1][k].length, want);
      assert.equal(arr[1][k][0], e.type);
      const keys = Object.keys(map[1][k]);
      assert.equal(keys[0], "type");
      if (e.type === "BlockStored") {
        const always = [
          "block_hashes",
          "parent_block_hash",
          "token_ids",
          "block_size",
          "lora_id",
          "medium",
          "lora_name",
        ];
        const optional: [string, unknown][] = [
          ["extra_keys", e.extraKeys],
          ["group_idx", e.groupIdx],
          ["kv_cache_spec_kind", e.kvCacheSpecKind],
          ["kv_cache_spec_sliding_window", e.kvCacheSpecSlidingWindow],
        ];
        const want = ["type", ...always, ...optional.filter(([, v]) => v !== null).map(([key]) => key)];
        assert.deepEqual(keys, want);
      } else if (e.type === "BlockRemoved") {
        assert.deepEqual(keys, [
          "type",
          "block_hashes",
          "medium",
          ...(e.groupIdx !== null ? ["group_idx"] : []),
        ]);
      } else {
        assert.deepEqual(keys, ["type"]);
      }
    });
  }
});

test("round-trip property: decode(encode(b)) === b in both formats, and the formats agree", () => {
  const r = rng(20260901);
  for (let i = 0; i < 1500; i++) {
    const b = randomBatch(r, 50);
    const fromArray = decodeEventBatch(encodeEventBatch(b, "array"));
    const fromMap = decodeEventBatch(encodeEventBatch(b, "map"));
    assert.deepEqual(fromArray, { ...b, skippedEvents: 0 });
    assert.deepEqual(fromMap, fromArray);
  }
});

test("decodes older vLLM layouts: short event arrays and a 2-element batch", () => {
  const gpu = "a3475055";
  const removedTag = "ac426c6f636b52656d6f766564";
  // Before vLLM PR #37688 (no group_idx), before PR #19737 (no medium).
  const noGroup = decodeEventBatch(unhex(`93cb3ff8000000000000 91 93 ${removedTag} 9107 ${gpu} 00`));
  assert.deepEqual(noGroup.events, [
    { type: "BlockRemoved", blockHashes: [7n], medium: "GPU", groupIdx: null },
  ]);
  const noMedium = decodeEventBatch(unhex(`93cb3ff8000000000000 91 92 ${removedTag} 9107 00`));
  assert.deepEqual(noMedium.events, [
    { type: "BlockRemoved", blockHashes: [7n], medium: null, groupIdx: null },
  ]);
  // First releases: [ts, events], BlockStored with 5 fields.
  const first = genericEncode([1.25, [["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, null]]]);
  assert.deepEqual(decodeEventBatch(first), {
    ts: 1.25,
    events: [stored({ blockHashes: [11n, 12n], parentBlockHash: 10n, tokenIds: [1, 2, 3, 4], blockSize: 2 })],
    dataParallelRank: null,
    skippedEvents: 0,
  });
  // With medium (v0.11 era), 7 elements.
  const withMedium = genericEncode([2, [["BlockStored", [5], null, [9], 1, 3, "CPU"]], 1]);
  assert.deepEqual(decodeEventBatch(withMedium).events, [
    stored({ blockHashes: [5n], tokenIds: [9], blockSize: 1, loraId: 3, medium: "CPU" }),
  ]);
});

test("ignores trailing elements and unknown map keys (newer fields such as locality)", () => {
  const arr = genericEncode([
    3.5,
    [
      ["BlockStored", [1], null, [1], 1, null, "GPU", null, [null], 0, "full_attention", null, "LOCAL", 99],
      ["BlockRemoved", [1], "GPU", 0, "LOCAL"],
      ["AllBlocksCleared", "extra"],
    ],
    0,
    "future batch field",
  ]);
  const got = decodeEventBatch(arr);
  assert.deepEqual(got.events[0], {
    ...stored({
      blockHashes: [1n],
      tokenIds: [1],
      blockSize: 1,
      medium: "GPU",
      extraKeys: [null],
      groupIdx: 0,
    }),
    kvCacheSpecKind: "full_attention",
  });
  assert.deepEqual(got.events[1], { type: "BlockRemoved", blockHashes: [1n], medium: "GPU", groupIdx: 0 });
  assert.deepEqual(got.events[2], { type: "AllBlocksCleared" });

  const map = genericEncode([
    1,
    [
      {
        locality: "REMOTE",
        type: "BlockStored",
        token_ids: [4, 5],
        block_size: 2,
        block_hashes: [8],
        ownership: {},
      },
      { type: "BlockRemoved", block_hashes: [8], session_id: "s", clé: 1, [`future_${"x".repeat(40)}`]: 2 },
    ],
    2,
  ]);
  const m = decodeEventBatch(map);
  assert.deepEqual(m.events, [
    stored({ blockHashes: [8n], tokenIds: [4, 5], blockSize: 2 }),
    { type: "BlockRemoved", blockHashes: [8n], medium: null, groupIdx: null },
  ]);
  assert.equal(m.dataParallelRank, 2);
});

test("unknown event types are skipped and counted, the rest is kept", () => {
  const buf = genericEncode([1, [["BlockPinned", [1]], ["AllBlocksCleared"], { type: "Snapshot", x: 1 }], 0]);
  const got = decodeEventBatch(buf);
  assert.deepEqual(got.events, [{ type: "AllBlocksCleared" }]);
  assert.equal(got.skippedEvents, 2);
});

test("hash representations: negative int64, small ints, 0xcf-encoded small values, bytes", () => {
  const enc = (hashes: unknown[], parent: unknown): Uint8Array =>
    genericEncode([0, [["BlockStored", hashes, parent, [], 0, null]]], { useBigInt64: true });
  const neg = -4611686018427387911n;
  const got = decodeEventBatch(enc([neg, -5, 0], 0)).events[0] as BlockStored;
  assert.deepEqual(got.blockHashes, [BigInt.asUintN(64, neg), (1n << 64n) - 5n, 0n]);
  assert.equal(got.parentBlockHash, 0n, "a parent of 0 is kept, not turned into null");

  const cf7 = unhex("93 00 91 96 ab426c6f636b53746f726564 91 cf0000000000000007 c0 90 00 c0 00");
  assert.deepEqual((decodeEventBatch(cf7).events[0] as BlockStored).blockHashes, [7n]);

  const sha = new Uint8Array(32).map((_, k) => k + 1); // 01..20
  const xx = new Uint8Array(16).fill(0xab);
  const b = decodeEventBatch(enc([sha, xx, new Uint8Array([1, 2])], sha)).events[0] as BlockStored;
  assert.deepEqual(b.blockHashes, [0x191a1b1c1d1e1f20n, 0xababababababababn, 0x0102n]);
  assert.equal(b.parentBlockHash, 0x191a1b1c1d1e1f20n);
});

test("decodes from a Buffer view at a non-zero offset (bin hash read through the right window)", () => {
  const payload = genericEncode([
    0,
    [["BlockRemoved", [new Uint8Array([9, 9, 0, 0, 0, 0, 0, 0, 0, 1])], null]],
  ]);
  const big = Buffer.alloc(payload.length + 7, 0xee);
  big.set(payload, 3);
  const got = decodeEventBatch(big.subarray(3, 3 + payload.length));
  assert.deepEqual(got.events[0], { type: "BlockRemoved", blockHashes: [1n], medium: null, groupIdx: null });
});

test("malformed payloads throw KVEventDecodeError naming the problem", () => {
  const cases: [Uint8Array, RegExp][] = [
    [unhex("c1"), /not one msgpack value/],
    [unhex("93cb3ff80000000000009000ff"), /not one msgpack value/], // trailing byte
    [genericEncode({ ts: 1 }), /batch: expected an array/],
    [genericEncode([1]), /batch: expected an array/],
    [genericEncode(["x", []]), /ts: expected a finite number/],
    [genericEncode([1, {}]), /events: expected an array/],
    [genericEncode([1, [7]]), /events\[0\]: event: expected a tagged array or a map/],
    [genericEncode([1, [[7]]]), /tag \(element 0\): expected a string/],
    [genericEncode([1, [[]]]), /tag \(element 0\): expected a string, got nothing/],
    [genericEncode([1, [["BlockStored", [1], null, [1], 1]]]), /at least 6 elements/],
    [genericEncode([1, [["BlockRemoved"]]]), /at least 2 elements/],
    [genericEncode([1, [["BlockRemoved", 5]]]), /block_hashes: expected an array/],
    [genericEncode([1, [["BlockRemoved", ["ab"]]]]), /block_hashes: expected a uint64/],
    [genericEncode([1, [["BlockRemoved", [1.5]]]]), /block_hashes: .*number 1.5/],
    [genericEncode([1, [["BlockRemoved", [new Uint8Array(0)]]]]), /bytes\(0\)/],
    [genericEncode([1, [["BlockStored", [1], null, ["a"], 1, null]]]), /token_ids: expected an integer/],
    [
      genericEncode([1, [["BlockStored", [1], null, [1], null, null]]]),
      /block_size: expected an integer, got nil/,
    ],
    [genericEncode([1, [["BlockStored", [1], "p", [1], 1, null]]]), /parent_block_hash/],
    [genericEncode([1, [["BlockStored", [1], null, [1], 1, null, 5]]]), /medium: expected a string or nil/],
    [genericEncode([1, [["BlockStored", [1], null, [1], 1, null, null, null, ["k"]]]]), /extra_keys entry/],
    [genericEncode([1, [{ block_hashes: [1] }]]), /events\[0\]: type: expected a string, got nothing/],
    [genericEncode([1, [{ type: "BlockStored", token_ids: [], block_size: 1 }]]), /block_hashes: .*missing/],
    [genericEncode([1, [], "zero"]), /batch: data_parallel_rank: expected an integer/],
  ];
  for (const [buf, re] of cases) {
    assert.throws(
      () => decodeEventBatch(buf),
      (err: unknown) => err instanceof KVEventDecodeError && re.test(err.message),
      `expected ${re} for ${hex(buf)}`,
    );
  }
});

/** Counts of inputs that decoded and that threw, so a property cannot pass by rejecting everything. */
type Outcomes = { ok: number; error: number };

function decodeOrTypedError(buf: Uint8Array, what: string, seen: Outcomes): void {
  let got: ReturnType<typeof decodeEventBatch>;
  try {
    got = decodeEventBatch(buf);
  } catch (err) {
    assert.ok(err instanceof KVEventDecodeError, `${what}: threw ${String(err)} for ${hex(buf)}`);
    seen.error++;
    return;
  }
  assertWellTyped(got);
  seen.ok++;
}

test("property: random byte strings decode to a well-typed batch or throw KVEventDecodeError", () => {
  const r = rng(99);
  const seen: Outcomes = { ok: 0, error: 0 };
  // Bias the first byte towards fixarray(2|3) so some inputs get past the outer shape check.
  for (let i = 0; i < 20000; i++) {
    const buf = new Uint8Array(Math.floor(r() * 48));
    for (let k = 0; k < buf.length; k++) buf[k] = Math.floor(r() * 256);
    if (buf.length > 0 && r() < 0.5) buf[0] = r() < 0.5 ? 0x92 : 0x93;
    decodeOrTypedError(buf, "random bytes", seen);
  }
  // Random bytes are almost never a batch, but the biased shape lets some through to the event decoder.
  assert.ok(seen.ok >= 1 && seen.error >= 19_000, JSON.stringify(seen));
});

test("property: mutated valid payloads decode to a well-typed batch or throw KVEventDecodeError", () => {
  const r = rng(4242);
  const mutatedSeen: Outcomes = { ok: 0, error: 0 };
  const truncatedSeen: Outcomes = { ok: 0, error: 0 };
  for (let i = 0; i < 3000; i++) {
    const buf = encodeEventBatch(randomBatch(r, 6), r() < 0.5 ? "array" : "map");
    const mutated = new Uint8Array(buf);
    const flips = 1 + Math.floor(r() * 4);
    for (let f = 0; f < flips; f++) mutated[Math.floor(r() * mutated.length)] = Math.floor(r() * 256);
    decodeOrTypedError(mutated, "mutated", mutatedSeen);
    decodeOrTypedError(buf.subarray(0, Math.floor(r() * buf.length)), "truncated", truncatedSeen);
  }
  // A flipped byte often leaves a valid batch (a changed hash or token) and often does not; a
  // proper prefix of a msgpack value is never a complete value, so every truncation is rejected.
  assert.ok(mutatedSeen.ok > 1000 && mutatedSeen.error > 1000, JSON.stringify(mutatedSeen));
  assert.deepEqual(truncatedSeen, { ok: 0, error: 3000 });
});
