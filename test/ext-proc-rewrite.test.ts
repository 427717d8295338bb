/**
 * The pure pieces of `kvgate epp`: InferenceModelRewrite precedence and weighted targets, the
 * streaming model-name restorer and usage scanner (any split of a response into chunks gives the
 * same result as the whole), and the 62,000-byte re-chunking.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { ModelRewrite } from "../src/datalayer/pool-resources.ts";
import { MAX_CHUNK_BYTES, rechunk } from "../src/gateway/ext-proc/messages.ts";
import { ModelNameRestorer, UsageScanner } from "../src/gateway/ext-proc/response-body.ts";
import { resolveModelRewrite } from "../src/gateway/model-rewrite.ts";
import { createRng } from "../src/scheduler/rng.ts";

const one = (model: string) => [{ model, weight: null }];
const rw = (name: string, createdAtMs: number, rules: ModelRewrite["rules"]): ModelRewrite => ({
  name,
  createdAtMs,
  rules,
});

test("rewrite precedence: exact beats generic anywhere, then the oldest resource, then the first rule", () => {
  const rng = () => 0.5;
  const generic = rw("generic", 1, [{ matches: [], targets: one("fallback") }]);
  const newer = rw("newer", 20, [{ matches: ["a"], targets: one("from-newer") }]);
  const older = rw("older", 10, [
    { matches: ["b"], targets: one("older-b") },
    { matches: ["a", "c"], targets: one("older-first") },
    { matches: ["a"], targets: one("older-second") },
  ]);
  assert.deepEqual(resolveModelRewrite([generic, newer, older], "a", rng), {
    rewriteName: "older",
    model: "a",
    target: "older-first",
  });
  assert.equal(resolveModelRewrite([generic, newer], "a", rng)?.target, "from-newer");
  assert.equal(resolveModelRewrite([generic, newer, older], "zzz", rng)?.target, "fallback");
  assert.equal(resolveModelRewrite([newer, older], "zzz", rng), null);
  assert.equal(resolveModelRewrite([], "a", rng), null);
  // Same age: the name breaks the tie, whatever the list order.
  const twin = rw("a-twin", 20, [{ matches: ["a"], targets: one("twin") }]);
  assert.equal(resolveModelRewrite([newer, twin], "a", rng)?.target, "twin");
  assert.equal(resolveModelRewrite([twin, newer], "a", rng)?.target, "twin");
});

test("rewrite targets are drawn by weight (uniform without weights) from the seeded rng", () => {
  const share = (targets: ModelRewrite["rules"][0]["targets"], n = 8000) => {
    const rng = createRng(42);
    const r = [rw("split", 1, [{ matches: ["m"], targets }])];
    let v2 = 0;
    for (let i = 0; i < n; i++) if (resolveModelRewrite(r, "m", () => rng.next())?.target === "v2") v2++;
    return v2 / n;
  };
  const weighted = share([
    { model: "v1", weight: 1 },
    { model: "v2", weight: 3 },
  ]);
  assert.ok(Math.abs(weighted - 0.75) < 0.03, `v2 share ${weighted}`);
  const uniform = share([
    { model: "v1", weight: null },
    { model: "v2", weight: null },
  ]);
  assert.ok(Math.abs(uniform - 0.5) < 0.03, `v2 share ${uniform}`);
  assert.equal(share([{ model: "v2", weight: 5 }], 10), 1);
});

/** Splits `buf` at the given cut points (sorted, deduplicated, within bounds). */
function split(buf: Buffer, cuts: number[]): Buffer[] {
  const at = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let prev = 0;
  for (const c of [...at, buf.length]) {
    out.push(buf.subarray(prev, c));
    prev = c;
  }
  return out;
}

test("the model-name restorer gives the same bytes however the response is chunked", () => {
  const piece = fc.constantFrom(
    '"model":"target/7b"',
    '"model": "target/7b"',
    '"model":"target/7bx"',
    '"model":"other"',
    '"model":',
    '"',
    "data: ",
    "\n\n",
    "é",
    "xyz",
  );
  fc.assert(
    fc.property(fc.array(piece, { maxLength: 30 }), fc.array(fc.nat(), { maxLength: 12 }), (pieces, cuts) => {
      const text = Buffer.from(pieces.join(""));
      const r = new ModelNameRestorer("target/7b", "friendly");
      const chunks = split(text, cuts);
      const out = Buffer.concat(chunks.map((c, i) => r.push(c, i === chunks.length - 1)));
      const expected = pieces
        .join("")
        .replaceAll('"model":"target/7b"', '"model":"friendly"')
        .replaceAll('"model": "target/7b"', '"model": "friendly"');
      assert.equal(out.toString(), expected);
    }),
  );
});

test("the usage scanner reads the last usage object however the stream is chunked", () => {
  const sse =
    'data: {"choices":[{"text":"a"}],"usage":null}\n\ndata: {"usage":{"prompt_tokens":1234,"completion_tokens":7}}\n\n' +
    'data: {"usage":{"prompt_tokens":1234,"total_tokens":1300,"completion_tokens":66}}\n\ndata: [DONE]\n\n';
  fc.assert(
    fc.property(fc.array(fc.nat(), { maxLength: 15 }), (cuts) => {
      const u = new UsageScanner();
      for (const c of split(Buffer.from(sse), cuts)) u.push(c);
      assert.deepEqual([u.promptTokens, u.completionTokens], [1234, 66]);
    }),
  );
});

test("re-chunking keeps every byte in order, in pieces of at most 62,000 bytes, as few as possible", () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 0, max: 200_000 }), { maxLength: 6 }), (sizes) => {
      const parts = sizes.map((n, i) => Buffer.alloc(n, i + 1));
      const out = rechunk(parts);
      const total = sizes.reduce((a, b) => a + b, 0);
      assert.ok(Buffer.concat(out).equals(Buffer.concat(parts)));
      for (const o of out) assert.ok(o.length <= MAX_CHUNK_BYTES);
      assert.equal(out.length, Math.max(1, Math.ceil(total / MAX_CHUNK_BYTES)));
    }),
    { numRuns: 60 },
  );
});
