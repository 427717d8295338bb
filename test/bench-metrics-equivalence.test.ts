/**
 * The aggregation's fast paths (gaps tallied per distinct value instead of sorted, stage and run
 * ITLs from one tally, token emission counted without sorting) against the implementation they
 * replaced, kept below verbatim as the oracle: identical results, compared with deepStrictEqual
 * (so −0 ≠ 0 and every low bit counts), on seeded random record sets — quantised times (the tally
 * path), continuous ones (the sort fallback), NaN and −0 gaps (the old-way fallback), zero-token
 * chunks, errors, warm-up, records without a stage, stage starts on chunk times, and SLOs.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  type Aggregate,
  type AggregateOptions,
  aggregate,
  aggregateSet,
  meetsSlo,
  type RequestMetrics,
  type RequestRecord,
  type Slo,
  type StageAggregate,
  type StageWindowInput,
  type Summary,
  stageAggregates,
} from "../src/bench/metrics.ts";
import { rng } from "./helpers/rng.ts";

/** src/bench/metrics.ts as it was before the fast paths (aggregation part, unchanged). */
const oracle = (() => {
  /** Calls `fn` with each chunk-aware inter-token gap of a successful request (out − 1 of them). */
  function forEachItl(r: RequestRecord, fn: (gap: number) => void): void {
    if (r.error) return;
    const { chunkTimes: ts, chunkTokens: ks } = r;
    let prev = -1;
    for (let i = 0; i < ts.length; i++) {
      const k = ks[i];
      if (k <= 0) continue;
      const gap = prev < 0 ? 0 : (ts[i] - ts[prev]) / k;
      for (let j = prev < 0 ? 1 : 0; j < k; j++) fn(gap);
      prev = i;
    }
  }

  /** TTFT, TPOT, E2E and token counts of one request; `withItls` also lists its gaps. */
  function requestMetrics(r: RequestRecord, withItls = true): RequestMetrics {
    const ok = r.error === undefined;
    const tokensOut = r.completionTokens;
    const m: RequestMetrics = { ok, itls: [], tokensIn: r.promptTokens, tokensOut };
    if (!ok) return m;
    m.e2e = r.end - r.start;
    let first = -1;
    for (let i = 0; i < r.chunkTimes.length && first < 0; i++) if (r.chunkTokens[i] > 0) first = i;
    if (first < 0) return m;
    m.ttft = r.chunkTimes[first] - r.start;
    if (withItls) forEachItl(r, (g) => m.itls.push(g));
    if (tokensOut > 1) m.tpot = (m.e2e - m.ttft) / (tokensOut - 1);
    return m;
  }

  /** p-th percentile (0–100) of ascending `sorted` by linear interpolation; undefined if empty. */
  function percentile(sorted: ArrayLike<number>, p: number): number | undefined {
    const n = sorted.length;
    if (n === 0) return undefined;
    if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be in [0, 100], got ${p}`);
    const h = ((n - 1) * p) / 100;
    const lo = Math.floor(h);
    const hi = Math.min(lo + 1, n - 1);
    return sorted[lo] + (h - lo) * (sorted[hi] - sorted[lo]);
  }

  /** Quantiles recorded for latency CDFs in results files. */
  const OLD_CDF_QUANTILES = [
    0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9,
    0.95, 0.99, 0.999, 1,
  ];

  function summarize(values: ArrayLike<number>): Summary {
    const s = Float64Array.from(values).sort();
    const q = (p: number) => percentile(s, p) ?? null;
    let sum = 0;
    for (let i = 0; i < s.length; i++) sum += s[i];
    return {
      count: s.length,
      mean: s.length ? sum / s.length : null,
      p50: q(50),
      p90: q(90),
      p95: q(95),
      p99: q(99),
      max: s.length ? s[s.length - 1] : null,
      cdf: s.length ? OLD_CDF_QUANTILES.map((x) => [x, percentile(s, x * 100) as number]) : [],
    };
  }

  const rate = (x: number, w: number) => (w > 0 ? x / w : null);

  /** Every inter-token gap of the successful requests, in one typed array. */
  function allItls(records: readonly RequestRecord[]): Float64Array {
    let n = 0;
    for (const r of records) forEachItl(r, () => n++);
    const out = new Float64Array(n);
    let k = 0;
    for (const r of records) forEachItl(r, (g) => (out[k++] = g));
    return out;
  }

  /** Run figures over `records` (warm-up requests excluded) plus one entry per stage. */
  function aggregate(records: readonly RequestRecord[], opts: AggregateOptions = {}): Aggregate {
    const measured = records.filter((r) => !r.warmup);
    return {
      ...aggregateSet(measured, opts.slo),
      stages: stageAggregates(records, opts.stages ?? [], opts.slo),
    };
  }

  /** The figures of one set of requests (no stage breakdown). */
  function aggregateSet(records: readonly RequestRecord[], slo?: Slo): Omit<Aggregate, "stages"> {
    const ms = records.map((r) => requestMetrics(r, false));
    const ok = ms.filter((m) => m.ok);
    const errorsByKind: Record<string, number> = {};
    for (const r of records) if (r.error) errorsByKind[r.error.kind] = (errorsByKind[r.error.kind] ?? 0) + 1;
    let first = Number.POSITIVE_INFINITY;
    let last = Number.NEGATIVE_INFINITY;
    for (const r of records) {
      first = Math.min(first, r.start);
      last = Math.max(last, r.end);
    }
    const window = records.length ? Math.max(0, last - first) : 0;
    const inTok = ok.reduce((a, m) => a + m.tokensIn, 0);
    const outTok = ok.reduce((a, m) => a + m.tokensOut, 0);
    let cached = 0;
    let cachedPrompt = 0;
    for (const r of records)
      if (!r.error && r.cachedTokens !== undefined) {
        cached += r.cachedTokens;
        cachedPrompt += r.promptTokens;
      }
    const out: Omit<Aggregate, "stages"> = {
      requests: records.length,
      completed: ok.length,
      errors: records.length - ok.length,
      errors_by_kind: errorsByKind,
      window_s: window,
      requests_per_s: rate(ok.length, window),
      input_tokens: inTok,
      output_tokens: outTok,
      output_tokens_per_s: rate(outTok, window),
      total_tokens_per_s: rate(inTok + outTok, window),
      ttft: summarize(ok.flatMap((m) => (m.ttft === undefined ? [] : [m.ttft]))),
      tpot: summarize(ok.flatMap((m) => (m.tpot === undefined ? [] : [m.tpot]))),
      itl: summarize(allItls(records)),
      e2e: summarize(ok.flatMap((m) => (m.e2e === undefined ? [] : [m.e2e]))),
      usage_cache_hit_rate: cachedPrompt > 0 ? cached / cachedPrompt : null,
    };
    if (slo) {
      const good = ms.filter((m) => meetsSlo(m, slo));
      const goodTokens = good.reduce((a, m) => a + m.tokensIn + m.tokensOut, 0);
      out.goodput = {
        slo,
        good: good.length,
        fraction: records.length ? good.length / records.length : null,
        requests_per_s: rate(good.length, window),
        tokens_per_s: rate(goodTokens, window),
      };
    }
    return out;
  }

  /** A stage as run: its actual start (the barrier may have delayed it). */

  /**
   * Per stage: latency figures over the requests sent in the stage; throughput over the stage's
   * window [start, end), counting every token emitted in it (including the tail of earlier stages),
   * because stages shorter than a request's E2E never reach a steady state by request counting.
   * The window ends at the next stage's start (exclusive) or, if the stage's own requests all ended
   * before that, at the last of their stream ends (inclusive): a barriered stage ends when it
   * drains, not after the pause.
   */
  function stageAggregates(
    records: readonly RequestRecord[],
    stages: readonly StageWindowInput[],
    slo?: Slo,
  ): StageAggregate[] {
    const sorted = [...stages].sort((a, b) => a.start - b.start);
    const tokenTimes = sorted.length ? emissionTimes(records) : new Float64Array(0);
    return sorted.map((st, k) => {
      const own = records.filter((r) => r.stage === st.index);
      const lastEnd = own.reduce((a, r) => Math.max(a, r.end), st.start);
      const next = sorted[k + 1]?.start;
      // Cut by the next stage: [start, next). Ending with its own last request: [start, lastEnd].
      const cut = next !== undefined && next <= lastEnd;
      const end = cut ? next : lastEnd;
      const inWindow = (t: number) => t >= st.start && (cut ? t < end : t <= end);
      const base = aggregateSet(own, slo);
      const window = end - st.start;
      const upper = cut ? lowerBound(tokenTimes, end) : upperBound(tokenTimes, end);
      const emitted = (from: number) => upper - lowerBound(tokenTimes, from);
      const out = emitted(st.start);
      let sentIn = 0;
      let doneIn = 0;
      for (const r of records) {
        if (r.error) continue;
        if (inWindow(r.start)) sentIn += r.promptTokens;
        if (inWindow(r.end)) doneIn++;
      }
      const skip = base.e2e.p50 ?? 0;
      return {
        ...base,
        index: st.index,
        rate: st.rate,
        duration_s: st.duration,
        warmup: st.warmup,
        start_s: st.start,
        end_s: end,
        window_s: window,
        requests_per_s: rate(doneIn, window),
        output_tokens_per_s: rate(out, window),
        total_tokens_per_s: rate(out + sentIn, window),
        achieved_rate: rate(own.length, st.duration),
        steady_output_tokens_per_s: skip < window ? rate(emitted(st.start + skip), window - skip) : null,
      };
    });
  }

  /** One entry per output token of the successful requests: the time its chunk arrived, ascending. */
  function emissionTimes(records: readonly RequestRecord[]): Float64Array {
    let n = 0;
    for (const r of records)
      if (!r.error) for (let i = 0; i < r.chunkTokens.length; i++) n += r.chunkTokens[i];
    const out = new Float64Array(n);
    let k = 0;
    for (const r of records)
      if (!r.error)
        for (let i = 0; i < r.chunkTimes.length; i++)
          for (let j = 0; j < r.chunkTokens[i]; j++) out[k++] = r.chunkTimes[i];
    return out.sort();
  }

  /** Index of the first element ≥ x in ascending `a`. */
  function lowerBound(a: Float64Array, x: number): number {
    let lo = 0;
    let hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (a[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** Index of the first element > x in ascending `a`. */
  function upperBound(a: Float64Array, x: number): number {
    let lo = 0;
    let hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (a[mid] <= x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  return { aggregate, aggregateSet, stageAggregates };
})();

type Mode = "quantised" | "continuous" | "odd";

interface Case {
  records: RequestRecord[];
  opts: AggregateOptions;
}

/** A random run: `mode` picks the time grid; "odd" plants a NaN or −0 gap somewhere. */
function randomCase(seed: number, mode: Mode, size: number, maxStages = 5): Case {
  const r = rng(seed);
  const int = (n: number) => Math.floor(r() * n);
  const grid = mode === "continuous" ? 0 : [0.001, 0.025, 0.1][int(3)];
  const q = (t: number) => (grid === 0 ? t : Math.round(t / grid) * grid);
  const numStages = 1 + int(maxStages);
  const records: RequestRecord[] = [];
  const times: number[] = [];
  const n = int(size) + (size > 100 ? size / 2 : 0);
  for (let i = 0; i < n; i++) {
    const stage = r() < 0.1 ? undefined : int(numStages);
    const start = q(r() * 20);
    const chunks = int(r() < 0.2 ? 3 : 40);
    const ct: number[] = [];
    const ck: number[] = [];
    let t = start + q(r() * 0.5);
    for (let c = 0; c < chunks; c++) {
      t += r() < 0.1 ? 0 : q(0.005 + r() * 0.1);
      ct.push(t);
      ck.push(r() < 0.1 ? 0 : r() < 0.8 ? 1 : 1 + int(4));
      times.push(t);
    }
    const out = ck.reduce((a, b) => a + b, 0);
    const failed = r() < 0.1;
    records.push({
      id: `r${i}`,
      ...(stage !== undefined ? { stage } : {}),
      ...(stage === 0 && r() < 0.7 ? { warmup: true } : r() < 0.03 ? { warmup: false } : {}),
      start,
      end: chunks > 0 ? t + q(r() * 0.01) : start + r(),
      chunkTimes: r() < 0.5 ? Float64Array.from(ct) : ct,
      chunkTokens: r() < 0.5 ? Uint8Array.from(ck) : ck,
      promptTokens: 1 + int(5000),
      completionTokens: r() < 0.9 ? out : out + int(3),
      ...(r() < 0.7 ? { cachedTokens: int(3000) } : {}),
      ...(failed ? { error: { kind: r() < 0.5 ? "http_503" : "stream", message: "x" } } : {}),
    });
  }
  if (mode === "odd" && records.length > 0) {
    const rec = records[int(records.length)];
    const ct = Array.from(rec.chunkTimes);
    const ck = Array.from(rec.chunkTokens);
    if (r() < 0.5) {
      // A NaN chunk time: NaN gaps, and a token time that sorts last.
      ct.splice(0, 0, 0.5, Number.NaN);
      ck.splice(0, 0, 1, 1);
    } else {
      // 0 then −0: the gap (−0 − 0)/1 is −0.
      ct.splice(0, 0, 0, -0);
      ck.splice(0, 0, 1, 1);
    }
    rec.chunkTimes = ct;
    rec.chunkTokens = ck;
    delete rec.error;
  }
  // Stage windows: starts ascending-ish (shuffled below), some exactly on chunk times.
  const stages: StageWindowInput[] = [];
  let at = 0;
  for (let s = 0; s < numStages; s++) {
    if (r() < 0.1) continue;
    at = r() < 0.4 && times.length > 0 ? times[int(times.length)] : at + q(r() * 6);
    stages.push({ index: s, rate: 1 + int(20), duration: 1 + int(30), warmup: s === 0, start: at });
  }
  stages.sort(() => (r() < 0.5 ? -1 : 1));
  const slos: (Slo | undefined)[] = [undefined, { ttft: 0.3 }, { tpot: 0.05, e2e: 2 }];
  return { records, opts: { stages, slo: slos[int(3)] } };
}

function check(c: Case, label: string): void {
  const got = aggregate(c.records, c.opts);
  const want = oracle.aggregate(c.records, c.opts);
  assert.deepStrictEqual(got, want, `aggregate ${label}`);
  assert.deepStrictEqual(
    aggregateSet(c.records, c.opts.slo),
    oracle.aggregateSet(c.records, c.opts.slo),
    label,
  );
  const st = c.opts.stages ?? [];
  assert.deepStrictEqual(
    stageAggregates(c.records, st, c.opts.slo),
    oracle.stageAggregates(c.records, st, c.opts.slo),
  );
}

describe("aggregation fast paths equal the old implementation", () => {
  test("quantised times (tallied gaps), 300 random runs", () => {
    for (let seed = 1; seed <= 300; seed++) check(randomCase(seed, "quantised", 60), `seed ${seed}`);
  });

  test("continuous times (mostly distinct gaps), 300 random runs", () => {
    for (let seed = 1; seed <= 300; seed++) check(randomCase(1000 + seed, "continuous", 60), `seed ${seed}`);
  });

  test("NaN and −0 gaps fall back to the old way with the same results", () => {
    for (let seed = 1; seed <= 200; seed++) check(randomCase(2000 + seed, "odd", 30), `seed ${seed}`);
  });

  test("large runs: past the distinct-value limit (sorted) and well under it (tallied)", () => {
    for (let seed = 1; seed <= 4; seed++) {
      // One stage: ~10,000 gaps in its larger group, nearly all distinct (> 4,096 and > an eighth).
      check(randomCase(3000 + seed, "continuous", 1000, 1), `continuous ${seed}`);
      check(randomCase(4000 + seed, "quantised", 1000, 1), `quantised ${seed}`);
    }
  });

  test("edge sets: empty, no stages, all failed, single gap values", () => {
    check({ records: [], opts: {} }, "empty");
    check(
      { records: [], opts: { stages: [{ index: 0, rate: 1, duration: 1, warmup: false, start: 0 }] } },
      "no records",
    );
    const c = randomCase(5, "quantised", 40);
    check({ records: c.records, opts: {} }, "no stages");
    check(
      { records: c.records.map((r) => ({ ...r, error: { kind: "x", message: "" } })), opts: c.opts },
      "failed",
    );
    const same = Array.from({ length: 50 }, (_, i) => ({
      id: `s${i}`,
      stage: i % 2,
      start: 0,
      end: 2,
      chunkTimes: [0.5, 1, 1.5, 2],
      chunkTokens: [3, 1, 0, 2],
      promptTokens: 10,
      completionTokens: 6,
    }));
    check(
      {
        records: same,
        opts: {
          stages: [
            { index: 0, rate: 1, duration: 1, warmup: false, start: 0 },
            { index: 1, rate: 1, duration: 1, warmup: false, start: 1 },
          ],
        },
      },
      "same",
    );
  });
});
