/**
 * Benchmark metrics from per-request records, pure. Definitions (inference-perf docs/metrics.md,
 * vllm bench serve): TTFT = first non-empty chunk − send; E2E = end of stream − send;
 * TPOT = (E2E − TTFT)/(out − 1), only for out > 1; ITL is chunk-aware: a chunk carrying k tokens
 * Δt after the previous chunk contributes k gaps of Δt/k, and tokens that came in the first chunk
 * beyond the first token contribute gaps of 0, so the gaps sum to last − first token time and
 * number out − 1. Percentiles interpolate linearly between closest ranks (numpy's default,
 * Hyndman–Fan type 7). Times are workload seconds (simulated seconds under a time scale).
 */
import { meetsSlo, type Slo } from "./slo.ts";

export { meetsSlo, parseSlo, type Slo } from "./slo.ts";

export interface RequestError {
  /** e.g. "http_429", "http_503", "connect", "timeout", "stream", "incomplete", "cutoff". */
  kind: string;
  message: string;
  status?: number;
}

export interface RequestRecord {
  id: string;
  stage?: number;
  warmup?: boolean;
  /** Send time. */
  start: number;
  /** End of the response stream (or of the failure). */
  end: number;
  /**
   * Arrival time of each content chunk, ascending, and the output tokens it carried. Typed arrays
   * in the driver: a 17k-request sweep of 1,000-token answers is 17M chunks.
   */
  chunkTimes: ArrayLike<number>;
  chunkTokens: ArrayLike<number>;
  promptTokens: number;
  /** usage.completion_tokens, else the sum over chunks. */
  completionTokens: number;
  /** usage.prompt_tokens_details.cached_tokens when the server reports it. */
  cachedTokens?: number;
  error?: RequestError;
}

export interface RequestMetrics {
  ok: boolean;
  ttft?: number;
  tpot?: number;
  e2e?: number;
  /** Inter-token gaps (empty unless asked for). */
  itls: number[];
  tokensIn: number;
  tokensOut: number;
}

/** Calls `fn` with each chunk-aware inter-token gap of a successful request (out − 1 of them). */
export function forEachItl(r: RequestRecord, fn: (gap: number) => void): void {
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
export function requestMetrics(r: RequestRecord, withItls = true): RequestMetrics {
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
export function percentile(sorted: ArrayLike<number>, p: number): number | undefined {
  const n = sorted.length;
  if (n === 0) return undefined;
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be in [0, 100], got ${p}`);
  const h = ((n - 1) * p) / 100;
  const lo = Math.floor(h);
  const hi = Math.min(lo + 1, n - 1);
  return sorted[lo] + (h - lo) * (sorted[hi] - sorted[lo]);
}

export interface Summary {
  count: number;
  mean: number | null;
  p50: number | null;
  p90: number | null;
  p95: number | null;
  p99: number | null;
  max: number | null;
  /** [quantile, value] at CDF_QUANTILES (0 = min, 1 = max); empty when there are no values. */
  cdf: [number, number][];
}

/** Quantiles recorded for latency CDFs in results files. */
export const CDF_QUANTILES = [
  0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95,
  0.99, 0.999, 1,
];

export function summarize(values: ArrayLike<number>): Summary {
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
    cdf: s.length ? CDF_QUANTILES.map((x) => [x, percentile(s, x * 100) as number]) : [],
  };
}

export interface Goodput {
  slo: Slo;
  good: number;
  /** good / requests (failed requests count as not good). */
  fraction: number | null;
  requests_per_s: number | null;
  /** (input + output) tokens of good requests per second. */
  tokens_per_s: number | null;
}

export interface Aggregate {
  requests: number;
  completed: number;
  errors: number;
  errors_by_kind: Record<string, number>;
  /** From the first send to the last stream end of the measured requests. */
  window_s: number;
  requests_per_s: number | null;
  input_tokens: number;
  output_tokens: number;
  output_tokens_per_s: number | null;
  total_tokens_per_s: number | null;
  ttft: Summary;
  tpot: Summary;
  itl: Summary;
  e2e: Summary;
  goodput?: Goodput;
  /** Σ cached / Σ prompt tokens over successful requests that reported cached tokens; null if none did. */
  usage_cache_hit_rate: number | null;
  stages: StageAggregate[];
}

export interface AggregateOptions {
  slo?: Slo;
  /** Stages with their actual start times; warm-up stages are left out of the run figures. */
  stages?: StageWindowInput[];
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
export function aggregate(records: readonly RequestRecord[], opts: AggregateOptions = {}): Aggregate {
  const measured = records.filter((r) => !r.warmup);
  return {
    ...aggregateSet(measured, opts.slo),
    stages: stageAggregates(records, opts.stages ?? [], opts.slo),
  };
}

/** The figures of one set of requests (no stage breakdown). */
export function aggregateSet(records: readonly RequestRecord[], slo?: Slo): Omit<Aggregate, "stages"> {
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
export interface StageWindowInput {
  index: number;
  rate: number;
  duration: number;
  warmup: boolean;
  start: number;
}

export interface StageAggregate extends Omit<Aggregate, "stages"> {
  index: number;
  rate: number;
  duration_s: number;
  warmup: boolean;
  start_s: number;
  end_s: number;
  /** Requests sent in the stage / its nominal duration. */
  achieved_rate: number | null;
  /** Output tokens emitted over [start + p50 E2E, end) / its length: the stage without its ramp-up. */
  steady_output_tokens_per_s: number | null;
}

/**
 * Per stage: latency figures over the requests sent in the stage; throughput over the stage's
 * window [start, end), counting every token emitted in it (including the tail of earlier stages),
 * because stages shorter than a request's E2E never reach a steady state by request counting.
 * The window ends at the next stage's start (exclusive) or, if the stage's own requests all ended
 * before that, at the last of their stream ends (inclusive): a barriered stage ends when it
 * drains, not after the pause.
 */
export function stageAggregates(
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
  for (const r of records) if (!r.error) for (let i = 0; i < r.chunkTokens.length; i++) n += r.chunkTokens[i];
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
