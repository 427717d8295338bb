/**
 * The front door's own Prometheus metrics (`kvgate serve --pools`), on the admin port's /metrics:
 * requests handed to each pool, and requests the front door answered itself with an error (unknown
 * model, bad body, connection limit, shutdown, no route). Each pool's own metrics stay under
 * /pools/<name>/metrics, since the pools' families share names and one exposition cannot repeat them.
 */
import { Counter, Registry } from "prom-client";

export class FrontMetrics {
  readonly registry = new Registry();
  readonly routed = new Counter({
    name: "kvgate_front_door_requests_total",
    help: "Requests the front door handed to a pool, by pool.",
    labelNames: ["pool"] as const,
    registers: [this.registry],
  });
  readonly rejected = new Counter({
    name: "kvgate_front_door_rejections_total",
    help: "Requests the front door answered with an error itself, by HTTP status and reason.",
    labelNames: ["status", "reason"] as const,
    registers: [this.registry],
  });

  readonly reloads = new Counter({
    name: "kvgate_front_door_pools_reloads_total",
    help: "Reloads of the pools file, by result (ok, or rejected: the previous pools kept).",
    labelNames: ["result"] as const,
    registers: [this.registry],
  });

  /** Counts one rejection; `reason` is a short fixed word (never request data). */
  reject(status: number, reason: string): void {
    this.rejected.inc({ status: String(status), reason });
  }

  async text(): Promise<string> {
    return this.registry.metrics();
  }
}
