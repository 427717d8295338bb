/**
 * Text output of `kvgate bench`, pure: the progress line and the end-of-run summary tables.
 */
import type { DriverProgress } from "./driver.ts";
import type { RunResult, StageResult } from "./results.ts";

const fmt = (v: number | null | undefined, digits = 2) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(digits);
const ms = (v: number | null | undefined) => (v === null || v === undefined ? "-" : (v * 1000).toFixed(0));
const pct = (v: number | null | undefined) =>
  v === null || v === undefined ? "-" : `${(v * 100).toFixed(1)}%`;

export function formatProgress(p: DriverProgress, unit: string): string {
  const stage = p.stage === undefined ? "" : ` stage ${p.stage}`;
  return (
    `t=${p.now.toFixed(1)}${unit}${stage} sent ${p.sent}/${p.total} done ${p.completed} ` +
    `err ${p.errors} in-flight ${p.inFlight} out-tokens ${p.outputTokens}`
  );
}

/** Left-aligned first column, right-aligned others. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]?.length ?? 0)));
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ");
  return [line(header), line(widths.map((w) => "-".repeat(w))), ...rows.map(line)].join("\n");
}

function stageRow(s: StageResult): string[] {
  return [
    `${s.index}${s.warmup ? " (warm-up)" : ""}`,
    fmt(s.rate, 1),
    fmt(s.duration_s, 0),
    String(s.requests),
    String(s.errors),
    fmt(s.output_tokens_per_s, 0),
    fmt(s.steady_output_tokens_per_s, 0),
    ms(s.ttft_p50_s),
    ms(s.ttft_p90_s),
    ms(s.tpot_p50_s),
    ms(s.itl_p90_s),
    s.goodput ? pct(s.goodput.fraction) : "-",
  ];
}

export function formatSummary(run: RunResult, unit: string): string {
  const lines: string[] = [];
  const wl = run.workload as { workload: string; preset?: string };
  lines.push(
    `router ${run.router} | workload ${wl.workload}${wl.preset ? ` (${wl.preset})` : ""} | seed ${run.seed}` +
      (run.time_scale !== 1 ? ` | time scale ${run.time_scale}` : ""),
  );
  const errs = Object.entries(run.errors_by_kind)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
  lines.push(
    `requests ${run.requests} (completed ${run.completed}, errors ${run.errors}${errs ? `: ${errs}` : ""}` +
      `, not sent ${run.not_sent}) over ${fmt(run.window_s, 1)} ${unit}`,
  );
  lines.push(
    table(
      ["metric", "value"],
      [
        ["requests/s", fmt(run.requests_per_s, 2)],
        ["output tokens/s", fmt(run.output_tokens_per_s, 0)],
        ["total tokens/s", fmt(run.total_tokens_per_s, 0)],
        [
          "TTFT p50 / p90 / p99 (ms)",
          `${ms(run.ttft_p50_s)} / ${ms(run.ttft_p90_s)} / ${ms(run.ttft_p99_s)}`,
        ],
        [
          "TPOT p50 / p90 / p99 (ms)",
          `${ms(run.tpot_p50_s)} / ${ms(run.tpot_p90_s)} / ${ms(run.tpot_p99_s)}`,
        ],
        ["ITL p50 / p90 / p99 (ms)", `${ms(run.itl_p50_s)} / ${ms(run.itl_p90_s)} / ${ms(run.itl_p99_s)}`],
        ["E2E p50 / p90 / p99 (s)", `${fmt(run.e2e_p50_s)} / ${fmt(run.e2e_p90_s)} / ${fmt(run.e2e_p99_s)}`],
        [
          `prefix-cache hit rate (${run.prefix_cache_hit_rate_source ?? "n/a"})`,
          pct(run.prefix_cache_hit_rate),
        ],
        ...(run.goodput
          ? [
              [
                `goodput (${Object.entries(run.goodput.slo)
                  .map(([k, v]) => `${k}≤${v}s`)
                  .join(", ")})`,
                `${pct(run.goodput.fraction)}, ${fmt(run.goodput.requests_per_s)} req/s`,
              ],
            ]
          : []),
        ...(run.fleet
          ? [
              ["preemptions", fmt(run.fleet.preemptions, 0)],
              [
                "KV usage min / mean / max (peak)",
                `${pct(run.fleet.kv_usage_min)} / ${pct(run.fleet.kv_usage_mean)} / ${pct(run.fleet.kv_usage_max)} (${pct(run.fleet.kv_usage_peak)})`,
              ],
            ]
          : []),
      ],
    ),
  );
  if (run.stages.length) {
    lines.push("");
    lines.push(
      table(
        [
          "stage",
          "QPS",
          "dur",
          "reqs",
          "err",
          "out tok/s",
          "steady",
          "TTFT p50",
          "TTFT p90",
          "TPOT p50",
          "ITL p90",
          "good",
        ],
        run.stages.map(stageRow),
      ),
    );
    lines.push("(times in ms; throughput counts tokens emitted within each stage's window)");
  }
  return lines.join("\n");
}
