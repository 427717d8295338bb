/** Precise index and tiers: CPU copies at their weight, CPU evictions followed, vLLM's placeholder
 * offload events (held when they overtake the GPU event, bounded, cancelled by a removal, spanning an
 * offload chunk), media without a weight dropped, and shared tiers counting for every endpoint. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import type { BlockRemoved, BlockStored } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";

const xxh = await loadXxh64Hasher();
const B = 4;
const keyer = new BlockKeyer({ hasher: xxh, blockSize: B });
const TOKENS = Array.from({ length: 6 * B }, (_, i) => 300 + i);
const KEYS = keyer.keys(TOKENS, "m");
const eh = (i: number): bigint => (1n << 63n) + BigInt(i) * 7_919n;

function gpu(from: number, to: number, medium: string | null = "GPU"): BlockStored {
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
  };
}
/** vLLM's placeholder offload event: no token ids, no parent, block_size 0 (newer) or the chunk's. */
const placeholder = (blocks: number[], medium = "CPU", blockSize = 0): BlockStored => ({
  ...gpu(0, 0, medium),
  blockHashes: blocks.map(eh),
  parentBlockHash: null,
  blockSize,
});
const removed = (blocks: number[], medium = "GPU"): BlockRemoved => ({
  type: "BlockRemoved",
  blockHashes: blocks.map(eh),
  medium,
  groupIdx: 0,
});
const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

function index(opts: Partial<ConstructorParameters<typeof PreciseIndex>[0]> = {}): PreciseIndex {
  const ix = new PreciseIndex({ keyer, ...opts });
  for (const ep of ["a", "b", "c"]) ix.setEndpointModel(ep, "m");
  return ix;
}
const near = (got: number, want: number, what: string) =>
  assert.ok(Math.abs(got - want) < 1e-9, `${what}: ${got} ≠ ${want}`);

describe("CPU tier in the precise index", () => {
  it("scores a CPU copy at its weight once HBM evicts it, and follows CPU evictions", () => {
    const ix = index();
    ix.applyEvent("a", gpu(0, 5));
    ix.applyEvent("a", placeholder(range(0, 5), "cpu")); // medium matched case-insensitively
    ix.applyEvent("a", removed(range(0, 5), "GPU"));
    let r = ix.longestPrefix(KEYS, ["a"], 0);
    assert.equal(r.blocks[0], 5);
    near(r.scores[0], 5 * 0.8, "five CPU blocks");
    assert.deepEqual(ix.tiersOf("a", KEYS[0], 0), ["cpu"]);
    ix.applyEvent("a", removed([2], "Cpu"));
    r = ix.longestPrefix(KEYS, ["a"], 0);
    assert.equal(r.blocks[0], 2, "the run stops at the block the CPU tier evicted");
    near(r.scores[0], 2 * 0.8, "score after the CPU eviction");
    assert.equal(ix.tiersOf("a", KEYS[2], 0), null, "an entry with no tier left is gone");
  });

  it("holds a placeholder that overtakes its GPU event and applies it when the GPU event arrives", () => {
    const ix = index();
    ix.applyEvent("a", placeholder([0, 1, 2]));
    assert.equal(ix.heldPlaceholders, 3);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 0);
    ix.applyEvent("a", gpu(0, 4));
    assert.equal(ix.heldPlaceholders, 0);
    assert.equal(ix.stats().placeholderResolved, 3);
    ix.applyEvent("a", removed(range(0, 4)));
    const r = ix.longestPrefix(KEYS, ["a"], 0);
    assert.equal(r.blocks[0], 3);
    near(r.scores[0], 3 * 0.8, "the held CPU copies");
  });

  it("holds at most maxHeldPlaceholders, dropping the oldest and counting them", () => {
    const ix = index({ maxHeldPlaceholders: 2 });
    ix.applyEvent("a", placeholder([0, 1, 2, 3, 4]));
    assert.equal(ix.heldPlaceholders, 2);
    assert.equal(ix.stats().placeholderDropped, 3);
    ix.applyEvent("a", gpu(0, 5));
    ix.applyEvent("a", removed(range(0, 5)));
    assert.equal(ix.stats().placeholderResolved, 2);
    assert.deepEqual(ix.tiersOf("a", KEYS[3], 0), ["cpu"]);
    assert.deepEqual(ix.tiersOf("a", KEYS[4], 0), ["cpu"]);
    assert.equal(ix.tiersOf("a", KEYS[0], 0), null, "block 0's placeholder was dropped");
  });

  it("a removal cancels a held placeholder; a reset drops the endpoint's held ones", () => {
    const ix = index();
    ix.applyEvent("a", placeholder([0, 1]));
    ix.applyEvent("a", removed([0], "CPU"));
    ix.applyEvent("a", gpu(0, 2));
    assert.deepEqual(ix.tiersOf("a", KEYS[0], 0), ["gpu"]);
    assert.deepEqual(ix.tiersOf("a", KEYS[1], 0)?.sort(), ["cpu", "gpu"]);
    const s = ix.stats();
    assert.equal(s.placeholderCancelled, 1);
    assert.equal(s.removedUnknown, 0);
    ix.applyEvent("b", placeholder([0]));
    ix.resetEndpoint("b");
    assert.equal(ix.heldPlaceholders, 0);
  });

  it("one placeholder hash per offload chunk covers the chunk's GPU blocks, stored and removed", () => {
    const ix = index();
    ix.applyEvent("a", gpu(0, 6));
    // Chunks of 2 GPU blocks: the hash is the chunk's last block's (vLLM get_offload_block_hash).
    ix.applyEvent("a", placeholder([1, 3, 5], "CPU", 2 * B));
    ix.applyEvent("a", removed(range(0, 6)));
    let r = ix.longestPrefix(KEYS, ["a"], 0);
    assert.equal(r.blocks[0], 6);
    near(r.scores[0], 6 * 0.8, "three chunks of two blocks");
    ix.applyEvent("a", removed([3], "CPU"));
    r = ix.longestPrefix(KEYS, ["a"], 0);
    assert.equal(r.blocks[0], 2, "the second chunk (blocks 2 and 3) is gone");
    assert.deepEqual(ix.tiersOf("a", KEYS[4], 0), ["cpu"]);
  });

  it("placeholderSpan stands in for block_size 0", () => {
    const ix = index({ placeholderSpan: 3 });
    ix.applyEvent("a", gpu(0, 6));
    ix.applyEvent("a", placeholder([2, 5]));
    ix.applyEvent("a", removed(range(0, 6)));
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 6);
  });

  it("property: a placeholder held before its GPU event ends as if it came after", () => {
    fc.assert(
      fc.property(
        fc.subarray(range(0, 6), { minLength: 1 }),
        fc.nat({ max: 6 }),
        fc.subarray(range(0, 6)),
        (cpu, gpuAt, evicted) => {
          const inOrder = index();
          inOrder.applyEvent("a", gpu(0, 6));
          for (const b of cpu) inOrder.applyEvent("a", placeholder([b]));
          const early = index();
          cpu.forEach((b, i) => {
            if (i === Math.min(gpuAt, cpu.length)) early.applyEvent("a", gpu(0, 6));
            early.applyEvent("a", placeholder([b]));
          });
          if (gpuAt >= cpu.length) early.applyEvent("a", gpu(0, 6));
          for (const ix of [inOrder, early]) ix.applyEvent("a", removed(evicted));
          for (let k = 0; k < 6; k++)
            assert.deepEqual(
              early.tiersOf("a", KEYS[k], 0)?.sort(),
              inOrder.tiersOf("a", KEYS[k], 0)?.sort(),
            );
          const [x, y] = [early, inOrder].map((ix) => ix.longestPrefix(KEYS, ["a"], 0));
          assert.equal(x.blocks[0], y.blocks[0]);
          near(x.scores[0], y.scores[0], "score");
          assert.equal(early.heldPlaceholders, 0);
        },
      ),
      { seed: 13, numRuns: 200 },
    );
  });
});

describe("media without a weight", () => {
  it("drops and counts events whose medium has no weight instead of weighting them as GPU", () => {
    const ix = index();
    ix.applyEvent("a", gpu(0, 3, "STORAGE"));
    ix.applyEvent("a", placeholder([0], "DISK"));
    ix.applyEvent("a", removed([0], "SHARED_STORAGE"));
    assert.equal(ix.stats().unknownMedium, 3);
    assert.equal(ix.stats().entries, 0);
    assert.equal(ix.longestPrefix(KEYS, ["a"], 0).blocks[0], 0);
  });

  it("rejects weights without gpu, duplicate names in any case, and shared tiers without a weight", () => {
    assert.throws(() => index({ tierWeights: { cpu: 0.8 } }), /must include "gpu"/);
    assert.throws(() => index({ tierWeights: { gpu: 1, GPU: 1 } }), /listed twice/);
    assert.throws(() => index({ sharedTiers: ["shared_storage"] }), /has no weight/);
    assert.throws(() => index({ sharedTiers: ["gpu"] }), /cannot be shared/);
  });
});

describe("shared storage tier", () => {
  const weights = { gpu: 1, cpu: 0.8, shared_storage: 0.5 };

  it("a copy one endpoint announces counts for every endpoint, at the better weight per block", () => {
    const ix = index({ tierWeights: weights, sharedTiers: ["SHARED_STORAGE"] });
    ix.applyEvent("a", gpu(0, 5));
    ix.applyEvent("a", placeholder(range(0, 4), "SHARED_STORAGE"));
    ix.applyEvent("b", gpu(0, 1));
    const r = ix.longestPrefix(KEYS, ["a", "b", "c", "unknown"], 0);
    assert.deepEqual([...r.blocks], [5, 4, 4, 4], "an endpoint with no events yet reaches the storage too");
    near(r.scores[0], 5, "a's own GPU copies beat storage");
    near(r.scores[1], 1 + 3 * 0.5, "b: block 0 on GPU, blocks 1-3 from storage");
    near(r.scores[2], 4 * 0.5, "c never saw the prefix");
    assert.equal(ix.sharedEntries("shared_storage"), 4);
    assert.deepEqual(ix.endpointIds().sort(), ["a", "b", "c"], "the shared tier is no endpoint");
    // A self-describing storage event from another endpoint extends the shared copy.
    ix.applyEvent("c", gpu(4, 6, "SHARED_STORAGE"));
    assert.equal(ix.longestPrefix(KEYS, ["b"], 0).blocks[0], 6);
    // Removal from the storage tier (any endpoint may report it) is seen by all.
    ix.applyEvent("b", removed([2], "shared_storage"));
    assert.deepEqual(
      [...ix.longestPrefix(KEYS, ["a", "b", "c"], 0).blocks],
      [6, 2, 2],
      "a: GPU 0-4, storage 5",
    );
  });

  it("an engine reset leaves the shared tier alone", () => {
    const ix = index({ tierWeights: weights, sharedTiers: ["shared_storage"] });
    ix.applyEvent("a", gpu(0, 3, "shared_storage"));
    ix.applyEvent("a", { type: "AllBlocksCleared" });
    ix.removeEndpoint("a");
    assert.equal(ix.longestPrefix(KEYS, ["b"], 0).blocks[0], 3);
  });
});
