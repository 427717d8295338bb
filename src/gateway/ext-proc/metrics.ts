/**
 * The ext_proc server's metrics beside the gateway's (same registry, same /metrics): llm-d's token
 * histograms (llm-d/llm-d-router@ebab6879 docs/metrics.md: `llm_d_epp_request_input_tokens`,
 * `llm_d_epp_request_output_tokens`, from the usage the response carries), and kvgate's count of
 * ext_proc streams by how they ended plus the streams open now. With several pools the stream
 * families are the server's (the front's registry) and the token histograms each pool's.
 */
import { Counter, Gauge, Histogram, type Registry } from "prom-client";

const REQ_LABELS = ["model_name", "target_model_name", "fairness_id", "priority"] as const;
const TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072];

export type StreamOutcome =
  | "completed"
  | "rejected"
  | "client-disconnect"
  | "protocol-error"
  | "internal-error"
  | "passthrough";

/** ext_proc streams: how they ended, and how many are open. */
export class EppStreamMetrics {
  readonly streams: Counter<"outcome">;
  readonly active: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.streams = new Counter({
      name: "kvgate_ext_proc_streams_total",
      help: "ext_proc Process streams by how they ended.",
      labelNames: ["outcome"],
      registers,
    });
    this.active = new Gauge({
      name: "kvgate_ext_proc_active_streams",
      help: "ext_proc Process streams open now.",
      registers,
    });
  }
}

/** Tokens per request, from the response's usage (one pool's). */
export class EppTokenMetrics {
  readonly inputTokens: Histogram<(typeof REQ_LABELS)[number]>;
  readonly outputTokens: Histogram<(typeof REQ_LABELS)[number]>;

  constructor(registry: Registry) {
    const registers = [registry];
    this.inputTokens = new Histogram({
      name: "llm_d_epp_request_input_tokens",
      help: "Prompt tokens per request, from the response's usage.",
      labelNames: REQ_LABELS,
      buckets: TOKEN_BUCKETS,
      registers,
    });
    this.outputTokens = new Histogram({
      name: "llm_d_epp_request_output_tokens",
      help: "Completion tokens per request, from the response's usage.",
      labelNames: REQ_LABELS,
      buckets: TOKEN_BUCKETS,
      registers,
    });
  }
}
