/**
 * Flow-control metrics on the gateway's registry, by llm-d's names (llm-d/llm-d-router docs/metrics.md,
 * "Flow Control"): llm_d_epp_flow_control_requests_total{outcome,priority,fairness_id},
 * llm_d_epp_flow_control_request_queue_duration_seconds{outcome,priority,fairness_id},
 * llm_d_epp_flow_control_queue_size / _queue_bytes{inference_pool,priority,fairness_id} and
 * llm_d_epp_flow_control_pool_saturation{inference_pool}; kvgate's own kvgate_flow_oldest_age_seconds
 * and kvgate_flow_served_tokens{priority,fairness_id}. Queue gauges are read from the current routing's
 * gate at scrape time. fairness_id values are capped at 1000 distinct, then "other".
 */
import { Counter, Gauge, Histogram } from "prom-client";
import type { FlowRequest, QueueOutcome } from "../flow/flow-control.ts";
import { flowGateOf } from "./flow-gate.ts";
import type { Gateway } from "./gateway.ts";

const MAX_IDS = 1000;
const QUEUE_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120];

export class FlowMetrics {
  readonly #ids = new Set<string>();
  readonly requests: Counter<"outcome" | "priority" | "fairness_id">;
  readonly queueDuration: Histogram<"outcome" | "priority" | "fairness_id">;

  constructor(gw: Gateway) {
    const registers = [gw.metrics.registry];
    this.requests = new Counter({
      name: "llm_d_epp_flow_control_requests_total",
      help: "Requests that left the flow-control layer, by outcome.",
      labelNames: ["outcome", "priority", "fairness_id"],
      registers,
    });
    this.queueDuration = new Histogram({
      name: "llm_d_epp_flow_control_request_queue_duration_seconds",
      help: "Time a request spent in the flow-control queue, by outcome.",
      labelNames: ["outcome", "priority", "fairness_id"],
      buckets: QUEUE_BUCKETS,
      registers,
    });
    const view = () => flowGateOf(gw)?.snapshot() ?? null;
    const perFlow = (field: "depth" | "bytes" | "oldestAgeSeconds" | "servedTokens", withPool: boolean) =>
      function (this: Gauge<string>) {
        this.reset();
        const v = view();
        for (const b of v?.bands ?? [])
          for (const f of b.flows)
            this.set(
              {
                ...(withPool ? { inference_pool: gw.opts.poolName } : {}),
                priority: String(b.priority),
                fairness_id: f.fairnessId,
              },
              f[field],
            );
      };
    new Gauge({
      name: "llm_d_epp_flow_control_queue_size",
      help: "Requests queued in flow control, per band and flow.",
      labelNames: ["inference_pool", "priority", "fairness_id"],
      registers,
      collect: perFlow("depth", true),
    });
    new Gauge({
      name: "llm_d_epp_flow_control_queue_bytes",
      help: "Bytes of requests queued in flow control, per band and flow.",
      labelNames: ["inference_pool", "priority", "fairness_id"],
      registers,
      collect: perFlow("bytes", true),
    });
    new Gauge({
      name: "kvgate_flow_oldest_age_seconds",
      help: "Age of the oldest queued request, per band and flow (0 when the flow is empty).",
      labelNames: ["priority", "fairness_id"],
      registers,
      collect: perFlow("oldestAgeSeconds", false),
    });
    new Gauge({
      name: "kvgate_flow_served_tokens",
      help: "Prompt and output tokens served per flow since it became active (what fairness accounts).",
      labelNames: ["priority", "fairness_id"],
      registers,
      collect: perFlow("servedTokens", false),
    });
    new Gauge({
      name: "llm_d_epp_flow_control_pool_saturation",
      help: "Pool saturation the flow-control gate sees (≥ 1 saturated).",
      labelNames: ["inference_pool"],
      registers,
      collect(this: Gauge<string>) {
        this.reset();
        const v = view();
        if (v) this.set({ inference_pool: gw.opts.poolName }, v.saturation);
      },
    });
  }

  #id(id: string): string {
    if (this.#ids.has(id)) return id;
    if (this.#ids.size >= MAX_IDS) return "other";
    this.#ids.add(id);
    return id;
  }

  outcome(req: FlowRequest, outcome: QueueOutcome, waited: number): void {
    const l = { outcome, priority: String(req.priority), fairness_id: this.#id(req.fairnessId) };
    this.requests.inc(l);
    this.queueDuration.observe(l, waited);
  }
}

const byGateway = new WeakMap<Gateway, FlowMetrics>();

export function flowMetricsOf(gw: Gateway): FlowMetrics {
  let m = byGateway.get(gw);
  if (!m) {
    m = new FlowMetrics(gw);
    byGateway.set(gw, m);
  }
  return m;
}
