/**
 * The simulated replica's /metrics: vLLM V1 metric names, labels and histogram buckets
 * (vLLM v0.26.0 vllm/v1/metrics/loggers.py, PrometheusStatLogger), filled from the engine's
 * stats and finished RequestRecords, plus kvgate's own sim-clock metrics. All durations are
 * simulated seconds. One prom-client Registry per replica (never the global one).
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EngineStats, FinishReason, RequestRecord, StepResult } from "../engine/types.ts";
import type { LagStats } from "./replica-driver.ts";

/** Exposition content type, as vLLM's prometheus_client serves it. */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

// Buckets from vLLM v0.26.0 vllm/v1/metrics/loggers.py.
export const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
  80.0, 160.0, 640.0, 2560.0,
];
export const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
export const REQUEST_LATENCY_BUCKETS = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
  960.0, 1920.0, 7680.0,
];
export const ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
/** kvgate's delivery-lag histogram (simulated seconds). */
export const LAG_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, ... up to max. */
export function buckets125(max: number): number[] {
  const out: number[] = [];
  for (let exp = 1; ; exp *= 10) {
    for (const m of [1, 2, 5]) {
      if (m * exp > max) return out;
      out.push(m * exp);
    }
  }
}

export interface VllmMetricsOptions {
  modelName: string;
  /** DP engine index label (vLLM: "0" for a single engine). */
  engine?: string;
  maxModelLen: number;
  /** Labels of vllm:cache_config_info (CacheConfig fields as strings), `engine` added. */
  cacheConfig: Record<string, string>;
  /** Also expose the pre-0.10 names gpu_cache_usage_perc and gpu_prefix_cache_*. */
  legacyNames: boolean;
  timeScale: number;
  stats: () => EngineStats;
  lag: () => LagStats;
}

type Labels = { model_name: string; engine: string };

/** The `source` label values of vllm:prompt_tokens_by_source_total. */
const SOURCES = ["local_compute", "local_cache_hit", "external_kv_transfer"] as const;

export class VllmMetrics {
  readonly registry = new Registry();
  private readonly labels: Labels;
  private readonly stats: () => EngineStats;
  private readonly lagSource: () => LagStats;
  private readonly legacy: boolean;
  /** Last counter values pushed to prom-client, to increment by the difference. */
  private readonly last = new Map<string, number>();
  private readonly g: Record<string, Gauge<string>> = {};
  private readonly c: Record<string, Counter<string>> = {};
  private readonly h: Record<string, Histogram<string>> = {};

  constructor(opts: VllmMetricsOptions) {
    this.labels = { model_name: opts.modelName, engine: opts.engine ?? "0" };
    this.stats = opts.stats;
    this.lagSource = opts.lag;
    this.legacy = opts.legacyNames;
    const reg = [this.registry];
    const names = ["model_name", "engine"];
    const gauge = (name: string, help: string) =>
      (this.g[name] = new Gauge({ name, help, labelNames: names, registers: reg }));
    const counter = (name: string, help: string, extra: string[] = []) =>
      (this.c[name] = new Counter({ name, help, labelNames: [...names, ...extra], registers: reg }));
    const hist = (name: string, help: string, buckets: number[]) =>
      (this.h[name] = new Histogram({ name, help, labelNames: names, buckets, registers: reg }));

    gauge("vllm:num_requests_running", "Requests in the running batch.");
    gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled, preempted ones included.");
    // Newer vLLM splits waiting requests: "deferred" = transient constraints (a KV transfer here).
    this.g["vllm:num_requests_waiting_by_reason"] = new Gauge({
      name: "vllm:num_requests_waiting_by_reason",
      help: "Waiting requests by reason: capacity, or deferred (e.g. waiting for a remote KV transfer).",
      labelNames: [...names, "reason"],
      registers: reg,
    });
    gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).");
    counter("vllm:prefix_cache_queries_total", "Tokens looked up in the prefix cache.");
    counter("vllm:prefix_cache_hits_total", "Tokens found in the prefix cache.");
    if (this.legacy) {
      gauge("vllm:gpu_cache_usage_perc", "Deprecated name of vllm:kv_cache_usage_perc.");
      counter("vllm:gpu_prefix_cache_queries_total", "Deprecated name of vllm:prefix_cache_queries_total.");
      counter("vllm:gpu_prefix_cache_hits_total", "Deprecated name of vllm:prefix_cache_hits_total.");
    }
    counter("vllm:num_preemptions_total", "Preemptions since start.");
    counter("vllm:prompt_tokens_total", "Prompt tokens computed (prefill).");
    counter(
      "vllm:prompt_tokens_by_source_total",
      "Prompt tokens by where their KV came from: local_compute, local_cache_hit, external_kv_transfer.",
      ["source"],
    );
    counter("vllm:generation_tokens_total", "Tokens generated.");
    counter("vllm:request_success_total", "Finished requests by finish reason.", ["finished_reason"]);

    const lenBuckets = buckets125(opts.maxModelLen);
    hist("vllm:request_prompt_tokens", "Prompt length of finished requests, tokens.", lenBuckets);
    hist("vllm:request_generation_tokens", "Generated tokens of finished requests.", lenBuckets);
    hist("vllm:request_params_max_tokens", "max_tokens of finished requests.", lenBuckets);
    hist("vllm:iteration_tokens_total", "Tokens scheduled per engine step.", ITERATION_TOKENS_BUCKETS);
    hist("vllm:time_to_first_token_seconds", "Time to first token, seconds.", TTFT_BUCKETS);
    hist("vllm:inter_token_latency_seconds", "Time between token-producing steps, seconds.", ITL_BUCKETS);
    hist(
      "vllm:request_time_per_output_token_seconds",
      "Mean time per output token per request.",
      ITL_BUCKETS,
    );
    hist("vllm:e2e_request_latency_seconds", "Arrival to finish, seconds.", REQUEST_LATENCY_BUCKETS);
    hist("vllm:request_queue_time_seconds", "Arrival to first scheduling, seconds.", REQUEST_LATENCY_BUCKETS);
    hist(
      "vllm:request_inference_time_seconds",
      "First scheduling to finish, seconds.",
      REQUEST_LATENCY_BUCKETS,
    );
    hist(
      "vllm:request_prefill_time_seconds",
      "First scheduling to first token, seconds.",
      REQUEST_LATENCY_BUCKETS,
    );
    hist("vllm:request_decode_time_seconds", "First token to finish, seconds.", REQUEST_LATENCY_BUCKETS);

    const cacheLabels = { ...opts.cacheConfig, engine: this.labels.engine };
    new Gauge({
      name: "vllm:cache_config_info",
      help: "KV-cache configuration (labels); value 1.",
      labelNames: Object.keys(cacheLabels),
      registers: reg,
    }).set(cacheLabels, 1);

    gauge("kvgate:sim_time_scale", "Simulated seconds per wall second: every duration here is simulated.");
    this.g["kvgate:sim_time_scale"]!.set(this.labels, opts.timeScale);
    gauge("kvgate:sim_lag_seconds", "How late the latest step delivery was, simulated seconds.");
    gauge("kvgate:sim_lag_max_seconds", "Largest step-delivery lag since start, simulated seconds.");
    hist("kvgate:sim_delivery_lag_seconds", "Step-delivery lag, simulated seconds.", LAG_BUCKETS);

    // Label sets vLLM shows from the start.
    for (const r of ["stop", "length", "abort", "error"])
      this.c["vllm:request_success_total"]!.inc({ ...this.labels, finished_reason: r }, 0);
    for (const src of SOURCES)
      this.c["vllm:prompt_tokens_by_source_total"]!.inc({ ...this.labels, source: src }, 0);
    for (const name of Object.keys(this.c))
      if (name !== "vllm:request_success_total" && name !== "vllm:prompt_tokens_by_source_total")
        this.c[name]!.inc(this.labels, 0);
    for (const h of Object.values(this.h)) h.zero(this.labels);
    for (const [name, g] of Object.entries(this.g))
      if (name !== "kvgate:sim_time_scale" && name !== "vllm:num_requests_waiting_by_reason")
        g.set(this.labels, 0);
    for (const reason of ["capacity", "deferred"])
      this.g["vllm:num_requests_waiting_by_reason"]!.set({ ...this.labels, reason }, 0);
  }

  /** Observes a step at its delivery. */
  observeStep(step: StepResult, lag: number): void {
    const tokens = step.numPrefillTokens + step.numDecodeTokens;
    if (tokens > 0) this.h["vllm:iteration_tokens_total"]!.observe(this.labels, tokens);
    this.h["kvgate:sim_delivery_lag_seconds"]!.observe(this.labels, Math.max(0, lag));
  }

  /**
   * Observes a finished request's latencies. `receivedAt` is when the server got it (earlier than the
   * engine's arrival when a fault delay held it back). Aborted requests only count in
   * request_success_total (from the engine's stats).
   */
  observeFinished(rec: RequestRecord, receivedAt: number = rec.arrivalTime): void {
    if (rec.finishReason === "abort" || rec.finishTime === null) return;
    const l = this.labels;
    const arrival = Math.min(receivedAt, rec.arrivalTime);
    const n = rec.outputTokenIds.length;
    this.h["vllm:request_prompt_tokens"]!.observe(l, rec.promptTokens);
    this.h["vllm:request_generation_tokens"]!.observe(l, n);
    this.h["vllm:request_params_max_tokens"]!.observe(l, rec.maxTokens);
    this.h["vllm:e2e_request_latency_seconds"]!.observe(l, rec.finishTime - arrival);
    if (rec.firstScheduledTime !== null) {
      this.h["vllm:request_queue_time_seconds"]!.observe(l, rec.firstScheduledTime - arrival);
      this.h["vllm:request_inference_time_seconds"]!.observe(l, rec.finishTime - rec.firstScheduledTime);
    }
    if (rec.firstTokenTime !== null) {
      this.h["vllm:time_to_first_token_seconds"]!.observe(l, rec.firstTokenTime - arrival);
      if (rec.firstScheduledTime !== null)
        this.h["vllm:request_prefill_time_seconds"]!.observe(l, rec.firstTokenTime - rec.firstScheduledTime);
      this.h["vllm:request_decode_time_seconds"]!.observe(l, rec.finishTime - rec.firstTokenTime);
      if (n > 1)
        this.h["vllm:request_time_per_output_token_seconds"]!.observe(
          l,
          (rec.finishTime - rec.firstTokenTime) / (n - 1),
        );
    }
    // One inter-token observation per step that produced tokens (vLLM V1 observes per iteration).
    const itl = this.h["vllm:inter_token_latency_seconds"]!;
    for (let i = 1; i < rec.tokenTimes.length; i++) {
      const gap = rec.tokenTimes[i]! - rec.tokenTimes[i - 1]!;
      if (gap > 0) itl.observe(l, gap);
    }
  }

  private setCounter(name: string, value: number, labels: Record<string, string> = this.labels): void {
    const key = `${name}|${labels["finished_reason"] ?? labels["source"] ?? ""}`;
    const prev = this.last.get(key) ?? 0;
    if (value > prev) this.c[name]!.inc(labels, value - prev);
    this.last.set(key, Math.max(prev, value));
  }

  /** Pulls the engine's current counters and gauges into the registry. */
  refresh(): void {
    const s = this.stats();
    const l = this.labels;
    this.g["vllm:num_requests_running"]!.set(l, s.numRequestsRunning);
    this.g["vllm:num_requests_waiting"]!.set(l, s.numRequestsWaiting);
    const byReason = this.g["vllm:num_requests_waiting_by_reason"]!;
    byReason.set({ ...l, reason: "capacity" }, s.numRequestsWaiting - s.numRequestsWaitingDeferred);
    byReason.set({ ...l, reason: "deferred" }, s.numRequestsWaitingDeferred);
    this.g["vllm:kv_cache_usage_perc"]!.set(l, s.kvCacheUsage);
    this.setCounter("vllm:prefix_cache_queries_total", s.prefixCacheQueries);
    this.setCounter("vllm:prefix_cache_hits_total", s.prefixCacheHits);
    if (this.legacy) {
      this.g["vllm:gpu_cache_usage_perc"]!.set(l, s.kvCacheUsage);
      this.setCounter("vllm:gpu_prefix_cache_queries_total", s.prefixCacheQueries);
      this.setCounter("vllm:gpu_prefix_cache_hits_total", s.prefixCacheHits);
    }
    this.setCounter("vllm:num_preemptions_total", s.numPreemptions);
    this.setCounter("vllm:prompt_tokens_total", s.promptTokens);
    for (const src of SOURCES)
      this.setCounter("vllm:prompt_tokens_by_source_total", s.promptTokensBySource[src], {
        ...l,
        source: src,
      });
    this.setCounter("vllm:generation_tokens_total", s.generationTokens);
    for (const [reason, count] of Object.entries(s.requestSuccess) as [FinishReason, number][]) {
      this.setCounter("vllm:request_success_total", count, { ...l, finished_reason: reason });
    }
    const lag = this.lagSource();
    this.g["kvgate:sim_lag_seconds"]!.set(l, lag.current);
    this.g["kvgate:sim_lag_max_seconds"]!.set(l, lag.max);
  }

  /** The exposition text. */
  async render(): Promise<string> {
    this.refresh();
    return this.registry.metrics();
  }
}
