/**
 * Latency summaries of a set of values: mean, percentiles and a CDF. Percentiles interpolate
 * linearly between closest ranks (numpy's default, Hyndman–Fan type 7).
 */

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
