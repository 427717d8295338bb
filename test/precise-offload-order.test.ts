/**
 * Two orderings of offload events the precise index must survive (precise-recent.ts): a CPU
 * placeholder that arrives after the GPU BlockRemoved of its block (vLLM publishes it when the copy
 * ends, which may be after HBM evicted the block) lands on the CPU tier instead of being held
 * forever; and copies of one block announced by several chunks (self-describing events re-announce a
 * shared prefix once per chunk, placeholders span it once per chunk) are counted, so removing one
 * chunk leaves the blocks another chunk still holds.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import type { BlockRemoved, BlockStored } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";

const xxh = await loadXxh64Hasher();
const B = 4;
const keyer = new BlockKeyer({ hasher: xxh, blockSize: B });
/** Two prompts sharing their first two blocks: P = s s p p, Q = s s q q (blocks of 4 tokens). */
const S = Array.from({ length: 2 * B }, (_, i) => 100 + i);
const P = [...S, ...Array.from({ length: 2 * B }, (_, i) => 500 + i)];
const Q = [...S, ...Array.from({ length: 2 * B }, (_, i) => 900 + i)];
const KP = keyer.keys(P, "m");
const KQ = keyer.keys(Q, "m");
/** Engine hashes: shared blocks 0, 1; P's own 2, 3; Q's own 12, 13. */
const eh = (i: number): bigint => (1n << 62n) + BigInt(i) * 104_729n;
const P_H = [0, 1, 2, 3];
const Q_H = [0, 1, 12, 13];

function stored(tokens: number[], hashes: number[], parent: number | null, medium: string): BlockStored {
  return {
    type: "BlockStored",
    blockHashes: hashes.map(eh),
    parentBlockHash: parent === null ? null : eh(parent),
    tokenIds: tokens,
    blockSize: B,
    loraId: null,
    medium,
    loraName: null,
    extraKeys: null,
    groupIdx: 0,
    kvCacheSpecKind: null,
    kvCacheSpecSlidingWindow: null,
  };
}
const placeholder = (hashes: number[], blockSize = 0): BlockStored => ({
  ...stored([], hashes, null, "CPU"),
  parentBlockHash: null,
  blockSize,
});
const removed = (hashes: number[], medium: string): BlockRemoved => ({
  type: "BlockRemoved",
  blockHashes: hashes.map(eh),
  medium,
  groupIdx: 0,
});

function index(): PreciseIndex {
  const ix = new PreciseIndex({ keyer });
  ix.setEndpointModel("a", "m");
  // The endpoint offloads: its first CPU event (another prompt's) came long before.
  const other = Array.from({ length: B }, (_, i) => 7000 + i);
  ix.applyEvent("a", stored(other, [99], null, "GPU"));
  ix.applyEvent("a", placeholder([99]));
  return ix;
}
const score = (ix: PreciseIndex, keys: BigUint64Array) => {
  const r = ix.longestPrefix(keys, ["a"], 0);
  return { blocks: r.blocks[0], score: r.scores[0] };
};
const near = (got: number, want: number, what: string) =>
  assert.ok(Math.abs(got - want) < 1e-9, `${what}: ${got} ≠ ${want}`);

describe("precise index: a CPU placeholder after its block's GPU BlockRemoved", () => {
  it("lands on the CPU tier (one placeholder per block), not held for a GPU event that never comes", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", removed(P_H, "GPU"));
    assert.equal(score(ix, KP).blocks, 0, "HBM evicted P");
    ix.applyEvent("a", placeholder(P_H));
    assert.equal(ix.heldPlaceholders, 0, "nothing held");
    assert.equal(ix.stats().placeholderRestored, 4);
    const s = score(ix, KP);
    assert.equal(s.blocks, 4);
    near(s.score, 4 * 0.8, "four CPU blocks");
    assert.deepEqual(ix.tiersOf("a", KP[3], 0), ["cpu"]);
    // The restored entries follow later CPU evictions.
    ix.applyEvent("a", removed([1], "CPU"));
    assert.equal(score(ix, KP).blocks, 1);
  });

  it("restores a chunk's whole span from one placeholder hash (block_size = 4 GPU blocks)", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", removed([2, 3], "GPU"));
    ix.applyEvent("a", removed([0, 1], "GPU"));
    ix.applyEvent("a", placeholder([3], 4 * B));
    const s = score(ix, KP);
    assert.equal(s.blocks, 4, "the chunk's four blocks, parents taken from the removed blocks' keys");
    near(s.score, 3.2, "at CPU weight");
    ix.applyEvent("a", removed([3], "CPU"));
    assert.equal(score(ix, KP).blocks, 0, "its removal clears the span again");
  });

  it("a block the engine still holds in HBM keeps both tiers; a hash never seen is still held", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", removed([3], "GPU"));
    ix.applyEvent("a", placeholder([2, 3]));
    assert.deepEqual(ix.tiersOf("a", KP[2], 0), ["gpu", "cpu"]);
    assert.deepEqual(ix.tiersOf("a", KP[3], 0), ["cpu"]);
    near(score(ix, KP).score, 3 + 0.8, "three GPU blocks and a CPU one");
    ix.applyEvent("a", placeholder([42]));
    assert.equal(ix.heldPlaceholders, 1);
  });
});

describe("precise index: copies of shared blocks announced by several chunks", () => {
  it("self-describing events: removing P's chunk leaves the shared blocks Q's chunk holds", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", stored(Q.slice(2 * B), [12, 13], 1, "GPU"));
    // One 4-block chunk each, keyed by its last block: both carry the shared blocks 0 and 1.
    ix.applyEvent("a", stored(P, P_H, null, "CPU"));
    ix.applyEvent("a", stored(Q, Q_H, null, "CPU"));
    ix.applyEvent("a", removed([0, 1, 2, 3, 12, 13], "GPU"));
    near(score(ix, KQ).score, 4 * 0.8, "Q from CPU");
    ix.applyEvent("a", removed(P_H, "CPU"));
    const q = score(ix, KQ);
    assert.equal(q.blocks, 4, "Q's chunk still holds the shared blocks");
    near(q.score, 3.2, "Q at CPU weight");
    assert.equal(score(ix, KP).blocks, 2, "P's own blocks are gone, the shared ones stay");
    ix.applyEvent("a", removed(Q_H, "CPU"));
    assert.equal(score(ix, KQ).blocks, 0, "the last copy's removal clears them");
    assert.equal(ix.tiersOf("a", KQ[0], 0), null);
  });

  it("placeholders spanning a chunk: the same, counted over each chunk's span", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", stored(Q.slice(2 * B), [12, 13], 1, "GPU"));
    ix.applyEvent("a", placeholder([3], 4 * B));
    ix.applyEvent("a", placeholder([13], 4 * B));
    ix.applyEvent("a", removed([0, 1, 2, 3, 12, 13], "GPU"));
    ix.applyEvent("a", removed([3], "CPU"));
    assert.equal(score(ix, KQ).blocks, 4, "Q's chunk still spans the shared blocks");
    assert.equal(score(ix, KP).blocks, 2);
    ix.applyEvent("a", removed([13], "CPU"));
    assert.equal(score(ix, KQ).blocks, 0);
  });

  it("a GPU re-announcement is not counted: one GPU removal drops the GPU copy", () => {
    const ix = index();
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", stored(P, P_H, null, "GPU"));
    ix.applyEvent("a", removed(P_H, "GPU"));
    assert.equal(score(ix, KP).blocks, 0);
  });
});
