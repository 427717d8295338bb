/**
 * The benchmark results file: its zod schema (checked whenever a file is read, e.g. by the report
 * command), and the conversion of an Aggregate plus run metadata into a run entry. Field names
 * are snake_case with units in the name; a figure with no data (no successful request) is null.
 * Unknown fields are kept on read so other writers (the fleet simulator) can add their own.
 */
import { z } from "zod";
import type { Aggregate, StageAggregate, Summary } from "./metrics.ts";

const n = z.number();
const nul = z.number().nullable();
const count = z.number().int().nonnegative();

const SloSchema = z.object({ ttft: n.optional(), tpot: n.optional(), e2e: n.optional() });

const GoodputSchema = z.looseObject({
  slo: SloSchema,
  good: count,
  fraction: nul,
  requests_per_s: nul,
  tokens_per_s: nul,
});

const latencyFields = {
  ttft_mean_s: nul,
  ttft_p50_s: nul,
  ttft_p90_s: nul,
  ttft_p99_s: nul,
  tpot_mean_s: nul,
  tpot_p50_s: nul,
  tpot_p90_s: nul,
  tpot_p99_s: nul,
  itl_mean_s: nul,
  itl_p50_s: nul,
  itl_p90_s: nul,
  itl_p99_s: nul,
  e2e_mean_s: nul,
  e2e_p50_s: nul,
  e2e_p90_s: nul,
  e2e_p99_s: nul,
};

const countFields = {
  requests: count,
  completed: count,
  errors: count,
  errors_by_kind: z.record(z.string(), count),
  window_s: n,
  requests_per_s: nul,
  input_tokens: count,
  output_tokens: count,
  output_tokens_per_s: nul,
  total_tokens_per_s: nul,
  goodput: GoodputSchema.optional(),
};

export const StageResultSchema = z.looseObject({
  index: count,
  rate: n,
  duration_s: n,
  warmup: z.boolean(),
  start_s: n,
  end_s: n,
  achieved_rate: nul,
  steady_output_tokens_per_s: nul,
  ...countFields,
  ...latencyFields,
});

const EndpointSchema = z.looseObject({
  url: z.string(),
  prefix_cache_hit_rate: nul,
  preemptions: nul,
  kv_usage_mean: nul,
  kv_usage_max: nul,
  scrape_errors: count,
});

export const FleetSchema = z.looseObject({
  prefix_cache_hit_rate: nul,
  prefix_cache_queries: nul,
  preemptions: nul,
  /** Per sample: min/mean/max of kv_cache_usage_perc across replicas; these average the samples. */
  kv_usage_min: nul,
  kv_usage_mean: nul,
  kv_usage_max: nul,
  kv_usage_peak: nul,
  samples: count,
  /** Only when samples is 0: why, and what to do. */
  kv_usage_note: z.string().optional(),
  endpoints: z.array(EndpointSchema),
  /** Only when the replicas are kvgate's simulator: their time scales and worst clock lag. */
  sim_time_scales: z.array(n).optional(),
  sim_lag_max_s: n.optional(),
});

const CdfSchema = z.array(z.tuple([z.number().min(0).max(1), z.number().nonnegative()]));

export const RunSchema = z.looseObject({
  router: z.string(),
  target: z.looseObject({ mode: z.enum(["single", "round-robin"]), urls: z.array(z.string()) }).optional(),
  workload: z.looseObject({ workload: z.string(), seed: n }),
  seed: z.number().int(),
  time_scale: n,
  started: z.string().optional(),
  not_sent: count,
  ...countFields,
  ...latencyFields,
  /** Fleet hit rate from /metrics when scraped, else from usage.cached_tokens; null if neither. */
  prefix_cache_hit_rate: nul,
  prefix_cache_hit_rate_source: z.enum(["metrics", "usage"]).nullable(),
  fleet: FleetSchema.optional(),
  /** Largest delay between a request's scheduled and actual send: large means the driver lagged. */
  driver_lag_max_s: n.optional(),
  /** [quantile, seconds] points of the TTFT and end-to-end latency distributions. */
  ttft_cdf: CdfSchema.optional(),
  e2e_cdf: CdfSchema.optional(),
  stages: z.array(StageResultSchema),
});

export const ResultsFileSchema = z.looseObject({
  kvgate_version: z.string(),
  created: z.string(),
  simulated: z.boolean(),
  time_unit: z.enum(["simulated_seconds", "seconds"]),
  runs: z.array(RunSchema),
});

export type StageResult = z.infer<typeof StageResultSchema>;
export type FleetResult = z.infer<typeof FleetSchema>;
export type RunResult = z.infer<typeof RunSchema>;
export type ResultsFile = z.infer<typeof ResultsFileSchema>;

export class ResultsFileError extends Error {
  override name = "ResultsFileError";
}

/** Parses and validates a results file's JSON text. */
export function parseResultsFile(text: string): ResultsFile {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new ResultsFileError(`results file is not JSON: ${(e as Error).message}`);
  }
  const r = ResultsFileSchema.safeParse(v);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new ResultsFileError(`results file: ${i.path.join(".") || "(root)"}: ${i.message}`);
  }
  return r.data;
}

function latency(a: { ttft: Summary; tpot: Summary; itl: Summary; e2e: Summary }) {
  const out: Record<string, number | null> = {};
  for (const k of ["ttft", "tpot", "itl", "e2e"] as const) {
    out[`${k}_mean_s`] = a[k].mean;
    out[`${k}_p50_s`] = a[k].p50;
    out[`${k}_p90_s`] = a[k].p90;
    out[`${k}_p99_s`] = a[k].p99;
  }
  return out as Record<keyof typeof latencyFields, number | null>;
}

function counts(a: Omit<Aggregate, "stages">) {
  return {
    requests: a.requests,
    completed: a.completed,
    errors: a.errors,
    errors_by_kind: a.errors_by_kind,
    window_s: a.window_s,
    requests_per_s: a.requests_per_s,
    input_tokens: a.input_tokens,
    output_tokens: a.output_tokens,
    output_tokens_per_s: a.output_tokens_per_s,
    total_tokens_per_s: a.total_tokens_per_s,
    ...(a.goodput ? { goodput: { ...a.goodput, slo: { ...a.goodput.slo } } } : {}),
  };
}

export function stageResult(s: StageAggregate): StageResult {
  return {
    index: s.index,
    rate: s.rate,
    duration_s: s.duration_s,
    warmup: s.warmup,
    start_s: s.start_s,
    end_s: s.end_s,
    achieved_rate: s.achieved_rate,
    steady_output_tokens_per_s: s.steady_output_tokens_per_s,
    ...counts(s),
    ...latency(s),
  };
}

export interface RunMeta {
  router: string;
  target?: { mode: "single" | "round-robin"; urls: string[] };
  /** The resolved workload spec (must carry `workload` and `seed`). */
  workload: { workload: string; seed: number } & Record<string, unknown>;
  timeScale: number;
  started?: string;
  notSent: number;
  fleet?: FleetResult;
  driverLagMax?: number;
}

export function runResult(a: Aggregate, meta: RunMeta): RunResult {
  const fleetRate = meta.fleet?.prefix_cache_hit_rate ?? null;
  const source = fleetRate !== null ? "metrics" : a.usage_cache_hit_rate !== null ? "usage" : null;
  return {
    router: meta.router,
    ...(meta.target ? { target: meta.target } : {}),
    workload: meta.workload,
    seed: meta.workload.seed,
    time_scale: meta.timeScale,
    ...(meta.started ? { started: meta.started } : {}),
    not_sent: meta.notSent,
    ...counts(a),
    ...latency(a),
    prefix_cache_hit_rate: fleetRate ?? a.usage_cache_hit_rate,
    prefix_cache_hit_rate_source: source,
    ttft_cdf: a.ttft.cdf,
    e2e_cdf: a.e2e.cdf,
    ...(meta.fleet ? { fleet: meta.fleet } : {}),
    ...(meta.driverLagMax !== undefined ? { driver_lag_max_s: meta.driverLagMax } : {}),
    stages: a.stages.map(stageResult),
  };
}

/** A new results file around `runs`. `simulated`: the target ran on a simulated clock. */
export function resultsFile(
  runs: RunResult[],
  meta: { kvgateVersion: string; created: string; simulated: boolean },
): ResultsFile {
  return {
    kvgate_version: meta.kvgateVersion,
    created: meta.created,
    simulated: meta.simulated,
    time_unit: meta.simulated ? "simulated_seconds" : "seconds",
    runs,
  };
}
