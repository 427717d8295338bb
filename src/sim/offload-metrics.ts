/**
 * The CPU offload tier's Prometheus metrics as vLLM exports them, registered on the replica's own
 * registry only when the tier is on. From vLLM's OffloadingConnector
 * (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py): the per-direction
 * `vllm:kv_offload_total_bytes`, `vllm:kv_offload_total_time` (counters) and `vllm:kv_offload_size`
 * (histogram) labelled transfer_type "GPU_to_CPU" / "CPU_to_GPU", which newer vLLM still emits for
 * CPU specs beside the flat `vllm:kv_offload_{load,store}_{bytes,time}` counters and
 * `vllm:kv_offload_{load,store}_size` histograms; `vllm:kv_offload_allocation_failure` (stores
 * skipped for lack of room). prometheus_client appends `_total` to counters in the exposition, so
 * the names here carry it. From the scheduler (vllm/v1/metrics/loggers.py):
 * `vllm:external_prefix_cache_{queries,hits}_total`, tokens looked up in and found by the connector.
 * Times are simulated seconds.
 */
import { Counter, Histogram, type Registry } from "prom-client";
import type { OffloadCounters, OffloadTransfer } from "../engine/cpu-tier.ts";

/** vLLM's kv_offload size buckets, bytes. */
export const KV_OFFLOAD_SIZE_BUCKETS = [1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6];

type Labels = { model_name: string; engine: string };

export class OffloadMetrics {
  private readonly c: Record<string, Counter<string>> = {};
  private readonly h: Record<string, Histogram<string>> = {};
  private readonly last = new Map<string, number>();

  constructor(
    registry: Registry,
    private readonly labels: Labels,
    private readonly counters: () => OffloadCounters | undefined,
    private readonly transfers: () => OffloadTransfer[],
  ) {
    const registers = [registry];
    const names = ["model_name", "engine"];
    const typed = [...names, "transfer_type"];
    const counter = (name: string, help: string, labelNames = names) =>
      (this.c[name] = new Counter({ name, help, labelNames, registers }));
    const hist = (name: string, help: string, labelNames = names) =>
      (this.h[name] = new Histogram({ name, help, labelNames, buckets: KV_OFFLOAD_SIZE_BUCKETS, registers }));
    counter("vllm:external_prefix_cache_queries_total", "Tokens looked up in the KV connector's cache.");
    counter("vllm:external_prefix_cache_hits_total", "Tokens found in the KV connector's cache.");
    counter("vllm:kv_offload_total_bytes_total", "Number of bytes offloaded by KV connector", typed);
    counter("vllm:kv_offload_total_time_total", "Total time measured by all KV offloading operations", typed);
    hist("vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.", typed);
    counter("vllm:kv_offload_load_bytes_total", "Bytes loaded from the CPU tier to the GPU.");
    counter("vllm:kv_offload_store_bytes_total", "Bytes stored from the GPU to the CPU tier.");
    counter("vllm:kv_offload_load_time_total", "Seconds spent loading from the CPU tier.");
    counter("vllm:kv_offload_store_time_total", "Seconds spent storing to the CPU tier.");
    hist("vllm:kv_offload_load_size", "Size of CPU-tier loads, bytes.");
    hist("vllm:kv_offload_store_size", "Size of CPU-tier stores, bytes.");
    counter("vllm:kv_offload_allocation_failure_total", "Stores skipped: the CPU tier had no room.");
    for (const [name, c] of Object.entries(this.c)) {
      if (name.includes("_total_")) for (const t of TYPES) c.inc({ ...labels, transfer_type: t }, 0);
      else c.inc(labels, 0);
    }
    for (const [name, h] of Object.entries(this.h)) {
      if (name === "vllm:kv_offload_size") for (const t of TYPES) h.zero({ ...labels, transfer_type: t });
      else h.zero(labels);
    }
  }

  private set(name: string, value: number, labels: Record<string, string> = this.labels): void {
    const key = `${name}|${labels["transfer_type"] ?? ""}`;
    const prev = this.last.get(key) ?? 0;
    if (value > prev) this.c[name]!.inc(labels, value - prev);
    this.last.set(key, Math.max(prev, value));
  }

  /** Pulls the tier's counters and the copies since the last call into the registry. */
  refresh(): void {
    const s = this.counters();
    if (s === undefined) return;
    const l = this.labels;
    this.set("vllm:external_prefix_cache_queries_total", s.externalQueries);
    this.set("vllm:external_prefix_cache_hits_total", s.externalHits);
    this.set("vllm:kv_offload_load_bytes_total", s.loadBytes);
    this.set("vllm:kv_offload_store_bytes_total", s.storeBytes);
    this.set("vllm:kv_offload_load_time_total", s.loadTime);
    this.set("vllm:kv_offload_store_time_total", s.storeTime);
    this.set("vllm:kv_offload_allocation_failure_total", s.allocationFailures);
    const load = { ...l, transfer_type: "CPU_to_GPU" };
    const store = { ...l, transfer_type: "GPU_to_CPU" };
    this.set("vllm:kv_offload_total_bytes_total", s.loadBytes, load);
    this.set("vllm:kv_offload_total_bytes_total", s.storeBytes, store);
    this.set("vllm:kv_offload_total_time_total", s.loadTime, load);
    this.set("vllm:kv_offload_total_time_total", s.storeTime, store);
    for (const t of this.transfers()) {
      const isLoad = t.kind === "load";
      this.h[isLoad ? "vllm:kv_offload_load_size" : "vllm:kv_offload_store_size"]!.observe(l, t.bytes);
      this.h["vllm:kv_offload_size"]!.observe(isLoad ? load : store, t.bytes);
    }
  }
}

const TYPES = ["CPU_to_GPU", "GPU_to_CPU"] as const;
