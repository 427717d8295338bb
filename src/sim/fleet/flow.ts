/**
 * Flow control in the fleet simulator: requests wait at the simulated gateway in the same pure
 * FlowController the gateway runs (src/flow/flow-control.ts), and are dispatched to the scheduler
 * when the configured saturation detector lets them go, as src/gateway/flow-gate.ts does in real
 * time — concurrency-detector from the requests this gateway has in flight (exact),
 * utilization-detector from the endpoints' metrics as of the last scrape. Dispatch is re-tried
 * whenever something can change the answer: an arrival, a response's end, a scrape, and the TTL
 * sweep (once a virtual second while anything is queued, as llm-d's), and — with a prefill reserve —
 * a long prefill's first token. Outcomes and statuses are
 * the gateway's: 429 rejected-saturated for a full band, 503 rejected-ttl-expired after the TTL.
 * The fleet (fleet.ts) calls it only through the few methods below.
 */
import type { RequestSpec } from "../../bench/workloads/types.ts";
import { priorityOf } from "../../flow/admission.ts";
import { ConcurrencyDetector } from "../../flow/concurrency-detector.ts";
import { FlowController, type FlowRequest, type Rejection } from "../../flow/flow-control.ts";
import { UtilizationDetector } from "../../flow/utilization-detector.ts";
import type { Scheduler } from "../../scheduler/scheduler.ts";
import type { EndpointState } from "../../scheduler/types.ts";

/** Seconds between TTL sweeps while anything is queued (llm-d's expiry sweep). */
export const FLOW_SWEEP_S = 1;

export interface FlowSimStats {
  enqueued: number;
  dispatched: number;
  /** Dispatched without waiting (the gate was open on arrival). */
  dispatchedAtOnce: number;
  rejected: Record<string, number>;
  peakQueued: number;
  /** Seconds waited by dispatched requests: sum and max. */
  waitSum: number;
  waitMax: number;
}

export class FlowSim {
  readonly controller: FlowController;
  readonly #concurrency: ConcurrencyDetector | null;
  readonly #utilization: UtilizationDetector | null;
  readonly #objectives: ReadonlyMap<string, number>;
  /** Dispatched and not finished, by request id (concurrency-detector counts these). */
  readonly #inflight = new Map<string, FlowRequest>();
  #inflightTokens = 0;
  readonly stats: FlowSimStats = {
    enqueued: 0,
    dispatched: 0,
    dispatchedAtOnce: 0,
    rejected: {},
    peakQueued: 0,
    waitSum: 0,
    waitMax: 0,
  };

  /** Flow control of `scheduler`'s config, or null when its flowControl gate is off. */
  static of(scheduler: Scheduler): FlowSim | null {
    const c = scheduler.config;
    if (c.flowControl === null) return null;
    const d = scheduler.plugins.get(c.saturationDetector);
    if (!(d instanceof ConcurrencyDetector || d instanceof UtilizationDetector))
      throw new Error(
        `saturation detector "${c.saturationDetector}" is neither concurrency-detector nor utilization-detector; flow control in the simulator needs one of them`,
      );
    return new FlowSim(new FlowController(c.flowControl), d, new Map(Object.entries(c.objectives)));
  }

  constructor(
    controller: FlowController,
    detector: ConcurrencyDetector | UtilizationDetector,
    objectives: ReadonlyMap<string, number>,
  ) {
    this.controller = controller;
    this.#concurrency = detector instanceof ConcurrencyDetector ? detector : null;
    this.#utilization = detector instanceof UtilizationDetector ? detector : null;
    this.#objectives = objectives;
  }

  get inflight(): number {
    return this.#inflight.size;
  }

  saturation(candidates: readonly EndpointState[], now: number): number {
    if (this.#concurrency)
      return this.#concurrency.saturation(this.#inflight.size, this.#inflightTokens, candidates.length);
    return (this.#utilization as UtilizationDetector).saturation(candidates, now);
  }

  /** The request as flow control sees it: the gateway's fairness id, priority and SLO rules. */
  request(spec: RequestSpec, promptTokens: number, now: number): FlowRequest {
    const t = spec.tags;
    const bytes =
      (spec.prompt?.length ?? 0) + (spec.messages ?? []).reduce((a, m) => a + (m.content?.length ?? 0), 0);
    return {
      id: spec.id,
      // As the gateway's fairnessIdOf: the tenant, else the objective, else "default-flow".
      fairnessId: t?.tenant ?? t?.objective ?? "default-flow",
      priority: priorityOf(this.#objectives, t?.objective),
      bytes: bytes + 128,
      receivedAt: now,
      promptTokens,
      ...(t?.sloTtftMs !== undefined ? { sloTtftMs: t.sloTtftMs } : {}),
    };
  }

  /** Queues the request, or says why not (its band is full). */
  enqueue(req: FlowRequest, now: number, candidates: readonly EndpointState[]): Rejection | null {
    const rej = this.controller.enqueue(req, now, candidates.length === 0);
    if (rej) {
      const k = `${rej.status} ${rej.reason}`;
      this.stats.rejected[k] = (this.stats.rejected[k] ?? 0) + 1;
      return rej;
    }
    this.stats.enqueued++;
    this.stats.peakQueued = Math.max(this.stats.peakQueued, this.controller.size);
    return null;
  }

  /** Every request the gate lets go now, in dispatch order (each then counts as in flight). */
  dispatch(now: number, candidates: readonly EndpointState[]): FlowRequest[] {
    const out: FlowRequest[] = [];
    const ids = candidates.map((c) => c.id);
    for (;;) {
      const d = this.controller.dispatch(now, this.saturation(candidates, now), ids);
      if (d === null) return out;
      this.#inflight.set(d.request.id, d.request);
      this.#inflightTokens += d.request.promptTokens;
      this.stats.dispatched++;
      if (d.waited === 0) this.stats.dispatchedAtOnce++;
      this.stats.waitSum += d.waited;
      this.stats.waitMax = Math.max(this.stats.waitMax, d.waited);
      out.push(d.request);
    }
  }

  /** Requests whose queue TTL is spent, removed from the queue. */
  expire(now: number, candidates: readonly EndpointState[]): Array<{ id: string; rejection: Rejection }> {
    return this.controller.expire(now, candidates.length === 0).map((e) => {
      const k = `${e.rejection.status} ${e.rejection.reason}`;
      this.stats.rejected[k] = (this.stats.rejected[k] ?? 0) + 1;
      return { id: e.request.id, rejection: e.rejection };
    });
  }

  /** The scheduler sent dispatched request `id` to `endpoint` (the prefill reserve's bookkeeping). */
  placed(id: string, endpoint: string): void {
    this.controller.placed(id, endpoint);
  }

  /** Request `id`'s first token came back: true if a long prefill ended (the gate may open). */
  prefilled(id: string): boolean {
    return this.controller.prefillEnded(id);
  }

  /**
   * A dispatched request ended: with its usage (its response finished: output tokens charged to
   * its flow) or without (it was never served). False if flow control did not dispatch it.
   */
  finished(id: string, usage: { promptTokens: number; outputTokens: number } | null): boolean {
    const f = this.#inflight.get(id);
    if (f === undefined) return false;
    this.#inflight.delete(id);
    this.controller.prefillEnded(id);
    this.#inflightTokens -= f.promptTokens;
    if (usage)
      this.controller.completed(
        f.fairnessId,
        f.priority,
        usage.outputTokens,
        usage.promptTokens - f.promptTokens,
      );
    else this.controller.released(f.fairnessId, f.priority);
    return true;
  }

  /** The run's flow-control figures, for the results file. */
  summary(): Record<string, unknown> {
    const s = this.stats;
    return {
      enqueued: s.enqueued,
      dispatched: s.dispatched,
      dispatched_at_once: s.dispatchedAtOnce,
      rejected: s.rejected,
      peak_queued: s.peakQueued,
      wait_mean_s: s.dispatched > 0 ? s.waitSum / s.dispatched : null,
      wait_max_s: s.waitMax,
    };
  }
}
