// The one-call wasm xxh64 chain and the packed prefix index, checked against the straightforward
// paths: xxhash-wasm per block (llm-d's chain definition) and bigint hashes.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import xxhashWasm from "xxhash-wasm";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import {
  chainFrom,
  chainHashes,
  chainHashesPacked,
  flatPrompt,
  flattenChat,
  flattenPrompt,
  transientPrompt,
} from "../src/scheduler/plugins/prefix/hashing.ts";
import { ApproxPrefixIndex, packHashes } from "../src/scheduler/plugins/prefix/indexer.ts";
import { createRng, type Rng } from "../src/scheduler/rng.ts";
import { chat, cycleFor } from "../src/scheduler/testing.ts";
import { Xxh64Chain } from "../src/scheduler/xxh64-wasm.ts";

let plain: Hasher;
let fast: Hasher;
before(async () => {
  const api = await xxhashWasm();
  plain = { h64: (bytes, seed = 0n) => api.h64Raw(bytes, seed) };
  fast = await createXxHasher();
});

function randomBytes(rng: Rng, n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = rng.int(256);
  return b;
}

function random64(rng: Rng): bigint {
  return (BigInt(rng.int(2 ** 32)) << 32n) | BigInt(rng.int(2 ** 32));
}

function unpack(p: ArrayLike<number>): bigint[] {
  const out: bigint[] = [];
  for (let k = 0; k < p.length; k += 2) out.push((BigInt(p[k + 1] >>> 0) << 32n) | BigInt(p[k] >>> 0));
  return out;
}

describe("wasm xxh64", () => {
  it("equals xxhash-wasm on random inputs, lengths 0..4096 and random seeds", () => {
    const x = new Xxh64Chain();
    const rng = createRng(1);
    for (let k = 0; k < 3000; k++) {
      const len = k < 600 ? k : rng.int(4097);
      const bytes = randomBytes(rng, len);
      const seed = k % 4 === 0 ? 0n : random64(rng);
      assert.equal(x.h64(bytes, seed), plain.h64(bytes, seed), `len ${len} seed ${seed}`);
    }
  });

  it("grows its memory for large inputs", () => {
    const x = new Xxh64Chain();
    const bytes = randomBytes(createRng(2), 300_000);
    assert.equal(x.h64(bytes), plain.h64(bytes));
  });
});

describe("wasm block chain", () => {
  it("equals the per-block chain (xxhash-wasm) for random bytes, block sizes, caps, starts and parents", () => {
    const x = new Xxh64Chain();
    const rng = createRng(3);
    for (let k = 0; k < 1500; k++) {
      const bytes = randomBytes(rng, rng.int(5000));
      const blockBytes = [1, 3, 4, 8, 31, 32, 33, 64, 256, 1024][rng.int(10)];
      const maxBlocks = rng.next() < 0.7 ? Number.POSITIVE_INFINITY : rng.int(12);
      const first = rng.next() < 0.7 ? 0 : rng.int(6);
      const prev = random64(rng);
      const want: bigint[] = [];
      chainFrom(plain, bytes, blockBytes, maxBlocks, first, prev, want);
      assert.deepEqual(unpack(x.chain(bytes, blockBytes, maxBlocks, first, prev)), want, `case ${k}`);
      const got: bigint[] = [];
      chainFrom(fast, bytes, blockBytes, maxBlocks, first, prev, got);
      assert.deepEqual(got, want, `case ${k} via chainFrom`);
    }
  });

  it("gives the same packed chains with or without the fast path, for byte and token segments", () => {
    const rng = createRng(4);
    for (let k = 0; k < 300; k++) {
      const bytes = randomBytes(rng, rng.int(3000));
      const seg =
        k % 2 === 0
          ? { kind: "bytes" as const, bytes }
          : { kind: "tokens" as const, tokens: new Uint32Array(bytes.buffer, 0, bytes.length >>> 2) };
      const h0 = random64(rng);
      const want: bigint[] = [];
      chainHashes(plain, h0, seg, 64, 2048, want);
      assert.deepEqual(unpack(chainHashesPacked(fast, h0, seg, 64, 2048, null)), want);
      assert.deepEqual(unpack(chainHashesPacked(plain, h0, seg, 64, 2048, null)), want);
    }
  });
});

describe("packed prefix index", () => {
  it("packHashes splits uint64s into (lo, hi) int32 halves", () => {
    assert.deepEqual([...packHashes([0x0123456789abcdefn, 1n])], [0x89abcdef | 0, 0x01234567, 1, 0]);
    assert.deepEqual([...packHashes([0xffffffff80000000n])], [-0x80000000, -1]);
  });

  it("matches like a bigint-keyed reference under random adds, evictions, hash collisions in the low bits and pruning", () => {
    const rng = createRng(5);
    // Few distinct low halves, so blocks share bucket keys and chains get exercised.
    const pool = Array.from({ length: 400 }, (_, i) => (BigInt(rng.int(2 ** 32)) << 32n) | BigInt(i % 7));
    const ix = new ApproxPrefixIndex();
    const ref = new ReferenceIndex();
    const ids = ["a", "b", "c", "d", "e"];
    for (let step = 0; step < 3000; step++) {
      const start = rng.int(pool.length - 40);
      const hashes = pool.slice(start, start + 1 + rng.int(40));
      const r = rng.next();
      if (r < 0.5) {
        const id = ids[rng.int(ids.length)];
        const cap = 1 + rng.int(60);
        if (rng.next() < 0.5) ix.add(id, hashes, cap);
        else ix.addPacked(id, packHashes(hashes), cap);
        ref.add(id, hashes, cap);
      } else if (r < 0.98) {
        const want = ref.match(hashes);
        const got = rng.next() < 0.5 ? ix.match(hashes) : ix.matchPacked(packHashes(hashes));
        assert.equal(got.depth, want.depth, `step ${step}`);
        assert.deepEqual(Object.fromEntries(got.counts), Object.fromEntries(want.counts), `step ${step}`);
      } else {
        const keep = new Set(ids.filter(() => rng.next() < 0.7));
        ix.retain(keep);
        ref.retain(keep);
      }
      assert.equal(ix.size, ref.size);
      assert.equal(ix.distinctBlocks, ref.distinct);
    }
  });
});

describe("packed prefix index at scale", () => {
  it("matches the reference while its block arena grows, frees and reuses ids", () => {
    const rng = createRng(7);
    const ix = new ApproxPrefixIndex();
    const ref = new ReferenceIndex();
    const chains = Array.from({ length: 60 }, () => Array.from({ length: 150 }, () => random64(rng)));
    for (let step = 0; step < 400; step++) {
      const c = chains[rng.int(chains.length)];
      const hashes = [...c.slice(0, 20 + rng.int(130)), random64(rng)];
      const id = `e${rng.int(6)}`;
      const cap = 200 + rng.int(1500);
      ix.addPacked(id, packHashes(hashes), cap);
      ref.add(id, hashes, cap);
      const probe = chains[rng.int(chains.length)];
      const got = ix.matchPacked(packHashes(probe));
      const want = ref.match(probe);
      assert.equal(got.depth, want.depth, `step ${step}`);
      assert.deepEqual(Object.fromEntries(got.counts), Object.fromEntries(want.counts), `step ${step}`);
    }
    assert.equal(ix.size, ref.size);
    assert.equal(ix.distinctBlocks, ref.distinct);
    assert.ok(ix.distinctBlocks > 2048, `distinct ${ix.distinctBlocks}`);
  });
});

describe("packed prefix index with many holders per block", () => {
  it("matches the reference while blocks gain and lose dozens of holders (pool chunks grow, shrink, are reused)", () => {
    const rng = createRng(11);
    const ix = new ApproxPrefixIndex();
    const ref = new ReferenceIndex();
    // A few short chains shared by up to 48 endpoints: popular blocks get 20-48 holders.
    const chains = Array.from({ length: 6 }, () => Array.from({ length: 12 }, () => random64(rng)));
    const ids = Array.from({ length: 48 }, (_, i) => `h${i}`);
    for (let step = 0; step < 4000; step++) {
      const r = rng.next();
      if (r < 0.6) {
        const c = chains[rng.int(chains.length)];
        const hashes = c.slice(0, 1 + rng.int(c.length));
        const id = ids[rng.int(ids.length)];
        const cap = 1 + rng.int(30);
        ix.addPacked(id, packHashes(hashes), cap);
        ref.add(id, hashes, cap);
      } else if (r < 0.97) {
        const probe = chains[rng.int(chains.length)];
        const got = ix.matchPacked(packHashes(probe));
        const want = ref.match(probe);
        assert.equal(got.depth, want.depth, `step ${step}`);
        assert.deepEqual(Object.fromEntries(got.counts), Object.fromEntries(want.counts), `step ${step}`);
      } else {
        const keep = new Set(ids.filter(() => rng.next() < 0.8));
        ix.retain(keep);
        ref.retain(keep);
      }
      assert.equal(ix.size, ref.size, `step ${step}`);
      assert.equal(ix.distinctBlocks, ref.distinct, `step ${step}`);
    }
    for (const id of ids) assert.equal(ix.blocksOf(id), ref.lrus.get(id)?.size ?? 0, id);
    // Holders of each chain's first block at the end: the pool's larger chunk classes were used.
    const most = Math.max(...chains.map((c) => ref.match(c.slice(0, 1)).counts.size));
    assert.ok(most >= 12, `the most-held block has ${most} holders`);
  });
});

/** The straightforward index: bigint keys, one LRU Map per endpoint, holder sets per block. */
class ReferenceIndex {
  readonly lrus = new Map<string, Map<bigint, true>>();

  add(id: string, hashes: readonly bigint[], cap: number): void {
    if (cap <= 0 || hashes.length === 0) return;
    let lru = this.lrus.get(id);
    if (lru === undefined) this.lrus.set(id, (lru = new Map()));
    for (let i = hashes.length - 1; i >= 0; i--) {
      lru.delete(hashes[i]);
      lru.set(hashes[i], true);
    }
    while (lru.size > cap) lru.delete(lru.keys().next().value as bigint);
  }

  match(hashes: readonly bigint[]): { depth: number; counts: Map<string, number> } {
    const counts = new Map<string, number>();
    let depth = 0;
    for (; depth < hashes.length; depth++) {
      let held = false;
      for (const [id, lru] of this.lrus) {
        if (!lru.has(hashes[depth])) continue;
        held = true;
        counts.set(id, (counts.get(id) ?? 0) + 1);
      }
      if (!held) break;
    }
    return { depth, counts };
  }

  retain(keep: ReadonlySet<string>): void {
    for (const id of [...this.lrus.keys()]) if (!keep.has(id)) this.lrus.delete(id);
  }

  get size(): number {
    let n = 0;
    for (const lru of this.lrus.values()) n += lru.size;
    return n;
  }

  get distinct(): number {
    const all = new Set<bigint>();
    for (const lru of this.lrus.values()) for (const h of lru.keys()) all.add(h);
    return all.size;
  }
}

describe("transient prompt bytes", () => {
  it("equal the owned flattening, and the cycle memo re-flattens the same bytes on demand", () => {
    const rng = createRng(6);
    for (let k = 0; k < 50; k++) {
      const messages = Array.from({ length: 1 + rng.int(6) }, (_, i) => ({
        role: i % 2 === 0 ? "user" : "assistant",
        content:
          rng.next() < 0.8
            ? "héllo ✓ wörld ".repeat(rng.int(200))
            : [
                { type: "text", text: "a".repeat(rng.int(100)) },
                { type: "image_url", image_url: { url: `u${rng.int(5)}` } },
              ],
      }));
      const req = { ...chat(`r${k}`, "", ""), prompt: { kind: "chat" as const, messages } };
      const want = flattenPrompt(req, fast);
      const cycle = cycleFor(req, []);
      const t = transientPrompt(cycle, fast);
      assert.equal(t.tokenCount, want.tokenCount);
      assert.deepEqual(
        [...(t.segments[0] as { bytes: Uint8Array }).bytes],
        [...(want.segments[0] as { bytes: Uint8Array }).bytes],
      );
      flattenChat([{ role: "x", content: "overwrites the scratch buffer" }], undefined, fast);
      const memo = flatPrompt(cycle, fast);
      assert.equal(memo.tokenCount, want.tokenCount);
      assert.deepEqual(memo.segments, want.segments);
      assert.equal(transientPrompt(cycle, fast), memo);
    }
  });
});
