/**
 * The gateway side of flow control (src/flow/flow-control.ts is the pure queue): with the
 * `flowControl` feature gate a request waits here until the pool's saturation detector lets it go,
 * then is scheduled against the endpoints as they are at that moment (late binding, as llm-d).
 * The gate is re-checked on a short timer while anything is queued, and whenever a response
 * completes; a client that disconnects while queued leaves the queue at once; a draining gateway
 * rejects what is queued (503 rejected-shutting-down). The response's token usage is reported back
 * (flow-usage.ts) so token-weighted fairness (VTC) charges output. For vtc-fairness-policy's
 * prefill reserve the gate also learns where each dispatched request went (placeFlow, after the
 * pick) and when its first response byte came back (prefilledFlow), and re-checks the gate then.
 * Without the gate, llm-d's legacy admission applies unchanged (429 for a sheddable request at
 * saturation ≥ 1). The fairness id (x-llm-d-inference-fairness-id, alias
 * x-gateway-inference-fairness-id; else the objective's name; else "default-flow") only picks the
 * queue a request waits in, never an endpoint.
 */
import type { IncomingHttpHeaders } from "node:http";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import { ConcurrencyDetector } from "../flow/concurrency-detector.ts";
import { FlowController, type FlowRequest, type FlowsView, type Rejection } from "../flow/flow-control.ts";
import type { Prepared } from "./decide.ts";
import { hostOf } from "./decide.ts";
import { GatewayError } from "./errors.ts";
import { flowMetricsOf } from "./flow-metrics.ts";
import type { Gateway } from "./gateway.ts";
import { headerValue } from "./headers.ts";
import type { Routing } from "./routing.ts";

/** How often a non-empty queue re-checks saturation and TTLs (llm-d: a 1 ms ticker, 1 s TTL sweep). */
export const FLOW_TICK_MS = 5;
const MAX_FAIRNESS_ID = 128;
/** TTLs are checked this often (seconds; llm-d sweeps every second). */
const EXPIRY_SWEEP_S = 0.1;
/** Dispatched requests whose response never reported back are forgotten after this (seconds). */
const INFLIGHT_FORGET_S = 3600;

interface InFlight {
  req: FlowRequest;
  at: number;
  gate: FlowGate;
}
const inflightByGateway = new WeakMap<Gateway, Map<string, InFlight>>();

type Outcome = { ok: true } | { ok: false; rejection: Rejection | null };

interface Waiter {
  resolve(o: Outcome): void;
  detach(): void;
}

export class FlowGate {
  readonly controller: FlowController;
  readonly #gw: Gateway;
  readonly #routing: Routing;
  readonly #waiters = new Map<string, Waiter>();
  /** Dispatched and not yet finished, shared by every routing's gate of this gateway (reloads). */
  readonly #inflight: Map<string, InFlight>;
  #timer: ReturnType<typeof setInterval> | null = null;
  #lastSweep = 0;
  /** concurrency-detector: saturation from this gate's own in-flight requests. */
  readonly #concurrency: ConcurrencyDetector | null;

  constructor(gw: Gateway, routing: Routing) {
    this.#gw = gw;
    this.#routing = routing;
    let shared = inflightByGateway.get(gw);
    if (!shared) inflightByGateway.set(gw, (shared = new Map()));
    this.#inflight = shared;
    const d = routing.scheduler.plugins.get(routing.scheduler.config.saturationDetector);
    this.#concurrency = d instanceof ConcurrencyDetector ? d : null;
    this.controller = new FlowController(
      routing.scheduler.config.flowControl as NonNullable<Routing["scheduler"]["config"]["flowControl"]>,
    );
  }

  /**
   * Pool saturation (the configured detector over every ready endpoint), whether the pool is empty,
   * and the ready endpoints' ids (the prefill reserve counts the ones free of long prefills).
   */
  saturation(now: number): { value: number; empty: boolean; ids: string[] } {
    const c = this.#gw.data.store.candidates(null, now);
    const eps = c.ok ? c.candidates : [];
    let value: number;
    if (this.#concurrency) {
      let tokens = 0;
      for (const f of this.#inflight.values()) tokens += f.req.promptTokens;
      value = this.#concurrency.saturation(this.#inflight.size, tokens, eps.length);
    } else value = this.#routing.admission.detector.saturation(eps, now);
    return { value, empty: eps.length === 0, ids: eps.map((e) => e.id) };
  }

  /** Queues `req` and resolves once it is dispatched, rejected, expired or its client is gone. */
  wait(req: FlowRequest, signal: AbortSignal | undefined): Promise<Outcome> {
    const now = monotonicSeconds();
    const m = flowMetricsOf(this.#gw);
    if (this.#gw.draining) return Promise.resolve({ ok: false, rejection: SHUTTING_DOWN });
    const sat = this.saturation(now);
    const rej = this.controller.enqueue(req, now, sat.empty);
    if (rej) {
      m.outcome(req, rej.outcome, 0);
      return Promise.resolve({ ok: false, rejection: rej });
    }
    const p = new Promise<Outcome>((resolve) => {
      const onAbort = () => {
        const left = this.controller.remove(req.id, monotonicSeconds());
        if (left) m.outcome(req, left.outcome, left.waited);
        this.#settle(req.id, { ok: false, rejection: null });
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiters.set(req.id, { resolve, detach: () => signal?.removeEventListener("abort", onAbort) });
      if (signal?.aborted) onAbort();
    });
    this.pump();
    return p;
  }

  #settle(id: string, o: Outcome): void {
    const w = this.#waiters.get(id);
    if (!w) return;
    this.#waiters.delete(id);
    w.detach();
    w.resolve(o);
  }

  /** One pass: expire, dispatch while the gate is open, arm or disarm the timer. */
  pump(): void {
    const now = monotonicSeconds();
    const m = flowMetricsOf(this.#gw);
    if (this.#gw.draining) {
      for (const id of [...this.#waiters.keys()]) {
        const left = this.controller.remove(id, now);
        if (left) m.outcome(left.request, "RejectedOther", left.waited);
        this.#settle(id, { ok: false, rejection: SHUTTING_DOWN });
      }
    }
    let sat = this.saturation(now);
    if (now - this.#lastSweep >= EXPIRY_SWEEP_S) {
      this.#lastSweep = now;
      for (const e of this.controller.expire(now, sat.empty)) {
        m.outcome(e.request, e.outcome, e.waited);
        this.#settle(e.request.id, { ok: false, rejection: e.rejection });
      }
    }
    for (
      let d = this.controller.dispatch(now, sat.value, sat.ids);
      d;
      d = this.controller.dispatch(now, sat.value, sat.ids)
    ) {
      m.outcome(d.request, d.outcome, d.waited);
      this.#inflight.set(d.request.id, { req: d.request, at: now, gate: this });
      this.#settle(d.request.id, { ok: true });
      sat = this.saturation(now);
    }
    for (const [id, f] of this.#inflight)
      if (now - f.at > INFLIGHT_FORGET_S) {
        this.#inflight.delete(id);
        f.gate.controller.prefillEnded(id);
      }
    this.controller.gc(now);
    if (this.controller.size > 0 && this.#timer === null) {
      this.#timer = setInterval(() => this.pump(), FLOW_TICK_MS);
      this.#timer.unref();
    } else if (this.controller.size === 0 && this.#timer !== null) {
      clearInterval(this.#timer);
      this.#timer = null;
    }
  }

  /**
   * A dispatched request finished (usage given: its response ended, charged to the flow of the gate
   * that dispatched it) or was never served (no usage: its scheduling failed). Re-checks the gate.
   */
  finished(requestId: string, usage: { promptTokens?: number; outputTokens: number } | null): void {
    const f = this.#inflight.get(requestId);
    if (!f) return;
    this.#inflight.delete(requestId);
    f.gate.controller.prefillEnded(requestId);
    if (usage) {
      const correction = usage.promptTokens === undefined ? 0 : usage.promptTokens - f.req.promptTokens;
      f.gate.controller.completed(f.req.fairnessId, f.req.priority, usage.outputTokens, correction);
    } else f.gate.controller.released(f.req.fairnessId, f.req.priority);
    if (f.gate !== this && f.gate.controller.size > 0) f.gate.pump();
    if (this.controller.size > 0) this.pump();
  }

  /** The scheduler sent a request this gateway dispatched to `endpoint`. */
  placed(requestId: string, endpoint: string): void {
    this.#inflight.get(requestId)?.gate.controller.placed(requestId, endpoint);
  }

  /** A dispatched request's first response byte came back: its prefill is done; re-checks the gate. */
  prefilled(requestId: string): void {
    const gate = this.#inflight.get(requestId)?.gate;
    if (gate?.controller.prefillEnded(requestId) && gate.controller.size > 0) gate.pump();
  }

  snapshot(): FlowsView & { saturation: number } {
    const now = monotonicSeconds();
    return { saturation: this.saturation(now).value, ...this.controller.snapshot(now) };
  }
}

const SHUTTING_DOWN: Rejection = {
  status: 503,
  reason: "rejected-shutting-down",
  outcome: "RejectedOther",
  message: "the gateway is shutting down; retry on another replica",
};

const gates = new WeakMap<Routing, FlowGate>();

/** The routing's gate, or null without the flowControl gate. A replaced routing's gate drains on. */
export function flowGateOf(gw: Gateway, routing: Routing = gw.routing): FlowGate | null {
  if (routing.scheduler.config.flowControl === null) return null;
  let g = gates.get(routing);
  if (!g) {
    g = new FlowGate(gw, routing);
    gates.set(routing, g);
  }
  return g;
}

/** The request's fairness id: llm-d's header, its alias, else the objective, else "default-flow". */
export function fairnessIdOf(headers: IncomingHttpHeaders): string {
  const id =
    headerValue(headers, "x-llm-d-inference-fairness-id") ??
    headerValue(headers, "x-gateway-inference-fairness-id") ??
    headerValue(headers, "x-llm-d-inference-objective") ??
    headerValue(headers, "x-gateway-inference-objective");
  const t = id?.trim();
  return t ? t.slice(0, MAX_FAIRNESS_ID) : "default-flow";
}

function sloTtftMs(headers: IncomingHttpHeaders): number | undefined {
  const v = headerValue(headers, "x-llm-d-slo-ttft-ms") ?? headerValue(headers, "x-slo-ttft-ms");
  const n = v === undefined ? Number.NaN : Number(v);
  return Number.isFinite(n) && n > 0 ? n : undefined;
}

/**
 * Admission for decide(): legacy (no flowControl gate) or wait in the flow-control queue. On
 * dispatch the candidates are refreshed (late binding). Returns the error to answer with, or null.
 */
export async function admit(
  gw: Gateway,
  p: Prepared,
  headers: IncomingHttpHeaders,
  opts: { signal?: AbortSignal; bytes: number; subset?: readonly string[] | null },
): Promise<GatewayError | null> {
  const gate = flowGateOf(gw, p.routing);
  if (gate === null) {
    const adm = p.routing.admission.admit(p.facts, p.candidates, p.now);
    return adm.admitted ? null : new GatewayError(429, adm.message, { reason: adm.reason });
  }
  const req: FlowRequest = {
    id: p.facts.requestId,
    fairnessId: fairnessIdOf(headers),
    priority: p.facts.priority,
    bytes: opts.bytes,
    receivedAt: p.now,
    promptTokens: p.facts.tokenIds?.length ?? Math.ceil(opts.bytes / 4),
  };
  const slo = sloTtftMs(headers);
  if (slo !== undefined) req.sloTtftMs = slo;
  const o = await gate.wait(req, opts.signal);
  if (!o.ok) {
    const r = o.rejection;
    if (r === null)
      return new GatewayError(503, "client disconnected while queued", {
        reason: "rejected-context-cancelled",
      });
    return new GatewayError(r.status, r.message, { reason: r.reason });
  }
  p.now = monotonicSeconds();
  const c = gw.data.store.candidates(p.facts.model, p.now);
  if (!c.ok) return new GatewayError(503, c.message, { reason: "rejected-no-endpoints" });
  const hosts = opts.subset ? new Set(opts.subset.map(hostOf)) : null;
  p.candidates = hosts ? c.candidates.filter((e) => hosts.has(hostOf(e.id))) : c.candidates;
  if (p.candidates.length === 0)
    return new GatewayError(503, "no endpoint in the proxy's subset is ready after queueing; retry", {
      reason: "rejected-no-endpoints",
    });
  return null;
}

/** decide() picked `endpoint` for a request flow control dispatched (the prefill reserve's bookkeeping). */
export function placeFlow(
  gw: Gateway,
  p: { routing: Routing; facts: { requestId: string } },
  endpoint: string,
): void {
  flowGateOf(gw, p.routing)?.placed(p.facts.requestId, endpoint);
}

/** The response of a request flow control dispatched started: its prefill is over. */
export function prefilledFlow(gw: Gateway, routing: Routing, requestId: string): void {
  flowGateOf(gw, routing)?.prefilled(requestId);
}

/** decide() failed after admission: the request, if flow control dispatched it, is not in flight. */
export function releaseFlow(gw: Gateway, p: { routing: Routing; facts: { requestId: string } }): void {
  flowGateOf(gw, p.routing)?.finished(p.facts.requestId, null);
}
