/**
 * Results files for the `kvgate report` tests: literal runs that pass the results-file schema,
 * with a QPS sweep (stages), optional fleet figures per replica and chosen latencies.
 */
import { type ResultsFile, type RunResult, resultsFile, type StageResult } from "../../src/bench/results.ts";

const latency = (ttft: [number, number, number], e2e: [number, number, number]) => ({
  ttft_mean_s: ttft[0],
  ttft_p50_s: ttft[0],
  ttft_p90_s: ttft[1],
  ttft_p99_s: ttft[2],
  tpot_mean_s: 0.021,
  tpot_p50_s: 0.02,
  tpot_p90_s: 0.03,
  tpot_p99_s: 0.04,
  itl_mean_s: 0.02,
  itl_p50_s: 0.02,
  itl_p90_s: 0.03,
  itl_p99_s: 0.05,
  e2e_mean_s: e2e[0],
  e2e_p50_s: e2e[0],
  e2e_p90_s: e2e[1],
  e2e_p99_s: e2e[2],
});

const counts = (requests: number, errors: number, window: number, outTps: number) => ({
  requests,
  completed: requests - errors,
  errors,
  errors_by_kind: (errors ? { http_503: errors } : {}) as Record<string, number>,
  window_s: window,
  requests_per_s: (requests - errors) / window,
  input_tokens: (requests - errors) * 7000,
  output_tokens: Math.round(outTps * window),
  output_tokens_per_s: outTps,
  total_tokens_per_s: outTps + ((requests - errors) * 7000) / window,
});

export interface StageSpec {
  rate: number;
  outTps: number;
  ttftP90: number;
  warmup?: boolean;
}

export function stage(index: number, s: StageSpec, start: number): StageResult {
  const duration = 30;
  const requests = Math.round(s.rate * duration);
  return {
    index,
    rate: s.rate,
    duration_s: duration,
    warmup: s.warmup ?? false,
    start_s: start,
    end_s: start + duration,
    achieved_rate: s.rate * 0.98,
    steady_output_tokens_per_s: s.outTps * 1.05,
    ...counts(requests, 0, duration, s.outTps),
    ...latency([s.ttftP90 / 2, s.ttftP90, s.ttftP90 * 1.5], [3, 5, 8]),
  };
}

export interface RunSpec {
  router: string;
  requests?: number;
  errors?: number;
  outTps?: number;
  ttft?: [number, number, number];
  e2e?: [number, number, number];
  hitRate?: number | null;
  stages?: StageSpec[];
  /** Per replica: [kv usage mean, prefix-cache hit rate]. */
  replicas?: Array<[number, number | null]>;
  rate?: number;
  extra?: Record<string, unknown>;
}

export function run(s: RunSpec): RunResult {
  const window = 60;
  const replicas = s.replicas;
  return {
    router: s.router,
    target: { mode: "single", urls: ["http://127.0.0.1:9000"] },
    workload: {
      workload: "shared-prefix",
      seed: 42,
      arrival: s.stages ? { type: "stages", stages: [] } : { type: "poisson", rate: s.rate ?? 24 },
    },
    seed: 42,
    time_scale: 1,
    not_sent: 0,
    ...counts(s.requests ?? 1200, s.errors ?? 0, window, s.outTps ?? 1234.4),
    ...latency(s.ttft ?? [0.25, 0.9, 2.5], s.e2e ?? [4.5, 7.25, 12]),
    prefix_cache_hit_rate: s.hitRate === undefined ? 0.8765 : s.hitRate,
    prefix_cache_hit_rate_source: "metrics",
    ...(replicas
      ? {
          fleet: {
            prefix_cache_hit_rate: s.hitRate ?? null,
            prefix_cache_queries: 1e6,
            preemptions: 3,
            kv_usage_min: 0.2,
            kv_usage_mean: 0.55,
            kv_usage_max: 0.9,
            kv_usage_peak: 0.97,
            samples: 60,
            endpoints: replicas.map(([kv, hit], i) => ({
              url: `http://127.0.0.1:${8001 + i}/metrics`,
              prefix_cache_hit_rate: hit,
              preemptions: i,
              kv_usage_mean: kv,
              kv_usage_max: Math.min(1, kv + 0.1),
              scrape_errors: 0,
            })),
          },
        }
      : {}),
    stages: (s.stages ?? []).map((st, i) => stage(i, st, i * 30)),
    ...s.extra,
  };
}

export function file(runs: RunResult[], simulated = true): ResultsFile {
  return resultsFile(runs, { kvgateVersion: "0.1.0", created: "2025-01-02T03:04:05.000Z", simulated });
}

/** A QPS sweep of two routers over 4 replicas, kvgate ahead, with a warm-up stage. */
export function sweepFile(): ResultsFile {
  const sweep = (k: number): StageSpec[] => [
    { rate: 10, outTps: 400, ttftP90: 5, warmup: true },
    ...[4, 8, 12, 16, 20].map((rate) => ({
      rate,
      outTps: Math.min(rate, 12 * k) * 64,
      ttftP90: rate <= 12 * k ? 0.3 / k + rate * 0.01 : 0.3 + (rate - 12 * k) * 0.8,
    })),
  ];
  return file([
    run({
      router: "round-robin",
      outTps: 700,
      hitRate: 0.31,
      ttft: [0.6, 3.2, 7.5],
      e2e: [6, 11, 19],
      stages: sweep(1),
      replicas: [
        [0.95, 0.3],
        [0.92, 0.33],
        [0.97, 0.28],
        [0.9, 0.35],
      ],
    }),
    run({
      router: "kvgate",
      outTps: 1150,
      hitRate: 0.86,
      ttft: [0.12, 0.45, 1.1],
      e2e: [3.1, 4.2, 6.3],
      stages: sweep(1.6),
      replicas: [
        [0.62, 0.88],
        [0.58, 0.85],
        [0.66, 0.87],
        [0.6, 0.84],
      ],
    }),
  ]);
}
