// Metric aggregation against hand-computed values: percentiles, TPOT, chunk-aware ITL, token
// distribution over chunks, goodput, run and per-stage windows; and the results-file schema.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  aggregate,
  parseSlo,
  percentile,
  type RequestRecord,
  requestMetrics,
  summarize,
} from "../src/bench/metrics.ts";
import { parseResultsFile, ResultsFileError, resultsFile, runResult } from "../src/bench/results.ts";
import { distributeTokens } from "../src/bench/sse.ts";

/** Chunk arrival times and token counts from [time, tokens] pairs. */
const ch = (...pairs: Array<[number, number]>) => ({
  chunkTimes: pairs.map((p) => p[0]),
  chunkTokens: pairs.map((p) => p[1]),
});
const close = (a: number | null | undefined, b: number, eps = 1e-9) =>
  assert.ok(a !== null && a !== undefined && Math.abs(a - b) <= eps, `${a} ≠ ${b}`);

describe("percentiles (linear interpolation between closest ranks, numpy's default)", () => {
  test("hand-computed values", () => {
    const s = [1, 2, 3, 4];
    close(percentile(s, 0), 1);
    close(percentile(s, 50), 2.5); // h = 1.5
    close(percentile(s, 90), 3.7); // h = 2.7
    close(percentile(s, 99), 3.97); // h = 2.97
    close(percentile(s, 100), 4);
    close(percentile([5], 99), 5);
    assert.equal(percentile([], 50), undefined);
    const ten = Array.from({ length: 10 }, (_, i) => (i + 1) * 10); // 10..100
    close(percentile(ten, 90), 91); // h = 8.1 → 90 + 0.1·10
    assert.throws(() => percentile(s, 101), /^RangeError: percentile must be in \[0, 100\], got 101$/);
  });

  test("summarize sorts its input and reports mean and max", () => {
    const sm = summarize([4, 1, 3, 2]);
    assert.equal(sm.count, 4);
    close(sm.mean, 2.5);
    close(sm.p50, 2.5);
    assert.equal(sm.max, 4);
    assert.deepEqual(summarize([]), {
      count: 0,
      mean: null,
      p50: null,
      p90: null,
      p95: null,
      p99: null,
      max: null,
      cdf: [],
    });
    const cdf = new Map(sm.cdf);
    assert.equal(cdf.get(0), 1, "quantile 0 is the minimum");
    assert.equal(cdf.get(1), 4, "quantile 1 is the maximum");
    close(cdf.get(0.5) ?? null, 2.5);
    close(cdf.get(0.9) ?? null, 3.7);
  });
});

describe("per-request metrics", () => {
  const base: RequestRecord = {
    id: "a",
    start: 10,
    end: 11.4,
    ...ch([10.5, 1], [10.7, 1], [11.3, 2]),
    promptTokens: 100,
    completionTokens: 4,
  };

  test("TTFT, E2E, TPOT = (E2E − TTFT)/(out − 1), chunk-aware ITL", () => {
    const m = requestMetrics(base);
    close(m.ttft, 0.5);
    close(m.e2e, 1.4);
    close(m.tpot, 0.9 / 3);
    assert.equal(m.itls.length, 3);
    close(m.itls[0], 0.2);
    close(m.itls[1], 0.3); // a 2-token chunk 0.6 s after the previous one: two gaps of 0.3
    close(m.itls[2], 0.3);
  });

  test("tokens beyond the first in the first chunk give zero gaps; gaps sum to last − first token", () => {
    const m = requestMetrics({
      ...base,
      ...ch([10.5, 3], [11, 1]),
      completionTokens: 4,
    });
    assert.equal(m.itls.length, 3);
    assert.deepEqual(m.itls.slice(0, 2), [0, 0]);
    close(
      m.itls.reduce((a, b) => a + b, 0),
      0.5,
    );
  });

  test("one output token: no TPOT; empty chunks are not a first token; failures have no latency", () => {
    const one = requestMetrics({
      ...base,
      ...ch([10.2, 0], [10.5, 1]),
      completionTokens: 1,
    });
    close(one.ttft, 0.5);
    assert.equal(one.tpot, undefined);
    const failed = requestMetrics({ ...base, error: { kind: "http_429", message: "" } });
    assert.equal(failed.ok, false);
    assert.equal(failed.ttft, undefined);
    assert.equal(failed.e2e, undefined);
  });

  test("distributeTokens: one per chunk, the rest by text length (largest remainder)", () => {
    assert.deepEqual(distributeTokens([3, 1, 4], 10), [4, 2, 4]);
    assert.deepEqual(distributeTokens([2, 2], 2), [1, 1]);
    assert.deepEqual(distributeTokens([1, 1, 1], 2), [1, 1, 0]);
    assert.deepEqual(distributeTokens([5, 5], undefined), [1, 1]);
    assert.deepEqual(distributeTokens([0, 0, 0], 7), [3, 2, 2]);
    assert.deepEqual(distributeTokens([], 5), []);
  });
});

describe("aggregate", () => {
  const records: RequestRecord[] = [
    {
      id: "r0",
      stage: 0,
      start: 0,
      end: 3,
      ...ch([1, 1], [2, 1], [3, 1]),
      promptTokens: 100,
      completionTokens: 3,
      cachedTokens: 50,
    },
    {
      id: "r1",
      stage: 0,
      start: 1,
      end: 4,
      ...ch([2, 1], [4, 2]),
      promptTokens: 100,
      completionTokens: 3,
      cachedTokens: 0,
    },
    {
      id: "r2",
      stage: 1,
      start: 5,
      end: 6,
      ...ch([6, 1]),
      promptTokens: 50,
      completionTokens: 1,
    },
    {
      id: "r3",
      stage: 1,
      start: 6,
      end: 6,
      ...ch(),
      promptTokens: 50,
      completionTokens: 0,
      error: { kind: "http_429", status: 429, message: "busy" },
    },
  ];
  const stages = [
    { index: 0, rate: 0.4, duration: 5, warmup: false, start: 0 },
    { index: 1, rate: 0.4, duration: 5, warmup: false, start: 5 },
  ];

  test("run figures over the window from first send to last stream end", () => {
    const a = aggregate(records, { stages, slo: { ttft: 1 } });
    assert.equal(a.requests, 4);
    assert.equal(a.completed, 3);
    assert.equal(a.errors, 1);
    assert.deepEqual(a.errors_by_kind, { http_429: 1 });
    assert.equal(a.window_s, 6);
    close(a.requests_per_s, 0.5);
    assert.equal(a.input_tokens, 250);
    assert.equal(a.output_tokens, 7);
    close(a.output_tokens_per_s, 7 / 6);
    close(a.total_tokens_per_s, 257 / 6);
    close(a.ttft.p50, 1);
    close(a.e2e.p50, 3);
    close(a.e2e.p90, 3);
    close(a.e2e.mean, 7 / 3);
    close(a.tpot.p50, 1);
    assert.equal(a.tpot.count, 2, "the 1-token request has no TPOT");
    assert.equal(a.itl.count, 4);
    close(a.itl.p99, 1);
    close(a.usage_cache_hit_rate, 0.25);
    assert.equal(a.goodput?.good, 3);
    close(a.goodput?.fraction, 0.75);
  });

  test("per stage: latency over the stage's requests, throughput over its window", () => {
    const [s0, s1] = aggregate(records, { stages }).stages;
    assert.equal(s0.end_s, 4, "stage 0 ends when its last request ends, before stage 1 starts");
    close(s0.output_tokens_per_s, 6 / 4);
    close(s0.requests_per_s, 2 / 4);
    close(s0.total_tokens_per_s, (6 + 200) / 4);
    close(s0.achieved_rate, 0.4);
    close(s0.steady_output_tokens_per_s, 3 / 1); // skip p50 E2E = 3 s: tokens in [3, 4]
    assert.equal(s0.requests, 2);
    assert.equal(s1.requests, 2);
    assert.equal(s1.errors, 1);
    assert.equal(s1.end_s, 6);
    close(s1.output_tokens_per_s, 1);
  });

  test("a stage cut by the next one counts tokens emitted before the next start only", () => {
    const [s0] = aggregate(records, { stages: [{ ...stages[0] }, { ...stages[1], start: 2.5 }] }).stages;
    assert.equal(s0.end_s, 2.5);
    close(s0.output_tokens_per_s, 3 / 2.5); // r0@1, r0@2, r1@2
  });

  test("goodput needs TTFT and TPOT under their SLOs; failures are never good", () => {
    const recs: RequestRecord[] = [
      { ...records[0], id: "a" }, // ttft 1, tpot 1
      {
        ...records[0],
        id: "b",
        ...ch([0.1, 1], [0.2, 2]),
        end: 0.3,
      }, // ttft .1 tpot .1
      { ...records[0], id: "c", ...ch([2.5, 3]), end: 2.6 }, // ttft 2.5
      records[3],
    ];
    const g = aggregate(recs, { slo: parseSlo("ttft=2, tpot=0.5") }).goodput!;
    assert.equal(g.good, 1);
    close(g.fraction, 0.25);
    close(g.requests_per_s, 1 / 6);
    assert.deepEqual(parseSlo("ttft=500ms,e2e=3"), { ttft: 0.5, e2e: 3 });
    assert.throws(() => parseSlo("itl=1"), /bad SLO/);
    assert.throws(() => parseSlo("ttft=-1"), /bad SLO/);
  });

  test("warm-up requests are left out of the run figures but keep their stage", () => {
    const a = aggregate(
      records.map((r) => (r.stage === 0 ? { ...r, warmup: true } : r)),
      { stages: [{ ...stages[0], warmup: true }, stages[1]] },
    );
    assert.equal(a.requests, 2);
    assert.equal(a.stages[0].requests, 2);
    assert.equal(a.stages[0].warmup, true);
  });
});

describe("results file", () => {
  test("a run built from an aggregate validates, and bad files are rejected with the path", () => {
    const agg = aggregate(
      [{ id: "x", start: 0, end: 2, ...ch([1, 2]), promptTokens: 10, completionTokens: 2 }],
      {},
    );
    const run = runResult(agg, {
      router: "rr",
      workload: { workload: "random", seed: 1 },
      timeScale: 10,
      notSent: 0,
    });
    assert.equal(run.prefix_cache_hit_rate, null);
    assert.equal(run.prefix_cache_hit_rate_source, null);
    assert.equal(run.tpot_p50_s, 1);
    const file = resultsFile([run], {
      kvgateVersion: "0.1.0",
      created: "2026-01-01T00:00:00Z",
      simulated: true,
    });
    assert.equal(file.time_unit, "simulated_seconds");
    const back = parseResultsFile(JSON.stringify(file));
    assert.deepEqual(back, JSON.parse(JSON.stringify(file)));
    const broken = JSON.parse(JSON.stringify(file));
    delete broken.runs[0].ttft_p50_s;
    assert.throws(
      () => parseResultsFile(JSON.stringify(broken)),
      (e: unknown) => {
        return e instanceof ResultsFileError && /runs\.0\.ttft_p50_s/.test(e.message);
      },
    );
    assert.throws(() => parseResultsFile("{"), /not JSON/);
  });
});
