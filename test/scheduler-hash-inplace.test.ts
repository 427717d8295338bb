// The wasm chain hashing input written into its own scratch memory (no copy) equals hashing a
// separate copy, including after the memory grows; and chat prompts flattened into the scratch
// memory hash the same as the owned flattening.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import {
  chainHashesPacked,
  flattenPrompt,
  transientPrompt,
} from "../src/scheduler/plugins/prefix/hashing.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { chat, cycleFor } from "../src/scheduler/testing.ts";
import { Xxh64Chain } from "../src/scheduler/xxh64-wasm.ts";

let fast: Hasher;
before(async () => {
  fast = await createXxHasher();
});

describe("wasm block chain in place", () => {
  it("equals chaining a copy, for views at any offset, block sizes, caps and starts", () => {
    const x = new Xxh64Chain();
    const ref = new Xxh64Chain();
    const rng = createRng(11);
    for (let k = 0; k < 600; k++) {
      const len = k === 0 ? 200_000 : rng.int(5000);
      const off = rng.int(64);
      const mem = x.scratch(off + len);
      for (let i = 0; i < len; i++) mem[off + i] = rng.int(256);
      const view = mem.subarray(off, off + len);
      const copy = view.slice();
      const blockBytes = [1, 4, 31, 64, 256, 1024][rng.int(6)];
      const maxBlocks = rng.next() < 0.7 ? Number.POSITIVE_INFINITY : rng.int(12);
      const first = rng.next() < 0.7 ? 0 : rng.int(6);
      const prev = (BigInt(rng.int(2 ** 32)) << 32n) | BigInt(rng.int(2 ** 32));
      const want = ref.chain(copy, blockBytes, maxBlocks, first, prev);
      assert.deepEqual(x.chain(view, blockBytes, maxBlocks, first, prev), want, `case ${k}`);
    }
  });

  it("chat prompts flattened into the hasher's scratch hash like the owned flattening", () => {
    const rng = createRng(12);
    for (let k = 0; k < 40; k++) {
      const messages = Array.from({ length: 1 + rng.int(8) }, (_, i) => ({
        role: i % 2 === 0 ? "user" : "assistant",
        content:
          rng.next() < 0.8
            ? "héllo ✓ wörld, plain ascii too ".repeat(rng.int(3000))
            : [
                { type: "text", text: "a".repeat(rng.int(100)) },
                { type: "image_url", image_url: { url: `u${rng.int(5)}` } },
              ],
      }));
      const req = { ...chat(`r${k}`, "", ""), prompt: { kind: "chat" as const, messages } };
      const owned = flattenPrompt(req, fast).segments[0];
      const want = chainHashesPacked(fast, 7n, owned, 16, Number.POSITIVE_INFINITY, null);
      const t = transientPrompt(cycleFor(req, []), fast).segments[0];
      assert.deepEqual(chainHashesPacked(fast, 7n, t, 16, Number.POSITIVE_INFINITY, null), want, `case ${k}`);
    }
  });
});
