/** Precise index: tiers and longest-prefix arithmetic, event anomalies, budget, speculation, and a
 * property test against a plain-Map reference over generated streams in both encodings. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockKeyer, fnv1a64Hasher, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import { decodeEventBatch, encodeEventBatch } from "../src/kv/event-codec.ts";
import type { BlockRemoved, BlockStored } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { rng } from "./helpers/kv-event-fixtures.ts";
import { StreamWorld } from "./helpers/precise-streams.ts";

const xxh = await loadXxh64Hasher();
const B = 4;
const keyer = new BlockKeyer({ hasher: xxh, blockSize: B });
const TOKENS = Array.from({ length: 6 * B }, (_, i) => 100 + i);
const KEYS = keyer.keys(TOKENS, "m");
const eh = (i: number): bigint => (1n << 63n) + BigInt(i) * 1_000_003n; // engine hash of block i

function stored(
  from: number,
  to: number,
  medium: string | null = "GPU",
  extra: Partial<BlockStored> = {},
): BlockStored {
  return {
    type: "BlockStored",
    blockHashes: Array.from({ length: to - from }, (_, j) => eh(from + j)),
    parentBlockHash: from === 0 ? null : eh(from - 1),
    tokenIds: TOKENS.slice(from * B, to * B),
    blockSize: B,
    loraId: null,
    medium,
    loraName: null,
    extraKeys: null,
    groupIdx: 0,
    kvCacheSpecKind: null,
    kvCacheSpecSlidingWindow: null,
    ...extra,
  };
}
const removed = (blocks: number[], medium: string | null = "GPU"): BlockRemoved => ({
  type: "BlockRemoved",
  blockHashes: blocks.map(eh),
  medium,
  groupIdx: 0,
});
const locationOnly = (blocks: number[], medium: string): BlockStored => ({
  ...stored(0, 0, medium),
  blockHashes: blocks.map(eh),
  parentBlockHash: null,
});

function index(opts: Partial<ConstructorParameters<typeof PreciseIndex>[0]> = {}): PreciseIndex {
  const ix = new PreciseIndex({ keyer, ...opts });
  for (const ep of ["a", "b", "c", "e"]) ix.setEndpointModel(ep, "m");
  return ix;
}

describe("longestPrefix", () => {
  it("sums the best tier weight over each endpoint's consecutive run from block 0", () => {
    const ix = index();
    ix.applyEvent("a", stored(0, 4));
    ix.applyEvent("b", stored(0, 3, "CPU"));
    ix.applyEvent("b", locationOnly([1], "GPU"));
    ix.applyEvent("c", stored(0, 6, null));
    ix.applyEvent("c", removed([2]));
    ix.applyEvent("e", stored(0, 2));
    ix.applyEvent("e", removed([0]));
    const ids = ["a", "b", "c", "d", "e", "a"];
    const r = ix.longestPrefix(KEYS, ids, 0);
    assert.deepEqual([...r.blocks], [4, 3, 2, 0, 0, 4]);
    const want = [4, 0.8 + 1.0 + 0.8, 2, 0, 0, 4];
    for (let j = 0; j < ids.length; j++) assert.ok(Math.abs(r.scores[j] - want[j]) < 1e-12, `${ids[j]}`);
    assert.deepEqual([...ix.longestPrefix(KEYS.subarray(0, 2), ["a", "b"], 0).blocks], [2, 2]);
    assert.deepEqual([...ix.longestPrefix(keyer.keys(TOKENS, "other"), ["a"], 0).blocks], [0]);
    assert.deepEqual(ix.tiersOf("b", KEYS[1], 0)?.sort(), ["cpu", "gpu"]);
  });

  it("uses configured weights; a tier without a weight does not extend the run", () => {
    const ix = index({ tierWeights: { gpu: 2, cpu: 0.5, storage: 0.25 } });
    ix.applyEvent("a", stored(0, 2, "STORAGE"));
    ix.applyEvent("a", stored(2, 3, "gpu"));
    ix.applyEvent("b", stored(0, 3, "FS"));
    const r = ix.longestPrefix(KEYS, ["a", "b"], 0);
    assert.deepEqual([...r.blocks], [3, 0]);
    assert.equal(r.scores[0], 0.25 + 0.25 + 2);
  });
});

describe("event semantics", () => {
  it("counts and ignores removals of blocks never stored, unknown parents, unknown location-only hashes", () => {
    const ix = index();
    ix.applyEvent("a", removed([7, 8]));
    ix.applyEvent("a", stored(2, 4));
    ix.applyEvent("a", locationOnly([9], "CPU"));
    const s = ix.stats();
    assert.equal(s.removedUnknown, 2);
    assert.equal(s.unknownParent, 1);
    assert.equal(s.locationOnlyUnknown, 1);
    assert.equal(s.entries, 0);
    ix.applyEvent("a", stored(0, 2));
    ix.applyEvent("a", removed([1], "CPU")); // held on gpu only
    assert.equal(ix.stats().removedUnknown, 3);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 2);
  });

  it("takes an unknown parent 0 as the root (llm-d-inference-sim's array layout)", () => {
    const ix = index();
    ix.applyEvent("a", { ...stored(0, 2), parentBlockHash: 0n });
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 2);
  });

  it("AllBlocksCleared, resetEndpoint and removeEndpoint drop one endpoint's entries", () => {
    const ix = index();
    for (const ep of ["a", "b", "c"]) ix.applyEvent(ep, stored(0, 3));
    ix.applyEvent("a", { type: "AllBlocksCleared" });
    assert.deepEqual([...ix.longestPrefix(KEYS, ["a", "b", "c"], 0).blocks], [0, 3, 3]);
    ix.resetEndpoint("b");
    ix.removeEndpoint("c");
    assert.equal(ix.stats().entries, 0);
    assert.equal(ix.stats().endpoints, 3, "a, b and e (registered by the test setup) remain");
    // After the reset, b chains again from the root; c is gone until it is seen again.
    ix.applyEvent("b", stored(0, 1));
    ix.applyEvent("a", removed([0]));
    assert.deepEqual([...ix.longestPrefix(KEYS, ["a", "b", "c"], 0).blocks], [0, 1, 0]);
  });

  it("skips other block sizes, KV-cache groups > 0 and token counts that do not match", () => {
    const ix = index();
    ix.applyEvent("a", { ...stored(0, 2), blockSize: 8 });
    ix.applyEvent("a", { ...stored(0, 2), groupIdx: 1 });
    ix.applyEvent("a", { ...stored(0, 2), tokenIds: TOKENS.slice(0, 7) });
    const s = ix.stats();
    assert.deepEqual([s.blockSizeMismatch, s.otherGroupSkipped, s.malformed, s.entries], [1, 1, 1, 0]);
  });

  it("seeds the root with cache_salt from block 0's extra keys and with lora_name; ends runs at multimodal keys", () => {
    const ix = index();
    ix.applyEvent("a", stored(0, 2, "GPU", { extraKeys: [["s1"], null] }));
    ix.applyEvent("b", stored(0, 2, "GPU", { loraName: "ad", extraKeys: [["ad"], ["ad"]] }));
    ix.applyEvent("c", stored(0, 3, "GPU", { extraKeys: [null, [["img-1", 0]], null] }));
    assert.equal(ix.longestPrefix(keyer.keys(TOKENS, "m", "s1"), ["a"], 0).blocks[0], 2);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 0, "salted blocks never match unsalted keys");
    assert.equal(ix.longestPrefix(keyer.keys(TOKENS, "ad"), ["b"], 0).blocks[0], 2);
    assert.equal(ix.longestPrefix(KEYS, ["c"], 0).blocks[0], 1);
    assert.equal(ix.stats().unsupportedExtraKeyBlocks, 2);
  });
});

describe("memory budget", () => {
  it("never exceeds maxEntries and evicts the oldest entries, a run's tail before its head", () => {
    const ix = index({ maxEntries: 5 });
    ix.applyEvent("a", stored(0, 3));
    ix.applyEvent("b", stored(0, 3));
    assert.equal(ix.stats().entries, 5);
    assert.equal(ix.stats().evictions, 1);
    assert.deepEqual([...ix.longestPrefix(KEYS, ["a", "b"], 0).blocks], [2, 3]);
    ix.applyEvent("c", stored(0, 2));
    assert.deepEqual([...ix.longestPrefix(KEYS, ["a", "b", "c"], 0).blocks], [0, 3, 2]);
    // A run longer than the budget keeps its first blocks.
    ix.applyEvent("e", stored(0, 6));
    assert.equal(ix.stats().entries, 5);
    assert.equal(ix.longestPrefix(KEYS, ["e"], 0).blocks[0], 5);
  });

  it("stays consistent under random streams with a tiny budget", () => {
    const r = rng(7);
    const world = new StreamWorld(keyer, r, "m", { docs: 8 });
    const ix = new PreciseIndex({ keyer, maxEntries: 40 });
    for (let i = 0; i < 400; i++) {
      const ep = `e${i % 5}`;
      ix.setEndpointModel(ep, "m");
      for (const ev of world.batch(ep, 4).events) ix.applyEvent(ep, ev);
      const s = ix.stats();
      assert.ok(s.entries <= 40);
      let sum = 0;
      for (let e = 0; e < 5; e++) sum += ix.endpointEntries(`e${e}`);
      assert.equal(sum, s.entries);
    }
    assert.ok(ix.stats().evictions > 0);
  });
});

describe("speculative entries", () => {
  it("count as gpu until their TTL passes, unless a BlockStored confirms them", () => {
    const ix = index();
    ix.addSpeculative("a", KEYS.subarray(0, 4), 100, 2);
    let r = ix.longestPrefix(KEYS, ["a"], 101);
    assert.deepEqual([r.blocks[0], r.scores[0]], [4, 4]);
    ix.applyEvent("a", stored(0, 2));
    r = ix.longestPrefix(KEYS, ["a"], 102);
    assert.equal(r.blocks[0], 2, "confirmed blocks stay, unconfirmed ones expire at now + ttl");
    const s = ix.stats();
    assert.deepEqual(
      [s.speculativeAdded, s.speculativeConfirmed, s.speculativeExpired, s.entries],
      [4, 2, 2, 2],
    );
  });

  it("re-speculating extends the expiry; speculation over stored blocks never expires them", () => {
    const ix = index();
    ix.applyEvent("a", stored(0, 1));
    ix.addSpeculative("a", KEYS.subarray(0, 3), 10); // default TTL 2 s
    ix.addSpeculative("a", KEYS.subarray(0, 2), 11.5);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 12.5).blocks[0], 2);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 13.5).blocks[0], 1);
    assert.deepEqual(ix.tiersOf("a", KEYS[0], 99), ["gpu"]);
    assert.equal(ix.stats().entries, 1);
  });
});

describe("property: index = reference over generated streams", () => {
  for (const [name, hasher] of [
    ["xxh64", xxh],
    ["fnv1a64", fnv1a64Hasher()],
  ] as const) {
    for (const seed of [1, 2, 3]) {
      it(`${name}, seed ${seed}, both encodings`, () => {
        const k = new BlockKeyer({ hasher, blockSize: 16 });
        const r = rng(seed * 101 + name.length);
        const world = new StreamWorld(k, r, "model-x", { docs: 16, blocks: 12 });
        const ix = new PreciseIndex({ keyer: k });
        const eps = ["p0", "p1", "p2", "p3"];
        for (const ep of eps) ix.setEndpointModel(ep, "model-x");
        for (let i = 0; i < 240; i++) {
          const ep = eps[Math.floor(r() * eps.length)];
          const bytes = encodeEventBatch(world.batch(ep, 6), i % 2 ? "map" : "array");
          const decoded = decodeEventBatch(bytes);
          for (const ev of decoded.events) {
            if (ev.type !== "AllBlocksCleared") assert.ok(ev.blockHashes.every((h) => h >= 1n << 63n));
            ix.applyEvent(ep, ev);
          }
          if (i % 20 !== 19) continue;
          for (const doc of world.docs) {
            const got = ix.longestPrefix(doc.keys, eps, 0);
            eps.forEach((ep, j) => {
              const want = world.refLongest(ep, doc.keys);
              assert.equal(got.blocks[j], want.blocks, `blocks of ${ep}`);
              assert.ok(Math.abs(got.scores[j] - want.score) < 1e-9, `score of ${ep}`);
            });
          }
          for (const ep of eps)
            assert.equal(ix.endpointEntries(ep), world.refEntries(ep), `entries of ${ep}`);
        }
        const s = ix.stats();
        assert.equal(s.unknownParent, world.counts.unknownParent);
        assert.equal(s.removedUnknown, world.counts.removedUnknown);
        assert.equal(s.locationOnlyUnknown, world.counts.locationOnlyUnknown);
        assert.ok(s.storedBlocks > 100 && s.removedBlocks > 10 && s.clears > 0);
      });
    }
  }
});

describe("memory accounting", () => {
  it("reports bytes per (block, endpoint) entry from the allocated arrays", () => {
    const k = new BlockKeyer({ hasher: xxh, blockSize: 16 });
    const ix = new PreciseIndex({ keyer: k, maxEntries: 1 << 20 });
    const toks = Array.from({ length: 16 * 4096 }, (_, i) => i);
    for (let e = 0; e < 16; e++) {
      ix.setEndpointModel(`e${e}`, `m${e}`);
      const ev: BlockStored = {
        ...stored(0, 0),
        blockSize: 16,
        tokenIds: toks,
        blockHashes: Array.from({ length: 4096 }, (_, j) => BigInt(j + 1)),
      };
      ix.applyEvent(`e${e}`, ev);
    }
    const s = ix.stats();
    assert.equal(s.entries, 16 * 4096);
    assert.ok(s.bytesPerEntry > 50 && s.bytesPerEntry < 160, `${s.bytesPerEntry}`);
  });
});
