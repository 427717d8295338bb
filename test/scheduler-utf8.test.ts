// writeUtf8 (prompt flattening's encoder) against TextEncoder on random text of every kind.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { flattenPrompt, transientPrompt } from "../src/scheduler/plugins/prefix/hashing.ts";
import { writeUtf8 } from "../src/scheduler/plugins/prefix/utf8.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { chat, cycleFor } from "../src/scheduler/testing.ts";

const POOLS = [
  'abc xyz{}"\\\n\t~',
  "éüñßÿ\u0080\u00ff",
  "Ā✓€日本語\u0100\u07ff\u0800\uffff",
  "😀𝄞\ud83d\ude00",
  "\ud800\udc00\udfff\ud800",
];

describe("writeUtf8", () => {
  it("writes TextEncoder's bytes at any offset and nothing outside them", () => {
    const rng = createRng(3);
    const enc = new TextEncoder();
    for (let k = 0; k < 2000; k++) {
      const mix = POOLS.filter(() => rng.next() < 0.5);
      const pool = mix.length > 0 ? mix.join("") : POOLS[0];
      let s = "";
      const len = rng.int(80);
      for (let i = 0; i < len; i++) s += pool[rng.int(pool.length)];
      const at = rng.int(16);
      const dst = new Uint8Array(at + 3 * s.length + 8).fill(0xaa);
      const n = writeUtf8(dst, at, s);
      const want = enc.encode(s);
      assert.equal(n, want.length, JSON.stringify(s));
      assert.deepEqual([...dst.subarray(at, at + n)], [...want], JSON.stringify(s));
      assert.ok(
        dst.subarray(0, at).every((b) => b === 0xaa) && dst.subarray(at + n).every((b) => b === 0xaa),
        "bytes outside the written range are untouched",
      );
    }
  });

  it("follows the destination when it changes (a grown scratch buffer)", () => {
    const a = new Uint8Array(64);
    const b = new Uint8Array(new ArrayBuffer(128), 16, 64);
    assert.equal(writeUtf8(a, 0, "hello"), 5);
    assert.equal(writeUtf8(b, 3, "wörld"), 6);
    assert.deepEqual([...b.subarray(3, 9)], [...new TextEncoder().encode("wörld")]);
    assert.equal(new TextDecoder().decode(a.subarray(0, 5)), "hello");
  });
});

describe("prompt flattening through writeUtf8", () => {
  it("gives TextEncoder's bytes for prompts that grow the scratch memory part-way (ASCII and not)", async () => {
    const hasher = await createXxHasher();
    const enc = new TextEncoder();
    for (const size of [1000, 70_000, 300_000]) {
      const messages = [
        { role: "system", content: "x".repeat(size) },
        { role: "user", content: "héllo ✓ wörld 😀 ".repeat(size / 16) },
        { role: "assistant", content: "y".repeat(size / 3) },
      ];
      const req = { ...chat("r", "", ""), prompt: { kind: "chat" as const, messages } };
      const want = [...enc.encode(messages.map((m) => m.role + m.content).join(""))];
      const transient = transientPrompt(cycleFor(req, []), hasher).segments[0] as { bytes: Uint8Array };
      assert.ok(
        transient.bytes.length === want.length && [...transient.bytes].every((b, i) => b === want[i]),
      );
      const owned = flattenPrompt(req, hasher).segments[0] as { bytes: Uint8Array };
      assert.ok(owned.bytes.length === want.length && [...owned.bytes].every((b, i) => b === want[i]));
    }
  });
});
