/**
 * What `kvgate report` shows, derived from one or more validated results files, pure: a unique
 * display name and colour per run, the points of the load charts (one per measured stage of a
 * sweep, else one with the run's own figures), per-replica fleet rows, and latency CDFs (from `ttft_cdf`/`e2e_cdf`
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

/**
 * One point of the load charts. Throughput has one definition everywhere in the report, the run's
 * (or stage's) own: `req/s` = completed requests / window, `output tok/s` = output tokens / window.
 * A run with at most one measured stage is one point carrying the run's own figures (the same
 * numbers as the summary table); a sweep has one point per measured stage, over the stage's window.
 */
export interface LoadPoint {
  /** Stage index, or null for the whole run. */
  stage: number | null;
  /** Offered requests/s (the stage's or arrival's rate); null for a closed loop, which offers none. */
  offered: number | null;
  offeredKind: "stage" | "arrival" | "closed";
  /** Closed-loop users, when offeredKind is "closed". */
  users?: number;
  /** Completed requests per second over the point's window. */
  requestsPerS: number | null;
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

type ArrivalLike = { type?: unknown; rate?: unknown; users?: unknown };

/** The rate of a constant/poisson/gamma arrival spec, or the users of a closed loop. */
function arrivalOf(run: RunResult): { rate?: number; users?: number } {
  const a = (run.workload as { arrival?: ArrivalLike }).arrival;
  if (!a) return {};
  if (a.type === "closed") return { users: typeof a.users === "number" ? a.users : undefined };
  return a.type !== "stages" && typeof a.rate === "number" ? { rate: a.rate } : {};
}

/** Offered load as text: "50.00", "closed loop, 150 users" (no offered rate). */
export function offeredText(p: LoadPoint): string {
  if (p.offeredKind === "closed") return `closed loop${p.users !== undefined ? `, ${p.users} users` : ""}`;
  return p.offered === null ? "-" : p.offered.toFixed(2);
}

/** The x position of a point on the load charts: the offered rate, else (closed loop) its req/s. */
export const loadX = (p: LoadPoint): number | null => p.offered ?? p.requestsPerS;

/** Warm-up stages are left out, as they are from the run's own figures. */
export function loadPoints(run: RunResult): LoadPoint[] {
  const stages = run.stages.filter((s) => !s.warmup);
  if (stages.length >= 2)
    return stages
      .map((s) => ({
        stage: s.index,
        offered: s.rate,
        offeredKind: "stage" as const,
        requestsPerS: s.requests_per_s,
        outputTokensPerS: s.output_tokens_per_s,
        ttftP90S: s.ttft_p90_s,
      }))
      .sort((a, b) => a.offered - b.offered || a.stage - b.stage);
  const { rate, users } = arrivalOf(run);
  const whole = {
    requestsPerS: run.requests_per_s,
    outputTokensPerS: run.output_tokens_per_s,
    ttftP90S: run.ttft_p90_s,
  };
  if (stages.length === 1) return [{ stage: null, offered: stages[0].rate, offeredKind: "stage", ...whole }];
  if (rate !== undefined) return [{ stage: null, offered: rate, offeredKind: "arrival", ...whole }];
  if (run.requests_per_s === null) return [];
  return [
    {
      stage: null,
      offered: null,
      offeredKind: "closed",
      ...(users !== undefined ? { users } : {}),
      ...whole,
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
