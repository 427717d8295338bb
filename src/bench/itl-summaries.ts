/**
 * Inter-token-gap (ITL) summaries of benchmark records, computed fast: gaps are tallied per distinct
 * value instead of sorted one by one, and the run and its stages share one tally per group of
 * records. Gives exactly what summarize() of all the gaps gives.
 */

import { CDF_QUANTILES, type Summary, summarize } from "./latency-summary.ts";
import { forEachItl, type RequestRecord } from "./request-metrics.ts";

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
export class ItlSummaries {
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
