/**
 * kvgate's own P/D metrics, for the gateway's /metrics (`kvgate serve`) and the sidecar's
 * (`kvgate pd-sidecar --metrics-port`). llm-d has no counterpart: its sidecar falls back to a local
 * prefill, or strands the prefiller's blocks, without a trace in any metric. The routing decision
 * itself is llm-d's `llm_d_epp_disagg_decision_total`, in the gateway's metrics.ts.
 */
import { Counter, Histogram, type Registry } from "prom-client";

/** Why a request the router split was prefilled on its decoder after all (the `reason` label). */
export type FallbackReason =
  /** Connection refused, host unreachable or reset before an answer. */
  | "prefill-unreachable"
  /** No complete answer within --prefill-timeout. */
  | "prefill-timeout"
  /** The prefiller answered with an HTTP error (after any retries). */
  | "prefill-error"
  /** A 2xx that is not a JSON object. */
  | "prefill-invalid-response"
  /** A 2xx without kv_transfer_params: vLLM sends none when the one token ended the request (EOS). */
  | "no-kv-transfer-params"
  /** kv_transfer_params without the keys vLLM's decoder needs; passed on, and vLLM prefills locally. */
  | "incomplete-kv-transfer-params"
  /** The decoder failed before its first byte with the params (a failed KV load); asked again without. */
  | "decode-kv-load-failed";

const PREFILL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120];

export class PdMetrics {
  /** Split requests served by a local prefill on the decoder, by reason. */
  readonly fallbacks: Counter<"reason">;
  /** Prefill-leg failures returned to the client (--prefill-failure-policy fail), by reason. */
  readonly prefillFailures: Counter<"reason">;
  /** Prefill retries after a 502/503/504 or a lost connection (--prefill-max-retries). */
  readonly prefillRetries: Counter;
  /** Prefill legs by how they ended: kv-transfer, fallback, failed, client-gone. */
  readonly prefillLegs: Counter<"outcome">;
  readonly prefillDuration: Histogram;
  /** Clients gone between the legs whose prefilled blocks kvgate released (result: released, failed). */
  readonly releases: Counter<"result">;
  /** Sidecar: prefill targets refused by SSRF protection (403). */
  readonly ssrfRejections: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    this.fallbacks = new Counter({
      name: "kvgate_pd_fallbacks_total",
      help: "Requests the router sent to a prefiller that were prefilled locally on the decoder instead, by reason.",
      labelNames: ["reason"],
      registers,
    });
    this.prefillFailures = new Counter({
      name: "kvgate_pd_prefill_failures_total",
      help: "Prefill-leg failures returned to the client (prefill failure policy fail), by reason.",
      labelNames: ["reason"],
      registers,
    });
    this.prefillRetries = new Counter({
      name: "kvgate_pd_prefill_retries_total",
      help: "Prefill requests retried after a 502, 503, 504 or a lost connection.",
      registers,
    });
    this.prefillLegs = new Counter({
      name: "kvgate_pd_prefill_legs_total",
      help: "Prefill legs by outcome: kv-transfer (the decoder got the prefiller's KV), fallback, failed, client-gone.",
      labelNames: ["outcome"],
      registers,
    });
    this.prefillDuration = new Histogram({
      name: "kvgate_pd_prefill_duration_seconds",
      help: "Time of the prefill leg, retries included, until the prefiller's answer was read.",
      buckets: PREFILL_BUCKETS,
      registers,
    });
    this.releases = new Counter({
      name: "kvgate_pd_disconnect_releases_total",
      help: "Clients that left between the two legs: the prefilled blocks were released through a one-token decode.",
      labelNames: ["result"],
      registers,
    });
    this.ssrfRejections = new Counter({
      name: "kvgate_pd_ssrf_rejections_total",
      help: "Prefill targets outside the allowlist, refused with 403 (pd-sidecar SSRF protection).",
      registers,
    });
  }
}
