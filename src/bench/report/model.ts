/**
 * What `kvgate report` shows, derived from one or more validated results files, pure: a unique
 * display name and colour per run, the points of the load charts (one per measured stage, or one
 * at the run's offered rate), per-replica fleet rows, and latency CDFs (from `ttft_cdf`/`e2e_cdf`
 * when a run carries them, else from its p50/p90/p99).
 */
import { type ResultsFile, ResultsFileError, type RunResult } from "../results.ts";

export interface ReportInput {
  /** How the file is named in the report and in errors (the path as given). */
  name: string;
  file: ResultsFile;
}

/** [seconds, cumulative fraction] points, ascending; `exact` when from the run's own CDF. */
export interface Cdf {
  points: Array<[number, number]>;
  exact: boolean;
}

export interface LoadPoint {
  /** Stage index, or null for a run without stages. */
  stage: number | null;
  /** Offered requests/s: the stage's rate, the arrival rate, else (closed loop) the achieved rate. */
  offered: number;
  offeredKind: "stage" | "arrival" | "achieved";
  achieved: number | null;
  outputTokensPerS: number | null;
  ttftP90S: number | null;
}

export interface ReplicaRow {
  index: number;
  /** host:port (the scheme and /metrics path dropped). */
  address: string;
  kvUsageMean: number | null;
  kvUsageMax: number | null;
  hitRate: number | null;
  preemptions: number | null;
  scrapeErrors: number;
}

export interface RunView {
  /** Unique in its file: the router, with "#k" when a file has the router twice. */
  rowName: string;
  /** Unique in the report: rowName, plus the file when another file has the same rowName. */
  label: string;
  color: string;
  file: string;
  run: RunResult;
  load: LoadPoint[];
  replicas: ReplicaRow[];
  ttftCdf: Cdf | null;
  e2eCdf: Cdf | null;
}

export interface FileView {
  name: string;
  simulated: boolean;
  timeUnit: ResultsFile["time_unit"];
  version: string;
  created: string;
  runs: RunView[];
}

export interface ReportModel {
  files: FileView[];
  runs: RunView[];
  simulated: "all" | "none" | "mixed";
  /** Some run has two or more load points: draw lines against offered QPS, else bars per run. */
  loadLines: boolean;
  /** Most replicas any run reports. */
  replicaCount: number;
}

/** Colour-blind-friendly Tableau 10; runs past ten reuse it. */
export const PALETTE = [
  "#4e79a7",
  "#f28e2b",
  "#e15759",
  "#76b7b2",
  "#59a14f",
  "#edc948",
  "#b07aa1",
  "#ff9da7",
  "#9c755f",
  "#bab0ac",
];

/**
 * The optional per-run CDF fields kvgate report reads: [quantile in [0, 1], seconds] pairs, e.g.
 * `ttft_cdf: [[0, 0.08], [0.05, 0.12], ..., [0.99, 2.4], [1, 3.1]]`. Absent, null or empty: the
 * CDF is drawn from the run's p50/p90/p99.
 */
/** The run's own CDF points (validated by RunSchema), else its p50/p90/p99. */
function cdfOf(run: RunResult, key: "ttft" | "e2e"): Cdf | null {
  const own = key === "ttft" ? run.ttft_cdf : run.e2e_cdf;
  if (own?.length) {
    const points = own.map(([q, s]) => [s, q] as [number, number]).sort((a, b) => a[1] - b[1]);
    return { points, exact: true };
  }
  const points: Array<[number, number]> = [];
  for (const [q, v] of [
    [0.5, run[`${key}_p50_s`]],
    [0.9, run[`${key}_p90_s`]],
    [0.99, run[`${key}_p99_s`]],
  ] as const)
    if (v !== null) points.push([v, q]);
  return points.length ? { points, exact: false } : null;
}

/** The rate of a constant/poisson/gamma arrival spec, if the run's workload records one. */
function arrivalRate(run: RunResult): number | undefined {
  const a = (run.workload as { arrival?: { type?: unknown; rate?: unknown } }).arrival;
  return a && a.type !== "stages" && typeof a.rate === "number" ? a.rate : undefined;
}

/** Warm-up stages are left out, as they are from the run's own figures. */
export function loadPoints(run: RunResult): LoadPoint[] {
  const stages = run.stages.filter((s) => !s.warmup);
  if (stages.length)
    return stages
      .map((s) => ({
        stage: s.index,
        offered: s.rate,
        offeredKind: "stage" as const,
        achieved: s.achieved_rate,
        outputTokensPerS: s.output_tokens_per_s,
        ttftP90S: s.ttft_p90_s,
      }))
      .sort((a, b) => a.offered - b.offered || (a.stage ?? 0) - (b.stage ?? 0));
  const rate = arrivalRate(run);
  const offered = rate ?? run.requests_per_s;
  if (offered === null) return [];
  return [
    {
      stage: null,
      offered,
      offeredKind: rate !== undefined ? "arrival" : "achieved",
      achieved: run.requests_per_s,
      outputTokensPerS: run.output_tokens_per_s,
      ttftP90S: run.ttft_p90_s,
    },
  ];
}

/** "http://10.0.0.5:8000/metrics" → "10.0.0.5:8000". */
export const replicaAddress = (url: string): string =>
  url.replace(/^[a-z][a-z0-9+.-]*:\/\//i, "").replace(/\/metrics$/, "");

function replicaRows(run: RunResult): ReplicaRow[] {
  return (run.fleet?.endpoints ?? []).map((e, i) => ({
    index: i + 1,
    address: replicaAddress(e.url),
    kvUsageMean: e.kv_usage_mean,
    kvUsageMax: e.kv_usage_max,
    hitRate: e.prefix_cache_hit_rate,
    preemptions: e.preemptions,
    scrapeErrors: e.scrape_errors,
  }));
}

/** Appends " #2", " #3"... to repeated names, in order. */
function numberRepeats(names: string[]): string[] {
  const total = new Map<string, number>();
  for (const n of names) total.set(n, (total.get(n) ?? 0) + 1);
  const seen = new Map<string, number>();
  return names.map((n) => {
    if ((total.get(n) ?? 0) < 2) return n;
    const k = (seen.get(n) ?? 0) + 1;
    seen.set(n, k);
    return `${n} #${k}`;
  });
}

/** Builds the report model from validated results files. */
export function buildModel(inputs: readonly ReportInput[]): ReportModel {
  if (!inputs.length) throw new ResultsFileError("no results files given");
  const files: FileView[] = inputs.map(({ name, file }) => {
    const rowNames = numberRepeats(file.runs.map((r) => r.router));
    return {
      name,
      simulated: file.simulated,
      timeUnit: file.time_unit,
      version: file.kvgate_version,
      created: file.created,
      runs: file.runs.map((run, i) => ({
        rowName: rowNames[i],
        label: rowNames[i],
        color: "",
        file: name,
        run,
        load: loadPoints(run),
        replicas: replicaRows(run),
        ttftCdf: cdfOf(run, "ttft"),
        e2eCdf: cdfOf(run, "e2e"),
      })),
    };
  });
  const runs = files.flatMap((f) => f.runs);
  const fileCount = new Map<string, Set<string>>();
  for (const r of runs) fileCount.set(r.rowName, (fileCount.get(r.rowName) ?? new Set()).add(r.file));
  for (const r of runs) if ((fileCount.get(r.rowName)?.size ?? 0) > 1) r.label = `${r.rowName} (${r.file})`;
  const labels = numberRepeats(runs.map((r) => r.label));
  runs.forEach((r, i) => {
    r.label = labels[i];
    r.color = PALETTE[i % PALETTE.length];
  });
  const sims = new Set(files.map((f) => f.simulated));
  return {
    files,
    runs,
    simulated: sims.size > 1 ? "mixed" : sims.has(true) ? "all" : "none",
    loadLines: runs.some((r) => r.load.length >= 2),
    replicaCount: Math.max(0, ...runs.map((r) => r.replicas.length)),
  };
}

/** The time unit words for axis names and notes. */
export function unitWords(m: ReportModel): { seconds: string; rate: string } {
  if (m.simulated === "all") return { seconds: "simulated s", rate: "req/simulated s" };
  if (m.simulated === "none") return { seconds: "s", rate: "req/s" };
  return { seconds: "s, simulated or real", rate: "req/s, simulated or real" };
}
