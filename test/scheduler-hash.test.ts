// Prefix hashing: xxhash64 public vectors, the llm-d block chain rebuilt by hand, prompt flattening.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { ChainCache } from "../src/scheduler/plugins/prefix/chain-cache.ts";
import {
  chainHashes,
  flattenChat,
  flattenPrompt,
  MULTIMODAL_PLACEHOLDER_TOKENS,
  rootHash,
  tokenBytes,
} from "../src/scheduler/plugins/prefix/hashing.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { completion } from "../src/scheduler/testing.ts";

const enc = new TextEncoder();
let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

/** LE64(a) || LE64(b), written independently of the code under test. */
function le64pair(a: bigint, b: bigint): Uint8Array {
  const out = new Uint8Array(16);
  for (let i = 0; i < 8; i++) {
    out[i] = Number((a >> BigInt(8 * i)) & 0xffn);
    out[8 + i] = Number((b >> BigInt(8 * i)) & 0xffn);
  }
  return out;
}

describe("xxhash64", () => {
  it("matches public test vectors (seed 0)", () => {
    assert.equal(h.h64(new Uint8Array(0)), 0xef46db3751d8e999n);
    assert.equal(h.h64(enc.encode("a")), 0xd24ec4f1a98c6e5bn);
    assert.equal(h.h64(enc.encode("abc")), 0x44bc2cf5ad770999n);
  });
  it("honours the seed", () => {
    assert.notEqual(h.h64(new Uint8Array(0), 1n), h.h64(new Uint8Array(0)));
  });
});

describe("block hash chain (llm-d approximate prefix)", () => {
  it("h0 = xxh64(model || cacheSalt)", () => {
    assert.equal(rootHash(h, "llama", "salt"), h.h64(enc.encode("llamasalt")));
    assert.equal(rootHash(h, "llama", undefined), h.h64(enc.encode("llama")));
  });

  it("chains b_i = xxh64(block bytes), h_i = xxh64(LE64(b_i) || LE64(h_{i-1})), trailing partial block included", () => {
    const blockTokens = 2; // 8 bytes per block
    const text = "0123456789abcdefXYZ"; // 19 bytes: blocks of 8, 8, 3
    const bytes = enc.encode(text);
    const h0 = rootHash(h, "m", undefined);
    const b0 = h.h64(bytes.subarray(0, 8));
    const h1 = h.h64(le64pair(b0, h0));
    const b1 = h.h64(bytes.subarray(8, 16));
    const h2 = h.h64(le64pair(b1, h1));
    const b2 = h.h64(bytes.subarray(16, 19));
    const h3 = h.h64(le64pair(b2, h2));
    const out: bigint[] = [];
    chainHashes(h, h0, { kind: "bytes", bytes }, blockTokens, 100, out);
    assert.deepEqual(out, [h1, h2, h3]);
  });

  it("stops at maxBlocks", () => {
    const out: bigint[] = [];
    chainHashes(h, 7n, { kind: "bytes", bytes: new Uint8Array(1000) }, 64, 2, out);
    assert.equal(out.length, 2);
  });

  it("token ids hash as little-endian uint32 bytes", () => {
    const tokens = new Uint32Array([1, 0x01020304]);
    assert.deepEqual([...tokenBytes(tokens)], [1, 0, 0, 0, 4, 3, 2, 1]);
    const out: bigint[] = [];
    chainHashes(h, 5n, { kind: "tokens", tokens }, 64, 10, out);
    const b0 = h.h64(new Uint8Array([1, 0, 0, 0, 4, 3, 2, 1]));
    assert.deepEqual(out, [h.h64(le64pair(b0, 5n))]);
  });

  it("4 prompt bytes are one pseudo-token: bytes 'abcd' hash like token 0x64636261", () => {
    const a: bigint[] = [];
    const b: bigint[] = [];
    chainHashes(h, 1n, { kind: "bytes", bytes: enc.encode("abcd") }, 64, 10, a);
    chainHashes(h, 1n, { kind: "tokens", tokens: new Uint32Array([0x64636261]) }, 64, 10, b);
    assert.deepEqual(a, b);
  });
});

describe("prompt flattening", () => {
  it("counts pseudo-tokens as ceil(bytes / 4)", () => {
    assert.equal(flattenPrompt(completion("r", "12345"), null).tokenCount, 2);
  });
  it("hashes multi-prompt completions per prompt", () => {
    const fp = flattenPrompt(
      { ...completion("r", ""), prompt: { kind: "completion", prompt: ["ab", "cd"] } },
      null,
    );
    assert.equal(fp.segments.length, 2);
  });
  it("prefers real token ids when given", () => {
    const fp = flattenPrompt(completion("r", "ignored text", { tokenIds: [5, 6, 7] }), null);
    assert.equal(fp.tokenCount, 3);
    assert.equal(fp.segments[0].kind, "tokens");
  });
  it("flattens chat as json(tools) + role + content per message, no separators", () => {
    const bytes = flattenChat(
      [
        { role: "system", content: "S" },
        { role: "user", content: [{ type: "text", text: "hi" }] },
      ],
      [{ type: "function" }],
      null,
    );
    assert.equal(new TextDecoder().decode(bytes), '[{"type":"function"}]systemSuserhi');
  });
  it("pads to a token boundary before a multimodal placeholder run", () => {
    const bytes = flattenChat(
      [{ role: "u", content: [{ type: "image_url", image_url: { url: "x" } }] }],
      undefined,
      h,
    );
    assert.equal(bytes.length, 4 + MULTIMODAL_PLACEHOLDER_TOKENS * 4);
    const low32 = Number(h.h64(enc.encode("x")) & 0xffffffffn);
    assert.equal(new DataView(bytes.buffer, bytes.byteOffset).getUint32(4, true), low32);
  });
});

describe("chain cache", () => {
  it("gives exactly the uncached chain for prompts sharing prefixes, partial blocks and caps", () => {
    const cache = new ChainCache(8);
    const rng = createRng(21);
    const bases = ["A".repeat(700), "B".repeat(300), "C".repeat(1500)];
    for (let k = 0; k < 400; k++) {
      let text = bases[rng.int(bases.length)];
      if (rng.next() < 0.7) text = text.slice(0, rng.int(text.length + 1));
      text += "x".repeat(rng.int(3)) + "tail".repeat(rng.int(100));
      const blockTokens = rng.next() < 0.8 ? 64 : 2 + rng.int(100);
      const maxBlocks = rng.next() < 0.8 ? 1000 : rng.int(6);
      const h0 = rng.next() < 0.9 ? 11n : 12n;
      const seg =
        rng.next() < 0.8
          ? { kind: "bytes" as const, bytes: enc.encode(text) }
          : {
              kind: "tokens" as const,
              tokens: new Uint32Array(enc.encode(text).slice(0, text.length & ~3).buffer),
            };
      const want: bigint[] = [];
      const got: bigint[] = [];
      chainHashes(h, h0, seg, blockTokens, maxBlocks, want);
      cache.hash(h, h0, seg, blockTokens, maxBlocks, got);
      assert.deepEqual(got, want, `case ${k}`);
    }
    assert.ok(cache.hits > 50, `hits ${cache.hits}`);
    assert.ok(cache.size <= 8);
  });
});
