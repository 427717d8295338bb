/**
 * The NIXL connector's Prometheus metrics as vLLM exports them (vllm/distributed/kv_transfer/
 * kv_connector/v1/nixl/stats.py `NixlPromMetrics`, documented under "NIXL KV Connector Metrics"):
 * per engine (labels model_name, engine), recorded on the side that performs the transfer (the
 * decoder, in pull mode), except vllm:nixl_num_kv_expired_reqs, counted on the prefiller. Durations
 * are simulated seconds. Registered on the replica's own registry only with a NixlConnector.
 * vllm:nixl_num_descriptors is not exported: the simulator has no memory-region layout to count.
 */
import { Counter, Histogram, type Registry } from "prom-client";

/** vLLM's nixl_xfer_time_seconds buckets. */
export const NIXL_XFER_TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0];
/** vLLM's nixl_post_time_seconds buckets: the transfer-time list with 0.001 in front. */
export const NIXL_POST_TIME_BUCKETS = [0.001, ...NIXL_XFER_TIME_BUCKETS];
/** vLLM's nixl_bytes_transferred buckets: 2**(10+i) for i = 1, 3, ..., 23 (2 KiB to 8 GiB). */
export const NIXL_BYTES_BUCKETS = Array.from({ length: 12 }, (_, k) => 2 ** (11 + 2 * k));

export class NixlMetrics {
  private readonly labels: { model_name: string; engine: string };
  private readonly xferTime: Histogram<string>;
  private readonly postTime: Histogram<string>;
  private readonly bytes: Histogram<string>;
  private readonly failedTransfers: Counter<string>;
  private readonly failedNotifications: Counter<string>;
  private readonly expired: Counter<string>;

  constructor(registry: Registry, labels: { model_name: string; engine: string }) {
    this.labels = labels;
    const registers = [registry];
    const labelNames = ["model_name", "engine"];
    const hist = (name: string, help: string, buckets: number[]) =>
      new Histogram({ name, help, labelNames, buckets, registers });
    const counter = (name: string, help: string) => new Counter({ name, help, labelNames, registers });
    this.xferTime = hist(
      "vllm:nixl_xfer_time_seconds",
      "Histogram of transfer duration for NIXL KV Cache transfers.",
      NIXL_XFER_TIME_BUCKETS,
    );
    this.postTime = hist(
      "vllm:nixl_post_time_seconds",
      "Histogram of transfer post time for NIXL KV Cache transfers.",
      NIXL_POST_TIME_BUCKETS,
    );
    this.bytes = hist(
      "vllm:nixl_bytes_transferred",
      "Histogram of bytes transferred per NIXL KV Cache transfers.",
      NIXL_BYTES_BUCKETS,
    );
    // prom-client adds no suffix: the declared names carry vLLM's exposed `_total`.
    this.failedTransfers = counter(
      "vllm:nixl_num_failed_transfers_total",
      "Number of failed NIXL KV Cache transfers.",
    );
    this.failedNotifications = counter(
      "vllm:nixl_num_failed_notifications_total",
      "Number of failed NIXL KV Cache notifications.",
    );
    this.expired = counter(
      "vllm:nixl_num_kv_expired_reqs_total",
      "Number of requests that had their KV expire before a decoder read them.",
    );
    for (const h of [this.xferTime, this.postTime, this.bytes]) h.zero(labels);
    for (const c of [this.failedTransfers, this.failedNotifications, this.expired]) c.inc(labels, 0);
  }

  /** One completed transfer: modelled seconds from post to completion, post time, bytes. */
  observeTransfer(seconds: number, postSeconds: number, bytes: number): void {
    this.xferTime.observe(this.labels, seconds);
    this.postTime.observe(this.labels, postSeconds);
    this.bytes.observe(this.labels, bytes);
  }

  failedTransfer(): void {
    this.failedTransfers.inc(this.labels);
  }

  failedNotification(): void {
    this.failedNotifications.inc(this.labels);
  }

  expiredRequests(n: number): void {
    if (n > 0) this.expired.inc(this.labels, n);
  }
}
