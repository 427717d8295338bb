/**
 * The gateway's own Prometheus metrics, on a private prom-client Registry served by the admin port.
 * Names, types and labels follow llm-d's EPP catalogue (llm-d/llm-d-router@ebab6879 docs/metrics.md) where
 * llm-d has the metric, so existing dashboards work; `kvgate_*` otherwise.
 * Client-chosen label values (model names) are capped at 1000 distinct values, then "other".
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { KvEndpointStats } from "../datalayer/kv-events-subscriber.ts";
import type { KvEventsFeedView } from "./kv-events.ts";
import { PdMetrics } from "./pd/metrics.ts";

const REQ_LABELS = ["model_name", "target_model_name", "fairness_id", "priority"] as const;
export type ReqLabels = Record<(typeof REQ_LABELS)[number], string>;

const LATENCY_BUCKETS = [
  0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120,
  180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
];
const SIZE_BUCKETS = [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864];
const SCHED_BUCKETS = [0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1];
const RATIO_BUCKETS = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1];

export type Outcome =
  | "success"
  | "upstream-error"
  | "midstream-failure"
  | "client-disconnect"
  | "rejected"
  | "bad-request"
  | "not-found"
  | "all-attempts-failed";

const MAX_LABEL_VALUES = 1000;

/** Precise mode's per-endpoint subscriber counters: metric suffix → stats field and help. */
const KV_EVENT_COUNTERS: ReadonlyArray<[string, keyof KvEndpointStats, string]> = [
  ["batches", "batches", "KV-event batches applied to the precise index."],
  ["events", "events", "KV events (BlockStored, BlockRemoved, AllBlocksCleared) applied."],
  ["garbage", "garbage", "KV-event messages skipped as malformed (frames, seq or payload)."],
  ["gaps", "gaps", "Sequence gaps detected (missed batches)."],
  ["replays", "replays", "Replays requested from the endpoint's replay socket."],
  [
    "resets",
    "resets",
    "Times the endpoint's index entries were dropped (restart, lost history, gap without replay).",
  ],
];
type KvLabels = "plugin_name" | "endpoint";

export class GatewayMetrics {
  readonly registry = new Registry();
  readonly #seenModels = new Set<string>();
  readonly #seenFairness = new Set<string>();
  readonly requestTotal: Counter<keyof ReqLabels>;
  readonly requestErrorTotal: Counter<keyof ReqLabels | "error_code">;
  readonly requestDuration: Histogram<keyof ReqLabels>;
  readonly requestSize: Histogram<keyof ReqLabels>;
  readonly responseSize: Histogram<keyof ReqLabels>;
  readonly requestRunning: Gauge<keyof ReqLabels>;
  readonly ttft: Histogram<keyof ReqLabels | "streaming">;
  readonly schedulerE2e: Histogram;
  readonly schedulerAttempts: Counter<
    "status" | "target_model_name" | "endpoint_name" | "namespace" | "port"
  >;
  readonly readyEndpoints: Gauge<"name">;
  readonly avgKv: Gauge<"name">;
  readonly avgQueue: Gauge<"name">;
  readonly avgRunning: Gauge<"name">;
  readonly perEndpointQueue: Gauge<"name" | "model_server_endpoint">;
  readonly pollErrors: Counter<"source_type">;
  readonly extractErrors: Counter<"source_type" | "extractor_type">;
  readonly prefixSize: Gauge<"plugin_name" | "plugin_type">;
  readonly prefixHitRatio: Histogram<"plugin_name" | "plugin_type">;
  readonly httpRequests: Counter<"route" | "status" | "outcome">;
  readonly modelRewrites: Counter<"model_rewrite_name" | "model_name" | "target_model">;
  readonly upstreamFailures: Counter<"endpoint" | "kind">;
  readonly endpointHealthy: Gauge<"endpoint">;
  /** The local tokenizer's prefix cache (tokenize-cache.ts), set from its counters before each scrape. */
  readonly tokenizerCacheHits: Counter;
  readonly tokenizerCacheMisses: Counter;
  /** --tokenizer endpoint: /tokenize calls made and failed (the request was routed without ids). */
  readonly tokenizerEndpointRequests: Counter;
  readonly tokenizerEndpointFailures: Counter;
  /** kvgate_kv_events_<name>_total per precise producer and endpoint (set from the subscribers' counts). */
  readonly kvEventCounters: ReadonlyArray<[keyof KvEndpointStats, Counter<KvLabels>]>;
  readonly kvIndexEntries: Gauge<KvLabels>;
  readonly kvIndexBytesPerEntry: Gauge<"plugin_name">;
  /**
   * llm-d's P/D decision counter (llm-d/llm-d-router@ebab6879 `profilehandler/disagg/metrics.go`
   * `LlmdDisaggDecisionCount`), counted per scheduling by a disagg-profile-handler.
   */
  readonly disaggDecisions: Counter<"plugin_name" | "plugin_type" | "model_name" | "decision_type">;
  /** kvgate's P/D legs: fallbacks, failures, retries, releases (pd/metrics.ts). */
  readonly pd: PdMetrics;

  constructor() {
    const registers = [this.registry];
    // The process's own health, as llm-d's Go EPP exports go_* and process_*: resident memory
    // (process_resident_memory_bytes), heap, handles, and event-loop delay
    // (nodejs_eventloop_lag_{p50,p99,max}_seconds, over the time since the previous scrape).
    collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: 10 });
    const c = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
      new Counter<L>({ name, help, labelNames, registers });
    const g = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
      new Gauge<L>({ name, help, labelNames, registers });
    const h = <L extends string>(name: string, help: string, labelNames: readonly L[], buckets: number[]) =>
      new Histogram<L>({ name, help, labelNames, buckets, registers });

    this.requestTotal = c("llm_d_epp_request_total", "Total requests.", REQ_LABELS);
    this.requestErrorTotal = c("llm_d_epp_request_error_total", "Errored requests.", [
      ...REQ_LABELS,
      "error_code",
    ]);
    this.requestDuration = h(
      "llm_d_epp_request_duration_seconds",
      "End-to-end request latency.",
      REQ_LABELS,
      LATENCY_BUCKETS,
    );
    this.requestSize = h("llm_d_epp_request_size_bytes", "Request body size.", REQ_LABELS, SIZE_BUCKETS);
    this.responseSize = h("llm_d_epp_response_size_bytes", "Response body size.", REQ_LABELS, SIZE_BUCKETS);
    this.requestRunning = g("llm_d_epp_request_running", "Requests currently in flight.", REQ_LABELS);
    this.ttft = h(
      "llm_d_epp_request_ttft_seconds",
      "Time to first response byte.",
      [...REQ_LABELS, "streaming"],
      LATENCY_BUCKETS,
    );
    this.schedulerE2e = h(
      "llm_d_epp_scheduler_e2e_duration_seconds",
      "End-to-end scheduling latency.",
      [],
      SCHED_BUCKETS,
    );
    this.schedulerAttempts = c(
      "llm_d_epp_scheduler_attempts_total",
      "Scheduling attempts: status success or failure, one per scheduling decision (as llm-d's), " +
        "labelled with the endpoint picked; status retry, one per failover of a request to the next " +
        "candidate, labelled with that endpoint.",
      ["status", "target_model_name", "endpoint_name", "namespace", "port"],
    );
    this.readyEndpoints = g("llm_d_epp_ready_endpoints", "Ready endpoints in the pool.", ["name"]);
    this.avgKv = g("llm_d_epp_average_kv_cache_utilization", "Mean KV-cache utilization across the pool.", [
      "name",
    ]);
    this.avgQueue = g("llm_d_epp_average_queue_size", "Mean queue depth.", ["name"]);
    this.avgRunning = g("llm_d_epp_average_running_requests", "Mean in-flight requests.", ["name"]);
    this.perEndpointQueue = g("llm_d_epp_per_endpoint_queue_size", "Per-endpoint queue depth.", [
      "name",
      "model_server_endpoint",
    ]);
    this.pollErrors = c("llm_d_epp_datalayer_poll_errors_total", "Data-source poll failures.", [
      "source_type",
    ]);
    this.extractErrors = c("llm_d_epp_datalayer_extract_errors_total", "Extractor failures.", [
      "source_type",
      "extractor_type",
    ]);
    this.prefixSize = g(
      "llm_d_epp_prefix_indexer_size",
      "Entries in the prefix index (approximate, or precise).",
      ["plugin_name", "plugin_type"],
    );
    this.prefixHitRatio = h(
      "llm_d_epp_prefix_indexer_hit_ratio",
      "Prefix-match hit ratio per lookup.",
      ["plugin_name", "plugin_type"],
      RATIO_BUCKETS,
    );
    this.modelRewrites = c(
      "llm_d_epp_model_rewrite_decisions_total",
      "Requests whose model an InferenceModelRewrite resolved.",
      ["model_rewrite_name", "model_name", "target_model"],
    );
    this.disaggDecisions = c(
      "llm_d_epp_disagg_decision_total",
      "Disaggregation decisions: decode-only, or prefill-decode when the prefill decider approved.",
      ["plugin_name", "plugin_type", "model_name", "decision_type"],
    );
    this.pd = new PdMetrics(this.registry);
    this.httpRequests = c("kvgate_http_requests_total", "Public API requests by route, status and outcome.", [
      "route",
      "status",
      "outcome",
    ]);
    this.upstreamFailures = c(
      "kvgate_upstream_failures_total",
      "Upstream attempts that failed before the first response byte (each triggers failover).",
      ["endpoint", "kind"],
    );
    this.endpointHealthy = g("kvgate_endpoint_healthy", "1 if the endpoint is a routing candidate.", [
      "endpoint",
    ]);
    const kvLabels: KvLabels[] = ["plugin_name", "endpoint"];
    this.tokenizerCacheHits = c(
      "kvgate_tokenizer_cache_hits_total",
      "Prompt segments whose token ids came from the gateway tokenizer's prefix cache.",
      [],
    );
    this.tokenizerCacheMisses = c(
      "kvgate_tokenizer_cache_misses_total",
      "Cacheable prompt segments the gateway tokenizer had to encode.",
      [],
    );
    this.tokenizerEndpointRequests = c(
      "kvgate_tokenizer_endpoint_requests_total",
      "POST /tokenize calls to a replica (--tokenizer endpoint).",
      [],
    );
    this.tokenizerEndpointFailures = c(
      "kvgate_tokenizer_endpoint_failures_total",
      "Failed or timed-out /tokenize calls; those requests were routed without token ids.",
      [],
    );
    this.kvEventCounters = KV_EVENT_COUNTERS.map(([suffix, field, help]) => [
      field,
      c(`kvgate_kv_events_${suffix}_total`, help, kvLabels),
    ]);
    this.kvIndexEntries = g(
      "kvgate_kv_events_index_entries",
      "(block, endpoint) entries of the precise prefix index, speculative ones included.",
      kvLabels,
    );
    this.kvIndexBytesPerEntry = g(
      "kvgate_kv_events_index_bytes_per_entry",
      "Bytes of the precise index's arrays per entry held (allocated capacity / entries).",
      ["plugin_name"],
    );
  }

  /**
   * Precise-mode series from the subscribers' counters (called right before each /metrics scrape). A
   * counter restarts from 0 when its endpoint is resubscribed or the producer's config changes, which
   * Prometheus treats as a counter reset; a removed endpoint's series disappear.
   */
  setKvEvents(feeds: readonly KvEventsFeedView[]): void {
    for (const [, counter] of this.kvEventCounters) counter.reset();
    this.kvIndexEntries.reset();
    this.kvIndexBytesPerEntry.reset();
    for (const f of feeds) {
      this.kvIndexBytesPerEntry.set({ plugin_name: f.plugin }, f.indexBytesPerEntry);
      for (const [endpoint, s] of Object.entries(f.endpoints)) {
        const labels = { plugin_name: f.plugin, endpoint };
        for (const [field, counter] of this.kvEventCounters) counter.inc(labels, s[field] as number);
        this.kvIndexEntries.set(labels, s.indexEntries);
      }
    }
  }

  /** Tokenizer counters (called right before each /metrics scrape); absent sources count 0. */
  setTokenizer(
    cache: { hits: number; misses: number } | null,
    endpoint: { requests: number; failures: number } | null,
  ): void {
    const set = (counter: Counter, v: number) => {
      counter.reset();
      counter.inc(v);
    };
    set(this.tokenizerCacheHits, cache?.hits ?? 0);
    set(this.tokenizerCacheMisses, cache?.misses ?? 0);
    set(this.tokenizerEndpointRequests, endpoint?.requests ?? 0);
    set(this.tokenizerEndpointFailures, endpoint?.failures ?? 0);
  }

  /**
   * Request labels with the cardinality caps applied (client-chosen model names and fairness ids
   * past the first MAX_LABEL_VALUES read "other"); `target` is the model after any rewrite.
   */
  labels(model: string, priority: number, target = model, fairnessId = "default-flow"): ReqLabels {
    const m = cap(this.#seenModels, model);
    const t = target === model ? m : cap(this.#seenModels, target);
    const f = cap(this.#seenFairness, fairnessId);
    return { model_name: m, target_model_name: t, fairness_id: f, priority: String(priority) };
  }

  /** Pool gauges from endpoint snapshots (called right before each /metrics scrape). */
  setPool(
    pool: string,
    ready: number,
    endpoints: Array<{ id: string; eligible: boolean; waiting?: number; running?: number; kv?: number }>,
  ): void {
    this.readyEndpoints.set({ name: pool }, ready);
    this.perEndpointQueue.reset();
    this.endpointHealthy.reset();
    let n = 0;
    let kv = 0;
    let q = 0;
    let run = 0;
    for (const e of endpoints) {
      this.endpointHealthy.set({ endpoint: e.id }, e.eligible ? 1 : 0);
      if (e.waiting === undefined) continue;
      this.perEndpointQueue.set({ name: pool, model_server_endpoint: e.id }, e.waiting);
      n++;
      kv += e.kv ?? 0;
      q += e.waiting;
      run += e.running ?? 0;
    }
    this.avgKv.set({ name: pool }, n ? kv / n : 0);
    this.avgQueue.set({ name: pool }, n ? q / n : 0);
    this.avgRunning.set({ name: pool }, n ? run / n : 0);
  }

  /**
   * The exposition text, without the blank line prom-client puts between families (valid, since
   * parsers skip empty lines, but noise to a reader and to line-oriented tools).
   */
  async text(): Promise<string> {
    const raw = await this.registry.metrics();
    return `${raw
      .split("\n")
      .filter((l) => l !== "")
      .join("\n")}\n`;
  }
}

function cap(seen: Set<string>, value: string): string {
  if (seen.has(value)) return value;
  if (seen.size >= MAX_LABEL_VALUES) return "other";
  seen.add(value);
  return value;
}
