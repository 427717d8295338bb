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

/**
 * A sorted multiset of numbers as its distinct values, ascending, and how often each occurs: the
 * run-length form of the array summarize() sorts. Only ordinary numbers (no NaN, no −0), so values
 * that compare equal are the same value and `<` is the sort order.
 */
interface Tally {
  values: Float64Array;
  counts: Float64Array;
  /** Σ counts. */
  n: number;
}

const NO_TALLY: Tally = { values: new Float64Array(0), counts: new Float64Array(0), n: 0 };

/** Times `for (let j = from; j < k; j++)` runs (forEachItl's loop), for k > 0 or NaN. */
const reps = (k: number, from: number) => (k > from ? Math.ceil(k) - from : 0);

/** NaN or −0: a tally cannot reproduce where Float64Array#sort puts them. */
const odd = (v: number) => Number.isNaN(v) || (v === 0 && 1 / v < 0);

/**
 * The inter-token gaps of `records` (forEachItl's, in value order) as a tally, or null if one is
 * NaN or −0. Simulated runs have few distinct gaps (every request decoding in a step shares the
 * step's duration: ~400k distinct among 17M), so they are counted in a hash table and only the
 * distinct values sorted; when more than an eighth are distinct (live runs), the gaps are sorted.
 */
function itlTally(records: readonly RequestRecord[]): Tally | null {
  let total = 0;
  for (const r of records) {
    if (r.error) continue;
    const ks = r.chunkTokens;
    let from = 1;
    for (let i = 0; i < ks.length; i++) {
      const k = ks[i];
      if (k <= 0) continue;
      total += reps(k, from);
      from = 0;
    }
  }
  if (total === 0) return NO_TALLY;
  const limit = Math.max(4096, total >>> 3);
  // Open addressing over the value's bits, at most half full; a slot holds id + 1 (0 = empty).
  let slots = new Int32Array(4096);
  let mask = slots.length - 1;
  let values = new Float64Array(slots.length);
  let counts = new Float64Array(slots.length);
  let d = 0;
  const f64 = new Float64Array(1);
  const u32 = new Uint32Array(f64.buffer);
  // murmur3's finaliser over the value's two 32-bit halves (inlined in the counting loop below).
  const hash = (v: number) => {
    f64[0] = v;
    let h = u32[0] ^ Math.imul(u32[1], 0x9e3779b1);
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    return h ^ (h >>> 16);
  };
  const grow = () => {
    const nv = new Float64Array(values.length * 2);
    nv.set(values);
    const nc = new Float64Array(counts.length * 2);
    nc.set(counts);
    values = nv;
    counts = nc;
    slots = new Int32Array(slots.length * 2);
    mask = slots.length - 1;
    for (let id = 0; id < d; id++) {
      let h = hash(values[id]) & mask;
      while (slots[h] !== 0) h = (h + 1) & mask;
      slots[h] = id + 1;
    }
  };
  let tallied = true;
  add: for (const r of records) {
    if (r.error) continue;
    const { chunkTimes: ts, chunkTokens: ks } = r;
    let prev = -1;
    let last = Number.NaN;
    let lastId = -1;
    for (let i = 0; i < ts.length; i++) {
      const k = ks[i];
      if (k <= 0) continue;
      const gap = prev < 0 ? 0 : (ts[i] - ts[prev]) / k;
      const w = reps(k, prev < 0 ? 1 : 0);
      prev = i;
      if (w === 0) continue;
      if (!(gap > 0) && odd(gap)) return null;
      if (gap === last) {
        counts[lastId] += w;
        continue;
      }
      f64[0] = gap;
      let h = u32[0] ^ Math.imul(u32[1], 0x9e3779b1);
      h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
      h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
      h = (h ^ (h >>> 16)) & mask;
      let id = -1;
      for (let x = slots[h]; x !== 0; x = slots[h]) {
        if (values[x - 1] === gap) {
          id = x - 1;
          break;
        }
        h = (h + 1) & mask;
      }
      if (id < 0) {
        if (d >= limit) {
          tallied = false;
          break add;
        }
        id = d++;
        values[id] = gap;
        slots[h] = id + 1;
        if (2 * d > slots.length) grow();
      }
      counts[id] += w;
      last = gap;
      lastId = id;
    }
  }
  if (!tallied) return sortedTally(allItls(records).sort());
  const sorted = values.slice(0, d).sort();
  const sc = new Float64Array(d);
  for (let i = 0; i < d; i++) {
    const v = sorted[i];
    let h = hash(v) & mask;
    while (values[slots[h] - 1] !== v) h = (h + 1) & mask;
    sc[i] = counts[slots[h] - 1];
  }
  return { values: sorted, counts: sc, n: total };
}

/** The tally of an ascending array, or null if it holds NaN or −0. */
function sortedTally(s: Float64Array): Tally | null {
  const values = new Float64Array(s.length);
  const counts = new Float64Array(s.length);
  let d = 0;
  for (let i = 0; i < s.length; i++) {
    const v = s[i];
    if (odd(v)) return null;
    if (d > 0 && values[d - 1] === v) counts[d - 1]++;
    else {
      values[d] = v;
      counts[d++] = 1;
    }
  }
  return { values: values.subarray(0, d), counts: counts.subarray(0, d), n: s.length };
}

/** The union of two tallies. */
function mergeTallies(a: Tally, b: Tally): Tally {
  if (b.n === 0) return a;
  if (a.n === 0) return b;
  const m = a.values.length;
  const n = b.values.length;
  const values = new Float64Array(m + n);
  const counts = new Float64Array(m + n);
  let i = 0;
  let j = 0;
  let k = 0;
  while (i < m || j < n) {
    if (j >= n || (i < m && a.values[i] < b.values[j])) {
      values[k] = a.values[i];
      counts[k++] = a.counts[i++];
    } else if (i >= m || b.values[j] < a.values[i]) {
      values[k] = b.values[j];
      counts[k++] = b.counts[j++];
    } else {
      values[k] = a.values[i];
      counts[k++] = a.counts[i++] + b.counts[j++];
    }
  }
  return { values: values.subarray(0, k), counts: counts.subarray(0, k), n: a.n + b.n };
}

/** summarize() of the array a tally stands for: the same figures, the mean summed in the same order. */
function summarizeTally(t: Tally): Summary {
  const { values, counts, n } = t;
  const d = values.length;
  // ends[i]: number of elements up to and including the run of values[i].
  const ends = new Float64Array(d);
  let sum = 0;
  let c = 0;
  for (let i = 0; i < d; i++) {
    const v = values[i];
    const k = counts[i];
    for (let j = 0; j < k; j++) sum += v;
    c += k;
    ends[i] = c;
  }
  const at = (rank: number) => {
    let lo = 0;
    let hi = d - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (ends[mid] > rank) hi = mid;
      else lo = mid + 1;
    }
    return values[lo];
  };
  // percentile() over the virtual sorted array.
  const q = (p: number): number | null => {
    if (n === 0) return null;
    if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be in [0, 100], got ${p}`);
    const h = ((n - 1) * p) / 100;
    const lo = Math.floor(h);
    const hi = Math.min(lo + 1, n - 1);
    const vlo = at(lo);
    return vlo + (h - lo) * (at(hi) - vlo);
  };
  return {
    count: n,
    mean: n ? sum / n : null,
    p50: q(50),
    p90: q(90),
    p95: q(95),
    p99: q(99),
    max: n ? values[d - 1] : null,
    cdf: n ? CDF_QUANTILES.map((x) => [x, q(x * 100) as number]) : [],
  };
}

/**
 * The ITL summaries of several subsets of the records at once. Records fall into groups (stage,
 * warm-up); each group's gaps are tallied once and a subset's tally is the merge of its groups', so
 * the run and its stages share one pass. If any gap is NaN or −0, every subset is summarized the
 * old way (summarize of allItls).
 */
class ItlSummaries {
  readonly #records: readonly RequestRecord[];
  readonly #groups: { stage: number | undefined; warmup: boolean; records: RequestRecord[] }[] = [];
  #tallies: (Tally | null)[] | null = null;

  constructor(records: readonly RequestRecord[]) {
    this.#records = records;
    const byKey = new Map<string, RequestRecord[]>();
    for (const r of records) {
      if (r.error) continue;
      const key = `${r.warmup ? 1 : 0}:${r.stage}`;
      let g = byKey.get(key);
      if (g === undefined) {
        g = [];
        byKey.set(key, g);
        this.#groups.push({ stage: r.stage, warmup: !!r.warmup, records: g });
      }
      g.push(r);
    }
  }

  /** summarize(allItls(records.filter(keep))) for a `keep` that depends only on stage and warm-up. */
  summary(keep: (stage: number | undefined, warmup: boolean) => boolean): Summary {
    this.#tallies ??= this.#tally();
    const tallies = this.#tallies;
    if (tallies.includes(null))
      return summarize(allItls(this.#records.filter((r) => keep(r.stage, !!r.warmup))));
    let t = NO_TALLY;
    for (let i = 0; i < this.#groups.length; i++) {
      const g = this.#groups[i];
      if (keep(g.stage, g.warmup)) t = mergeTallies(t, tallies[i] as Tally);
    }
    return summarizeTally(t);
  }

  #tally(): (Tally | null)[] {
    const out: (Tally | null)[] = [];
    for (const g of this.#groups) {
      const t = itlTally(g.records);
      out.push(t);
      if (t === null) break;
    }
    return out;
  }
}

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

/**
 * Output tokens of the successful requests emitted before / up to given times (one per token, at
 * its chunk's arrival), for a set of query times fixed up front: one pass over the chunks, no sort.
 * before(x) and upTo(x) count the tokens at t < x and t ≤ x; NaN times and queries count nothing.
 */
class EmissionCounts {
  /** The query times, ascending and distinct (NaN left out). */
  readonly #xs: Float64Array;
  /** #{t < xs[j]} and #{t ≤ xs[j]}. */
  readonly #below: Float64Array;
  readonly #upTo: Float64Array;

  constructor(records: readonly RequestRecord[], queries: readonly number[]) {
    const xs = Float64Array.from(new Set(queries.filter((x) => !Number.isNaN(x)))).sort();
    const m = xs.length;
    // A token at t adds to below[j] for j ≥ b = #{xs ≤ t}, and to upTo[j] for j ≥ a = #{xs < t}.
    const hb = new Float64Array(m + 1);
    const ha = new Float64Array(m + 1);
    let a = 0;
    let b = 0;
    for (const r of records) {
      if (r.error) continue;
      const { chunkTimes: ts, chunkTokens: ks } = r;
      for (let i = 0; i < ts.length; i++) {
        const k = ks[i];
        if (!(k > 0)) continue;
        const t = ts[i];
        if (Number.isNaN(t)) continue;
        // Chunk times ascend within a request, so the cursors mostly stay put.
        while (b < m && xs[b] <= t) b++;
        while (b > 0 && xs[b - 1] > t) b--;
        while (a < m && xs[a] < t) a++;
        while (a > 0 && xs[a - 1] >= t) a--;
        const w = Math.ceil(k);
        hb[b] += w;
        ha[a] += w;
      }
    }
    this.#xs = xs;
    this.#below = new Float64Array(m);
    this.#upTo = new Float64Array(m);
    let sb = 0;
    let sa = 0;
    for (let j = 0; j < m; j++) {
      sb += hb[j];
      sa += ha[j];
      this.#below[j] = sb;
      this.#upTo[j] = sa;
    }
  }

  before(x: number): number {
    const j = this.#find(x);
    return j < 0 ? 0 : this.#below[j];
  }

  upTo(x: number): number {
    const j = this.#find(x);
    return j < 0 ? 0 : this.#upTo[j];
  }

  #find(x: number): number {
    if (Number.isNaN(x)) return -1;
    const xs = this.#xs;
    let lo = 0;
    let hi = xs.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (xs[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    if (lo >= xs.length || xs[lo] !== x)
      throw new Error(`emission count asked for an unregistered time ${x}`);
    return lo;
  }
}
