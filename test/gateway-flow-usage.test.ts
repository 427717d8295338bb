// The gateway's usage watch counts SSE data events (the output-token fallback for streams without
// a usage block) and reads the usage block, on every write of every watched response.
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { UsageScanner } from "../src/gateway/ext-proc/response-body.ts";
import { dataEvents } from "../src/gateway/flow-usage.ts";

const line = fc.constantFrom(
  'data: {"choices":[{"text":"a"}]}\n\n',
  'data:{"choices":[]}\n\n',
  "data: [DONE]\n\n",
  "data:[DONE]\n\n",
  ": keep-alive\n\n",
  "event: x\ndata: y\n\n",
  "xdata: not a line start\n",
  "data: ",
  "\n",
);

test("dataEvents counts data lines other than [DONE], with or without the space", () => {
  assert.equal(dataEvents("data: [DONE]\n\n"), 0);
  assert.equal(dataEvents("data:[DONE]\n\n"), 0);
  assert.equal(dataEvents('data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n'), 2);
  assert.equal(dataEvents("xdata: 1\n"), 0);
  fc.assert(
    fc.property(fc.array(fc.oneof(line, fc.string({ maxLength: 8 })), { maxLength: 20 }), (parts) => {
      const text = parts.join("");
      const expected = text.match(/(^|\n)data:(?! ?\[DONE\])/g)?.length ?? 0;
      assert.equal(dataEvents(text), expected);
    }),
    { numRuns: 500, seed: 7 },
  );
});

test("the usage scanner skipping chunks without '_tokens' reads what scanning every chunk reads", () => {
  const usage = fc
    .tuple(fc.nat(99_999), fc.nat(99_999))
    .map(
      ([p, c]) =>
        `data: {"usage":{"prompt_tokens":${p},"total_tokens":${p + c},"completion_tokens":${c}}}\n\n`,
    );
  fc.assert(
    fc.property(
      fc.array(fc.oneof(line, usage), { maxLength: 12 }),
      fc.array(fc.nat(), { maxLength: 8 }),
      (evs, cuts) => {
        const all = evs.join("");
        const u = new UsageScanner();
        let at = 0;
        for (const c of cuts) {
          const end = Math.min(all.length, at + (c % 61));
          u.pushText(all.slice(at, end));
          at = end;
        }
        u.pushText(all.slice(at));
        const last = (k: string) => {
          const m = [...all.matchAll(new RegExp(`"${k}_tokens"\\s*:\\s*(\\d+)`, "g"))];
          return m.length === 0 ? null : Number(m[m.length - 1][1]);
        };
        assert.deepEqual([u.promptTokens, u.completionTokens], [last("prompt"), last("completion")]);
      },
    ),
    { numRuns: 400, seed: 3 },
  );
});
