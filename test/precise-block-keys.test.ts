/** Request block keys: chaining, full blocks only, roots from model and cache_salt, and both hashers
 * checked against independent computations (xxh64 via xxhash-wasm directly, FNV-1a 64 with bigint math). */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import xxhash from "xxhash-wasm";
import {
  type BlockHasher,
  BlockKeyer,
  fnv1a64Hasher,
  h64Hasher,
  loadXxh64Hasher,
  packKeys,
  unpackKeys,
} from "../src/kv/block-keys.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { rng } from "./helpers/kv-event-fixtures.ts";

const api = await xxhash();
const xxh = await loadXxh64Hasher();
const utf8 = new TextEncoder();

function tokenBytes(tokens: number[]): Uint8Array {
  const b = new Uint8Array(tokens.length * 4);
  const v = new DataView(b.buffer);
  for (let i = 0; i < tokens.length; i++) v.setUint32(i * 4, tokens[i], true);
  return b;
}

function fnvRef(bytes: Uint8Array): bigint {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h;
}

function le64(x: bigint): Uint8Array {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, x, true);
  return b;
}

describe("block keys", () => {
  it("xxh64: root = h64(model ‖ 0 ‖ salt), key i = h64(LE64(h64(block i's LE token words)) ‖ LE64(key i-1))", () => {
    const k = new BlockKeyer({ hasher: xxh, blockSize: 4 });
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8, 2 ** 31 + 5, 10];
    const keys = k.keys(tokens, "llama", "salt");
    assert.equal(keys.length, 2, "the partial third block gets no key");
    const root = api.h64Raw(utf8.encode("llama\u0000salt"), 0n);
    const pair = (b: bigint, parent: bigint) => api.h64Raw(new Uint8Array([...le64(b), ...le64(parent)]), 0n);
    const k0 = pair(api.h64Raw(tokenBytes(tokens.slice(0, 4)), 0n), root);
    const k1 = pair(api.h64Raw(tokenBytes(tokens.slice(4, 8)), 0n), k0);
    assert.deepEqual([...keys], [k0, k1]);
    assert.deepEqual([...unpackKeys(k.packedKeys(tokens, "llama", "salt"))], [k0, k1]);
  });

  it("xxh64: the wasm chain gives the per-block path's keys (chain at any offset, packed, long prompts)", () => {
    const slow = h64Hasher((d, seed) => api.h64Raw(d, seed));
    const r = createRng(11);
    for (const blockSize of [1, 3, 16, 64]) {
      for (const blocks of [1, 2, 7, 130, 700]) {
        const tokens = Array.from({ length: blocks * blockSize + r.int(blockSize) }, () => r.int(2 ** 32));
        const fast = new BlockKeyer({ hasher: xxh, blockSize });
        const ref = new BlockKeyer({ hasher: slow, blockSize });
        const want = ref.keys(tokens, "m", "s");
        assert.equal(want.length, blocks);
        assert.deepEqual([...fast.keys(tokens, "m", "s")], [...want], `${blockSize} × ${blocks}`);
        assert.deepEqual([...unpackKeys(fast.packedKeys(tokens, "m", "s"))], [...want]);
        assert.deepEqual([...unpackKeys(ref.packedKeys(tokens, "m", "s"))], [...want]);
        assert.deepEqual([...unpackKeys(fast.packedKeys(new Uint32Array(tokens), "m", "s"))], [...want]);
        assert.deepEqual([...unpackKeys(packKeys(want))], [...want]);
        // chain() from a block offset into an output offset, chained on the previous key.
        if (blocks > 2) {
          const out = new BigUint64Array(blocks + 3);
          xxh.chain(want[0], tokens, blockSize, blockSize, blocks - 1, out, 3);
          assert.deepEqual([...out.subarray(3, 3 + blocks - 1)], [...want.subarray(1)]);
        }
      }
    }
  });

  it("property: the one-call wasm keys equal the per-block xxhash-wasm keys (any tokens, block size, model, salt)", () => {
    const slow = h64Hasher((d, seed) => api.h64Raw(d, seed));
    // Block sizes around the whole-stripe sizes (multiples of 8 tokens hash inline, others call xxh64).
    const blockSize = fc.oneof(fc.integer({ min: 1, max: 40 }), fc.constantFrom(8, 16, 32, 64, 128));
    const token = fc.oneof(fc.integer({ min: 0, max: 200_000 }), fc.integer({ min: 0, max: 0xffffffff }));
    fc.assert(
      fc.property(
        blockSize,
        fc.array(token, { maxLength: 1200 }),
        fc.constantFrom("m", "meta-llama/Llama-3.1-8B-Instruct", "lora-a"),
        fc.option(fc.string({ maxLength: 8 })),
        (B, tokens, model, salt) => {
          const fast = new BlockKeyer({ hasher: xxh, blockSize: B });
          const ref = new BlockKeyer({ hasher: slow, blockSize: B });
          const want = [...ref.keys(tokens, model, salt)];
          assert.equal(want.length, Math.floor(tokens.length / B));
          assert.deepEqual([...unpackKeys(fast.packedKeys(tokens, model, salt))], want);
          assert.deepEqual([...fast.keys(tokens, model, salt)], want);
          // The same keyer again, now with its last (model, salt) remembered, and another model between.
          fast.root("other-model", "x");
          assert.deepEqual([...unpackKeys(fast.packedKeys(tokens, model, salt))], want);
          assert.deepEqual([...unpackKeys(fast.packedKeys(tokens, model, salt))], want);
        },
      ),
      { seed: 20261205, numRuns: 300 },
    );
  });

  it("fnv1a64: FNV-1a 64 over (parent LE64 ‖ LE token words), root over the model/salt bytes", () => {
    const k = new BlockKeyer({ hasher: fnv1a64Hasher(), blockSize: 3 });
    const tokens = [0, 1, 0xffffffff, 42, 7, 99, 5];
    const keys = k.keys(tokens, "m");
    const root = fnvRef(utf8.encode("m\u0000"));
    const k0 = fnvRef(new Uint8Array([...le64(root), ...tokenBytes(tokens.slice(0, 3))]));
    const k1 = fnvRef(new Uint8Array([...le64(k0), ...tokenBytes(tokens.slice(3, 6))]));
    assert.deepEqual([...keys], [k0, k1]);
    assert.equal(k.root("m"), root);
  });

  for (const [name, hasher] of [
    ["xxh64", xxh],
    ["fnv1a64", fnv1a64Hasher()],
  ] as [string, BlockHasher][]) {
    it(`${name}: keys of a prefix are a prefix of the keys; model and salt change every key`, () => {
      const r = rng(name.length);
      for (const blockSize of [1, 16, 64]) {
        const k = new BlockKeyer({ hasher, blockSize });
        const tokens = Array.from({ length: blockSize * 10 - 1 }, () => Math.floor(r() * 200_000));
        const all = k.keys(tokens, "m");
        assert.equal(all.length, 9);
        for (const cut of [0, blockSize - 1, blockSize * 4, blockSize * 4 + 1, tokens.length]) {
          const part = k.keys(tokens.slice(0, cut), "m");
          assert.deepEqual([...part], [...all.subarray(0, Math.floor(cut / blockSize))]);
        }
        assert.equal(k.keys(tokens, "m", null, 3).length, 3);
        const salted = k.keys(tokens, "m", "s");
        const other = k.keys(tokens, "n");
        for (let i = 0; i < all.length; i++) {
          assert.notEqual(salted[i], all[i]);
          assert.notEqual(other[i], all[i]);
        }
        assert.deepEqual([...k.keys(tokens, "m", "")], [...all], "an empty salt is no salt, as in vLLM");
        // One changed token changes its block's key and every later one, not the earlier ones.
        const changed = tokens.slice();
        changed[blockSize * 5] ^= 1;
        const ck = k.keys(changed, "m");
        for (let i = 0; i < 9; i++) assert.equal(ck[i] === all[i], i < 5, `block ${i}`);
      }
    });
  }

  it("the two hashers give different keys (they must not be mixed) and both use all 64 bits", () => {
    const tokens = Array.from({ length: 16 * 200 }, (_, i) => i * 7);
    const a = new BlockKeyer({ hasher: xxh }).keys(tokens, "m");
    const b = new BlockKeyer({ hasher: fnv1a64Hasher() }).keys(tokens, "m");
    assert.notEqual(a[0], b[0]);
    for (const keys of [a, b]) {
      assert.ok([...keys].some((x) => x >= 1n << 63n));
      assert.equal(new Set(keys).size, keys.length);
    }
  });

  it("rejects a block size that is not a positive integer", () => {
    assert.throws(() => new BlockKeyer({ hasher: xxh, blockSize: 0 }), RangeError);
    assert.throws(() => new BlockKeyer({ hasher: xxh, blockSize: 1.5 }), RangeError);
  });
});
