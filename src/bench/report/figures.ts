/**
 * The figures of `kvgate report`, formatted once for both outputs (HTML and Markdown), so the two
 * always show the same numbers: number formatting and the summary table's columns. Pure.
 */
import type { RunResult } from "../results.ts";

/** Shown for a figure with no data (null, undefined, NaN). */
export const MISSING = "-";

type Num = number | null | undefined;
const ok = (v: Num): v is number => v !== null && v !== undefined && Number.isFinite(v);

/** Fixed decimals, e.g. tokens/s with 0, requests/s with 2. */
export const fixed = (v: Num, digits = 2): string => (ok(v) ? v.toFixed(digits) : MISSING);

/** Seconds as milliseconds: one decimal below 10 ms, whole milliseconds above. */
export function ms(v: Num): string {
  if (!ok(v)) return MISSING;
  const x = v * 1000;
  return Math.abs(x) < 10 ? x.toFixed(1) : x.toFixed(0);
}

/** A fraction (0–1) as a percentage with one decimal. */
export const pct = (v: Num): string => (ok(v) ? `${(v * 100).toFixed(1)}%` : MISSING);

export interface Column {
  header: string;
  /** Right-aligned (numbers) unless false. */
  numeric: boolean;
  cell: (run: RunResult) => string;
}

const col = (header: string, cell: (r: RunResult) => string): Column => ({ header, numeric: true, cell });

/**
 * The summary table's columns for a set of runs: fleet columns only when some run has fleet
 * figures, goodput only when some run has an SLO. The first column (router) is added by callers,
 * which know the run's display name. "req/s" is completed requests and "output tok/s" output
 * tokens over the run's window (first send to last stream end of its measured requests).
 */
export function summaryColumns(runs: readonly RunResult[]): Column[] {
  const cols: Column[] = [
    col("requests", (r) => String(r.requests)),
    col("errors", (r) => String(r.errors)),
    col("req/s", (r) => fixed(r.requests_per_s, 2)),
    col("output tok/s", (r) => fixed(r.output_tokens_per_s, 0)),
    col("total tok/s", (r) => fixed(r.total_tokens_per_s, 0)),
    col("TTFT p50 (ms)", (r) => ms(r.ttft_p50_s)),
    col("TTFT p90 (ms)", (r) => ms(r.ttft_p90_s)),
    col("TTFT p99 (ms)", (r) => ms(r.ttft_p99_s)),
    col("TPOT p50 (ms)", (r) => ms(r.tpot_p50_s)),
    col("E2E p50 (s)", (r) => fixed(r.e2e_p50_s, 2)),
    col("prefix-cache hit rate", (r) => pct(r.prefix_cache_hit_rate)),
  ];
  if (runs.some((r) => r.fleet))
    cols.push(
      col("KV usage mean", (r) => pct(r.fleet?.kv_usage_mean)),
      col("KV usage peak", (r) => pct(r.fleet?.kv_usage_peak)),
      col("preemptions", (r) => fixed(r.fleet?.preemptions, 0)),
    );
  if (runs.some((r) => r.goodput)) cols.push(col("goodput", (r) => pct(r.goodput?.fraction)));
  return cols;
}
