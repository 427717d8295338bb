/**
 * Benchmark figures from per-request records, pure: the run's aggregate (counts, throughput,
 * latency summaries, goodput) and one per stage. The per-request definitions are in
 * request-metrics.ts, the percentile and summary ones in latency-summary.ts; both are re-exported here.
 * Times are workload seconds (simulated seconds under a time scale).
 */
import { EmissionCounts } from "./emission-counts.ts";
import { ItlSummaries } from "./itl-summaries.ts";
import { type Summary, summarize } from "./latency-summary.ts";
import { type RequestRecord, requestMetrics } from "./request-metrics.ts";
import { meetsSlo, type Slo } from "./slo.ts";

export { CDF_QUANTILES, percentile, type Summary, summarize } from "./latency-summary.ts";
export {
  forEachItl,
  type RequestError,
  type RequestMetrics,
  type RequestRecord,
  requestMetrics,
} from "./request-metrics.ts";
export { meetsSlo, parseSlo, type Slo } from "./slo.ts";

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

/** Run figures over `records` (warm-up requests excluded) plus one entry per stage. */
export function aggregate(records: readonly RequestRecord[], opts: AggregateOptions = {}): Aggregate {
  const measured = records.filter((r) => !r.warmup);
  const itls = new ItlSummaries(records);
  return {
    ...aggregateWith(
      measured,
      opts.slo,
      itls.summary((_, warmup) => !warmup),
    ),
    stages: stageAggregatesWith(records, opts.stages ?? [], opts.slo, itls),
  };
}

/** The figures of one set of requests (no stage breakdown). */
export function aggregateSet(records: readonly RequestRecord[], slo?: Slo): Omit<Aggregate, "stages"> {
  return aggregateWith(
    records,
    slo,
    new ItlSummaries(records).summary(() => true),
  );
}

function aggregateWith(
  records: readonly RequestRecord[],
  slo: Slo | undefined,
  itl: Summary,
): Omit<Aggregate, "stages"> {
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
    itl,
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
  return stageAggregatesWith(records, stages, slo, new ItlSummaries(records));
}

function stageAggregatesWith(
  records: readonly RequestRecord[],
  stages: readonly StageWindowInput[],
  slo: Slo | undefined,
  itls: ItlSummaries,
): StageAggregate[] {
  const sorted = [...stages].sort((a, b) => a.start - b.start);
  const windows = sorted.map((st, k) => {
    const own = records.filter((r) => r.stage === st.index);
    const lastEnd = own.reduce((a, r) => Math.max(a, r.end), st.start);
    const next = sorted[k + 1]?.start;
    // Cut by the next stage: [start, next). Ending with its own last request: [start, lastEnd].
    const cut = next !== undefined && next <= lastEnd;
    const end = cut ? next : lastEnd;
    const base = aggregateWith(
      own,
      slo,
      itls.summary((stage) => stage === st.index),
    );
    return { st, own: own.length, cut, end, base, skip: base.e2e.p50 ?? 0 };
  });
  if (windows.length === 0) return [];
  const tokens = new EmissionCounts(
    records,
    windows.flatMap((w) => [w.end, w.st.start, w.st.start + w.skip]),
  );
  return windows.map(({ st, own, cut, end, base, skip }) => {
    const inWindow = (t: number) => t >= st.start && (cut ? t < end : t <= end);
    const window = end - st.start;
    const upper = cut ? tokens.before(end) : tokens.upTo(end);
    const emitted = (from: number) => upper - tokens.before(from);
    const out = emitted(st.start);
    let sentIn = 0;
    let doneIn = 0;
    for (const r of records) {
      if (r.error) continue;
      if (inWindow(r.start)) sentIn += r.promptTokens;
      if (inWindow(r.end)) doneIn++;
    }
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
      achieved_rate: rate(own, st.duration),
      steady_output_tokens_per_s: skip < window ? rate(emitted(st.start + skip), window - skip) : null,
    };
  });
}
