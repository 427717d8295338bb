/**
 * The tables of `kvgate report` as plain cells (unescaped text), built once and rendered by both
 * the HTML page and the Markdown file, so the two carry the same figures. Pure.
 */
import { fixed, ms, pct, summaryColumns } from "./figures.ts";
import { type FileView, offeredText, type RunView } from "./model.ts";

export interface Table {
  header: string[];
  /** Per column: right-align (numbers). */
  numeric: boolean[];
  rows: string[][];
}

/** One row per run of the file: router × key figures. */
export function summaryTable(file: FileView): Table {
  const cols = summaryColumns(file.runs.map((r) => r.run));
  return {
    header: ["router", ...cols.map((c) => c.header)],
    numeric: [false, ...cols.map((c) => c.numeric)],
    rows: file.runs.map((r) => [r.rowName, ...cols.map((c) => c.cell(r.run))]),
  };
}

/**
 * The points of the load charts: per run, the whole run (the summary's own figures) or, for a
 * sweep, each measured stage. "req/s" and "output tok/s" mean what they mean in the summary.
 */
export function loadTable(runs: readonly RunView[]): Table {
  return {
    header: ["run", "stage", "offered req/s", "req/s", "output tok/s", "TTFT p90 (ms)"],
    numeric: [false, true, true, true, true, true],
    rows: runs.flatMap((r) =>
      r.load.map((p) => [
        r.label,
        p.stage === null ? "all" : String(p.stage),
        `${offeredText(p)}${p.offeredKind === "arrival" ? " (arrival rate)" : ""}`,
        fixed(p.requestsPerS, 2),
        fixed(p.outputTokensPerS, 0),
        ms(p.ttftP90S),
      ]),
    ),
  };
}

/** Per replica of each run that scraped the fleet's /metrics. */
export function replicaTable(runs: readonly RunView[]): Table {
  return {
    header: ["run", "replica", "address", "KV usage mean", "KV usage max", "hit rate", "preemptions"],
    numeric: [false, true, false, true, true, true, true],
    rows: runs.flatMap((r) =>
      r.replicas.map((e) => [
        r.label,
        String(e.index),
        e.address,
        pct(e.kvUsageMean),
        pct(e.kvUsageMax),
        pct(e.hitRate),
        fixed(e.preemptions, 0),
      ]),
    ),
  };
}

/** The points of the latency CDFs, per run: quantile → TTFT and E2E. */
export function latencyTable(runs: readonly RunView[]): Table {
  return {
    header: [
      "run",
      "TTFT p50 (ms)",
      "TTFT p90 (ms)",
      "TTFT p99 (ms)",
      "E2E p50 (s)",
      "E2E p90 (s)",
      "E2E p99 (s)",
    ],
    numeric: [false, true, true, true, true, true, true],
    rows: runs.map((r) => [
      r.label,
      ms(r.run.ttft_p50_s),
      ms(r.run.ttft_p90_s),
      ms(r.run.ttft_p99_s),
      fixed(r.run.e2e_p50_s, 2),
      fixed(r.run.e2e_p90_s, 2),
      fixed(r.run.e2e_p99_s, 2),
    ]),
  };
}
