/**
 * Fault injection for the simulated replica, so gateways and benchmarks can be tested against a
 * replica that dies, slows down, fails requests or serves broken metrics:
 * - crashAfter N: the replica dies hard while serving its N-th generation request, right after that
 *   request's first output went out, so it and every other open stream are cut mid-way;
 * - extraLatency S: every generation request is held S simulated seconds before the engine sees it
 *   (adds to TTFT, queue and e2e time);
 * - errorRate P: that fraction of generation requests is answered 500 (seeded, reproducible);
 * - metrics "stall" (GET /metrics never answers) or "garbled" (200 with text that is not an exposition).
 */
import { Rng } from "../engine/output-tokens.ts";

export type MetricsFault = "stall" | "garbled";

export interface FaultOptions {
  crashAfter: number | null;
  extraLatency: number;
  errorRate: number;
  metrics: MetricsFault | null;
}

export const NO_FAULTS: FaultOptions = { crashAfter: null, extraLatency: 0, errorRate: 0, metrics: null };

/** Body served by `--fault-metrics garbled`: not parseable as Prometheus text. */
export const GARBLED_METRICS =
  'vllm:num_requests_running{model_name="\n# TYPE vllm:kv_cache_usage_perc histogram gauge\n' +
  "vllm:kv_cache_usage_perc{engine=0} zero point four\n\u0000\u00ff}{ 1 2 3\n";

/** Checks fault options; returns an error message naming the flag, or null. */
export function checkFaultOptions(f: FaultOptions): string | null {
  if (f.crashAfter !== null && !(Number.isInteger(f.crashAfter) && f.crashAfter >= 1))
    return "--fault-crash-after must be an integer ≥ 1";
  if (!(Number.isFinite(f.extraLatency) && f.extraLatency >= 0))
    return "--fault-extra-latency must be a number ≥ 0";
  if (!(Number.isFinite(f.errorRate) && f.errorRate >= 0 && f.errorRate <= 1))
    return "--fault-error-rate must be a number in [0, 1]";
  if (f.metrics !== null && f.metrics !== "stall" && f.metrics !== "garbled")
    return "--fault-metrics must be stall or garbled";
  return null;
}

/** Per-replica fault state: the request counter and a seeded random stream for the error rate. */
export class Faults {
  readonly opts: FaultOptions;
  private requests = 0;
  private readonly rng: Rng;
  private crashed = false;
  private readonly crash: () => void;

  constructor(opts: FaultOptions, seed: number, crash: () => void) {
    this.opts = opts;
    this.rng = new Rng((seed ^ 0x5bd1e995) >>> 0 || 1);
    this.crash = crash;
  }

  /** A small deterministic stream, independent of the engine's. */
  private random(): number {
    return this.rng.next();
  }

  /** Called once per generation request; returns its 1-based ordinal. */
  startRequest(): number {
    return ++this.requests;
  }

  /** Whether this request should be answered 500 (draws from the stream only when a rate is set). */
  shouldFail(): boolean {
    return this.opts.errorRate > 0 && this.random() < this.opts.errorRate;
  }

  /** Simulated seconds to hold a request before admission. */
  get extraLatency(): number {
    return this.opts.extraLatency;
  }

  /** Called after a request's first output was written; crashes on the configured ordinal. */
  afterFirstOutput(ordinal: number): void {
    if (this.crashed || this.opts.crashAfter === null || ordinal < this.opts.crashAfter) return;
    this.crashed = true;
    this.crash();
  }

  get hasCrashed(): boolean {
    return this.crashed;
  }
}
