// Trace replay: JSONL parsing and writing round trips, prefix sharing synthesized from prefix
// groups and from block hashes, and line-numbered errors.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import {
  parseTraceJsonl,
  TRACE_DEFAULTS,
  TraceParseError,
  type TraceRecord,
  traceRequests,
  traceToJsonl,
  workloadToTrace,
} from "../src/bench/workloads/trace.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";

const tok = createSimTokenizer();
const ids = (s: string) => tok.encode(s, false);
const commonPrefix = (a: number[], b: number[]) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
};

describe("trace JSONL", () => {
  const records: TraceRecord[] = [
    { arrival_time: 0, input_length: 300, output_length: 10, prefix_group: 1, prefix_length: 200 },
    { arrival_time: 0.5, input_length: 250, output_length: 5, prefix_group: 1, prefix_length: 200 },
    { arrival_time: 0.75, input_length: 64, output_length: 1, block_hashes: [7, 8, 9, 10] },
    { arrival_time: 2, input_length: 40, output_length: 3 },
  ];

  test("write then parse gives the same records", () => {
    const text = traceToJsonl(records);
    assert.equal(text.split("\n").length, 5);
    assert.deepEqual(parseTraceJsonl(text), records);
    assert.equal(traceToJsonl(parseTraceJsonl(text)), text);
  });

  test("comments, blank lines and unknown fields are tolerated", () => {
    const parsed = parseTraceJsonl(
      '# header\n\n{"arrival_time":1,"input_length":5,"output_length":2,"x":1}\n',
    );
    assert.deepEqual(parsed, [{ arrival_time: 1, input_length: 5, output_length: 2 }]);
  });

  test("bad lines fail with their line number", () => {
    assert.throws(
      () => parseTraceJsonl('{"arrival_time":0,"input_length":5,"output_length":1}\n{"arrival_time":0}\n'),
      (e: unknown) => e instanceof TraceParseError && e.line === 2,
    );
    assert.throws(() => parseTraceJsonl("{oops\n"), /line 1: invalid JSON/);
    assert.throws(
      () => parseTraceJsonl('{"arrival_time":0,"input_length":5,"output_length":1,"prefix_length":9}'),
      /prefix_length exceeds/,
    );
  });

  test("a generated workload survives workload → trace → workload (times, lengths, groups, shared prefixes)", () => {
    const w = generateWorkload({ preset: "smoke" });
    const text = traceToJsonl(workloadToTrace(w));
    const back = generateWorkload({ workload: "trace", seed: 9 }, { traceText: text });
    assert.equal(back.requests.length, w.requests.length);
    for (const [i, r] of back.requests.entries()) {
      const o = w.requests[i];
      assert.equal(r.arrivalTime, o.arrivalTime);
      assert.equal(r.promptTokensApprox, o.promptTokensApprox);
      assert.equal(r.maxTokens, o.maxTokens);
      assert.equal(r.groupId, o.groupId);
      assert.equal(r.prefixTokens, 200);
      assert.ok(Math.abs(ids(r.prompt!).length - r.promptTokensApprox) <= 1);
    }
    const g = back.requests.filter((r) => r.groupId === 0).map((r) => ids(r.prompt!));
    const h = back.requests.filter((r) => r.groupId === 1).map((r) => ids(r.prompt!));
    assert.ok(commonPrefix(g[0], g[1]) >= 199, "same group shares its 200-token prefix");
    assert.ok(commonPrefix(g[0], h[0]) < 5, "different groups do not");
  });
});

describe("text synthesized from a trace", () => {
  test("prefix groups share prefix_length tokens; the default prefix is half the group's shortest input", () => {
    const reqs = traceRequests(
      [
        { arrival_time: 0, input_length: 100, output_length: 1, prefix_group: "a" },
        { arrival_time: 1, input_length: 80, output_length: 1, prefix_group: "a" },
        { arrival_time: 2, input_length: 80, output_length: 1, prefix_group: "b" },
      ],
      TRACE_DEFAULTS,
      1,
    );
    const [a1, a2, b] = reqs.map((r) => ids(r.body.prompt!));
    assert.equal(a1.length, 100);
    const shared = commonPrefix(a1, a2);
    assert.ok(shared >= 39 && shared <= 41, `shared ${shared}`);
    assert.ok(commonPrefix(a1, b) < 40);
    assert.deepEqual(
      reqs.map((r) => r.time),
      [0, 1, 2],
    );
  });

  test("block hashes: text is shared exactly as far as the leading hashes agree", () => {
    const bs = 16;
    const reqs = traceRequests(
      [
        { arrival_time: 0, input_length: 64, output_length: 1, block_hashes: [1, 2, 3, 4] },
        { arrival_time: 0, input_length: 64, output_length: 1, block_hashes: [1, 2, 5, 6] },
        { arrival_time: 0, input_length: 40, output_length: 1, block_hashes: [1, 2, 3] },
        { arrival_time: 0, input_length: 64, output_length: 1, block_hashes: [9, 2, 3, 4] },
      ],
      { ...TRACE_DEFAULTS, blockSize: bs, speedup: 2 },
      5,
    );
    const t = reqs.map((r) => ids(r.body.prompt!));
    assert.ok(commonPrefix(t[0], t[1]) >= 2 * bs - 1 && commonPrefix(t[0], t[1]) < 3 * bs);
    assert.ok(commonPrefix(t[0], t[2]) >= 40 - 1, "the shorter prompt is a prefix (truncated last block)");
    assert.ok(commonPrefix(t[0], t[3]) < bs, "a different first block shares nothing");
    assert.equal(t[2].length, 40);
    assert.ok(reqs.every((r) => r.time === 0));
  });

  test("same seed, same text; another seed, other text", () => {
    const rec: TraceRecord[] = [{ arrival_time: 0, input_length: 50, output_length: 1, prefix_group: 3 }];
    const a = traceRequests(rec, TRACE_DEFAULTS, 1)[0].body.prompt;
    assert.equal(traceRequests(rec, TRACE_DEFAULTS, 1)[0].body.prompt, a);
    assert.notEqual(traceRequests(rec, TRACE_DEFAULTS, 2)[0].body.prompt, a);
  });
});
