/**
 * The flow-control queue (llm-d's flow controller, llm-d/llm-d-router `pkg/epp/flowcontrol/`), pure:
 * time is passed in, the caller runs the clock. Requests wait here, at the gateway, instead of in a
 * replica's queue. Each request belongs to a flow (fairness id) inside a priority band (its
 * InferenceObjective priority). One dispatch takes the highest non-empty band (strict priority, and
 * it stops at the first band whose saturation ceiling is reached, so a lower band never overtakes),
 * lets the band's fairness policy pick a flow and the ordering policy pick that flow's next request.
 * Every enqueued request leaves exactly once: dispatched, expired (TTL) or removed (disconnect).
 * Flows count what they have in flight (dispatched until completed() or released()), so a band's
 * `holdback` (kvgate's vtc-fairness-policy parameter) can keep the top of the saturation ceiling
 * for flows holding less than their share: once the band knows more than one flow (flows are
 * forgotten flowGcAfter after their last request), a flow that floods the gate stops at
 * ceiling − holdback, and another flow's request is dispatched at once instead of waiting for one
 * of the flood's requests to end. A band's `prefillReserve` (the same policy's) keeps that many
 * endpoints free of long prefills for flows that have none pending: dispatch is given the
 * endpoints, the caller reports where each request went (placed) and when its first token came
 * back or it ended (prefillEnded), and, while the band knows more than one flow, a flow whose long
 * prefill is still pending starts another only while more than prefillReserve endpoints have none
 * (prefill-reserve.ts); held like that, another flow of the band goes, else the cycle stops.
 * Outcomes and statuses as llm-d-router's admission translates them (`requestcontrol/admission.go`):
 * capacity → 429 rejected-saturated (503 rejected-no-endpoints with an empty pool), TTL → 503
 * rejected-ttl-expired, client gone → rejected-context-cancelled.
 */

import {
  type BandSettings,
  DEFAULT_BAND_MAX_BYTES,
  DEFAULT_BAND_MAX_REQUESTS,
  type Expired,
  type FlowControlSettings,
  type FlowRequest,
  type FlowsView,
  type Left,
  type Rejection,
} from "./flow-types.ts";
import { ceilings } from "./policies.ts";
import { PrefillTracker } from "./prefill-reserve.ts";

export * from "./flow-types.ts";

interface Item {
  req: FlowRequest;
  seq: number;
  enqueuedAt: number;
  /** Sort key of the band's ordering policy (then seq). */
  key: number;
}
interface Flow {
  id: string;
  items: Item[];
  bytes: number;
  /** Tokens served (prompt at dispatch, output at completion), unweighted. */
  servedTokens: number;
  /** VTC's virtual token counter (weighted); unused by other policies. */
  counter: number;
  lastActive: number;
  /** Dispatched and not yet completed or released. */
  inflight: number;
  /** Long prefills dispatched and still pending (prefill reserve; 0 without one). */
  longPending: number;
}
interface Band {
  s: BandSettings;
  flows: Map<string, Flow>;
  count: number;
  bytes: number;
  /** round-robin: the flow served last. */
  cursor: string | null;
  /** VTC: the counter of the flow dispatched last, after its charge (an idle band's virtual time). */
  floor: number;
  /** Σ flows' in flight. */
  inflight: number;
}

export class FlowController {
  readonly settings: FlowControlSettings;
  readonly #bands = new Map<number, Band>();
  readonly #where = new Map<string, { band: Band; flow: Flow; item: Item }>();
  #bandOrder: Band[] = [];
  #seq = 0;
  #count = 0;
  #bytes = 0;
  /** Long prefills dispatched and pending, when a band has a prefill reserve. */
  readonly #prefill = new PrefillTracker();
  /** Prompts of at least this many tokens are long prefills: the smallest over bands with a reserve. */
  #longPrefill = Number.POSITIVE_INFINITY;

  constructor(settings: FlowControlSettings) {
    this.settings = settings;
    for (const b of settings.bands) this.#band(b.priority, b);
    if (!this.#bands.has(0)) this.#band(0);
  }

  /** Long prefills dispatched whose first token has not come back (prefill reserve). */
  get pendingPrefills(): number {
    return this.#prefill.size;
  }

  get size(): number {
    return this.#count;
  }
  has(id: string): boolean {
    return this.#where.has(id);
  }

  #band(priority: number, given?: BandSettings): Band {
    let b = this.#bands.get(priority);
    if (b) return b;
    const t = given ?? {
      ...(priority < 0 && this.settings.defaultNegativeBand
        ? this.settings.defaultNegativeBand
        : this.settings.defaultBand),
      priority,
    };
    b = { s: t, flows: new Map(), count: 0, bytes: 0, cursor: null, floor: 0, inflight: 0 };
    const f = t.fairness;
    if (f.kind === "vtc" && (f.prefillReserve ?? 0) > 0)
      this.#longPrefill = Math.min(this.#longPrefill, f.longPrefillTokens ?? 1024);
    this.#bands.set(priority, b);
    this.#bandOrder = [...this.#bands.values()].sort((x, y) => y.s.priority - x.s.priority);
    return b;
  }

  /** Queues `req`, or says why not (capacity). `poolEmpty`: no endpoint could serve it now. */
  enqueue(req: FlowRequest, now: number, poolEmpty = false): Rejection | null {
    if (this.#where.has(req.id)) throw new Error(`flow control: request ${req.id} is already queued`);
    const band = this.#band(req.priority);
    const g = this.settings;
    const bandMaxReq = band.s.maxRequests || DEFAULT_BAND_MAX_REQUESTS;
    const bandMaxBytes = band.s.maxBytes || DEFAULT_BAND_MAX_BYTES;
    let full: string | null = null;
    if (g.maxRequests > 0 && this.#count + 1 > g.maxRequests) full = `global maxRequests ${g.maxRequests}`;
    else if (g.maxBytes > 0 && this.#bytes + req.bytes > g.maxBytes) full = `global maxBytes ${g.maxBytes}`;
    else if (band.count + 1 > bandMaxReq) full = `priority band ${band.s.priority} maxRequests ${bandMaxReq}`;
    else if (band.bytes + req.bytes > bandMaxBytes)
      full = `priority band ${band.s.priority} maxBytes ${bandMaxBytes}`;
    if (full !== null) {
      return poolEmpty
        ? {
            status: 503,
            reason: "rejected-no-endpoints",
            outcome: "RejectedNoEndpoints",
            message: `no endpoint is available and the flow-control queue is full (${full}); retry when endpoints are ready`,
          }
        : {
            status: 429,
            reason: "rejected-saturated",
            outcome: "RejectedCapacity",
            message: `the pool is saturated and the flow-control queue is full (${full}); retry later or raise the limit in flowControl`,
          };
    }
    let flow = band.flows.get(req.fairnessId);
    if (!flow) {
      flow = {
        id: req.fairnessId,
        items: [],
        bytes: 0,
        servedTokens: 0,
        counter: 0,
        lastActive: now,
        inflight: 0,
        longPending: 0,
      };
      band.flows.set(req.fairnessId, flow);
    }
    if (flow.items.length === 0 && band.s.fairness.kind === "vtc") {
      // VTC's lift: a flow that becomes backlogged starts no lower than the least-served backlogged
      // flow (or, in an idle band, the last one served), so idle time banks no credit.
      let min = Number.POSITIVE_INFINITY;
      for (const f of band.flows.values())
        if (f !== flow && f.items.length > 0) min = Math.min(min, f.counter);
      flow.counter = Math.max(flow.counter, Number.isFinite(min) ? min : band.floor);
    }
    const item: Item = { req, seq: ++this.#seq, enqueuedAt: now, key: 0 };
    item.key = this.#key(band, item);
    insertSorted(flow.items, item);
    flow.bytes += req.bytes;
    flow.lastActive = now;
    band.count++;
    band.bytes += req.bytes;
    this.#count++;
    this.#bytes += req.bytes;
    this.#where.set(req.id, { band, flow, item });
    return null;
  }

  #ttl(req: FlowRequest, poolEmpty: boolean): number {
    if (poolEmpty) return this.settings.noEndpointRequestTTL;
    return req.ttl ?? this.settings.defaultRequestTTL;
  }

  #key(band: Band, item: Item): number {
    switch (band.s.ordering) {
      case "fcfs":
        return item.seq;
      case "edf": {
        const ttl = this.#ttl(item.req, false);
        return ttl > 0 ? item.enqueuedAt + ttl : Number.POSITIVE_INFINITY;
      }
      case "slo-deadline":
        return item.req.sloTtftMs !== undefined
          ? item.req.receivedAt + item.req.sloTtftMs / 1000
          : Number.POSITIVE_INFINITY;
    }
  }

  #take(band: Band, flow: Flow, item: Item): void {
    flow.items.splice(flow.items.indexOf(item), 1);
    flow.bytes -= item.req.bytes;
    band.count--;
    band.bytes -= item.req.bytes;
    this.#count--;
    this.#bytes -= item.req.bytes;
    this.#where.delete(item.req.id);
  }

  /**
   * Dispatches at most one request: bands high → low; the first non-empty band whose ceiling is
   * above `saturation` gives one; a non-empty band at or over its ceiling stops the cycle (llm-d's
   * deliberate head-of-line blocking). With a band holdback h and more than one flow known to the
   * band, at saturation ≥ ceiling − h only its flows below their share of the band's in flight
   * (in flight ÷ active flows) may go; with a band prefill reserve r, more than one flow known and
   * `endpoints` given, a flow whose next request is a long prefill while one of its long prefills is
   * pending may go only while more than r of `endpoints` have no long prefill pending. If no flow of
   * the band may go the cycle stops there too. Null when nothing may go.
   */
  dispatch(now: number, saturation: number, endpoints?: readonly string[]): Left | null {
    const order = this.#bandOrder;
    const cs = ceilings(
      this.settings.usageLimit,
      order.map((b) => b.s.priority),
    );
    for (let i = 0; i < order.length; i++) {
      const band = order[i];
      if (band.count === 0) continue;
      if (saturation >= cs[i]) return null;
      const fair = band.s.fairness;
      const h = fair.kind === "vtc" ? (fair.holdback ?? 0) : 0;
      const r = fair.kind === "vtc" ? (fair.prefillReserve ?? 0) : 0;
      // Only a band that knows another flow (seen within flowGcAfter) has someone to hold it for.
      const others = band.flows.size > 1;
      const held = h > 0 && others && saturation >= cs[i] - h;
      const reserved =
        r > 0 && others && endpoints !== undefined && this.#prefill.free(endpoints) <= r
          ? (f: Flow) => f.longPending === 0 || f.items[0].req.promptTokens < this.#longPrefill
          : null;
      const share = held ? underShare(band) : null;
      const eligible = share && reserved ? (f: Flow) => share(f) && reserved(f) : (share ?? reserved ?? null);
      const flow = pickFlow(band, eligible);
      if (flow === null) return null;
      const item = flow.items[0];
      this.#take(band, flow, item);
      if (fair.kind === "vtc") {
        flow.counter += fair.promptTokenWeight * item.req.promptTokens;
        band.floor = flow.counter;
      }
      flow.servedTokens += item.req.promptTokens;
      flow.lastActive = now;
      flow.inflight++;
      band.inflight++;
      band.cursor = flow.id;
      if (item.req.promptTokens >= this.#longPrefill) {
        this.#prefill.dispatched(item.req.id, { fairnessId: flow.id, priority: band.s.priority });
        flow.longPending++;
      }
      return { request: item.req, waited: now - item.enqueuedAt, outcome: "Dispatched" };
    }
    return null;
  }

  /** The scheduler sent dispatched request `id` to `endpoint` (prefill reserve bookkeeping). */
  placed(id: string, endpoint: string): void {
    this.#prefill.placed(id, endpoint);
  }

  /**
   * Request `id`'s first token came back, or it ended without one: its prefill is no longer
   * pending. Idempotent; true if it was a pending long prefill (a held flow may go now).
   */
  prefillEnded(id: string): boolean {
    const p = this.#prefill.ended(id);
    if (p === undefined) return false;
    const flow = this.#bands.get(p.priority)?.flows.get(p.fairnessId);
    if (flow !== undefined && flow.longPending > 0) flow.longPending--;
    return true;
  }

  /** A dispatched request finished: its output tokens (and any prompt-count correction) are served. */
  completed(fairnessId: string, priority: number, outputTokens: number, promptCorrection = 0): void {
    const flow = this.#bands.get(priority)?.flows.get(fairnessId);
    if (!flow) return;
    this.#leave(priority, flow);
    const fair = (this.#bands.get(priority) as Band).s.fairness;
    const add = Math.max(0, outputTokens);
    flow.servedTokens = Math.max(0, flow.servedTokens + add + promptCorrection);
    if (fair.kind === "vtc")
      flow.counter = Math.max(
        0,
        flow.counter + fair.outputTokenWeight * add + fair.promptTokenWeight * promptCorrection,
      );
  }

  /** A dispatched request was never served (its scheduling failed): it is no longer in flight. */
  released(fairnessId: string, priority: number): void {
    const flow = this.#bands.get(priority)?.flows.get(fairnessId);
    if (flow) this.#leave(priority, flow);
  }

  #leave(priority: number, flow: Flow): void {
    if (flow.inflight <= 0) return;
    flow.inflight--;
    (this.#bands.get(priority) as Band).inflight--;
  }

  /** The client went away: the request leaves the queue now. False if it was not queued. */
  remove(id: string, now: number): Left | null {
    const w = this.#where.get(id);
    if (!w) return null;
    this.#take(w.band, w.flow, w.item);
    return { request: w.item.req, waited: now - w.item.enqueuedAt, outcome: "EvictedContextCancelled" };
  }

  /** Requests whose queue-wait budget is spent, removed (llm-d sweeps once a second). */
  expire(now: number, poolEmpty = false): Expired[] {
    const out: Expired[] = [];
    for (const w of [...this.#where.values()]) {
      const ttl = this.#ttl(w.item.req, poolEmpty);
      if (ttl <= 0 || now - w.item.enqueuedAt < ttl) continue;
      this.#take(w.band, w.flow, w.item);
      const waited = now - w.item.enqueuedAt;
      const rejection: Rejection = poolEmpty
        ? {
            status: 503,
            reason: "rejected-no-endpoints",
            outcome: "EvictedNoEndpoints",
            message: `no endpoint became available within the queue TTL (${ttl}s); retry when endpoints are ready`,
          }
        : {
            status: 503,
            reason: "rejected-ttl-expired",
            outcome: "EvictedTTL",
            message: `request waited ${waited.toFixed(1)}s in the flow-control queue without being dispatched (TTL ${ttl}s); retry later`,
          };
      out.push({ request: w.item.req, waited, outcome: rejection.outcome, rejection });
    }
    return out;
  }

  /** Forgets flows idle (empty) for flowGcAfter seconds. */
  gc(now: number): void {
    for (const b of this.#bands.values())
      for (const [id, f] of b.flows)
        if (
          f.items.length === 0 &&
          f.inflight === 0 &&
          f.longPending === 0 &&
          now - f.lastActive >= this.settings.flowGcAfter
        )
          b.flows.delete(id);
  }

  /** Queue state per band (high → low) and flow. */
  snapshot(now: number): FlowsView {
    return {
      queued: this.#count,
      bytes: this.#bytes,
      bands: this.#bandOrder.map((b) => ({
        priority: b.s.priority,
        fairness: b.s.fairness.kind,
        ordering: b.s.ordering,
        depth: b.count,
        bytes: b.bytes,
        flows: [...b.flows.values()]
          .sort((x, y) => (x.id < y.id ? -1 : x.id > y.id ? 1 : 0))
          .map((f) => ({
            fairnessId: f.id,
            depth: f.items.length,
            bytes: f.bytes,
            oldestAgeSeconds: f.items.length
              ? now - f.items.reduce((m, i) => Math.min(m, i.enqueuedAt), Number.POSITIVE_INFINITY)
              : 0,
            servedTokens: f.servedTokens,
            inflight: f.inflight,
            ...(b.s.fairness.kind === "vtc" ? { virtualCounter: f.counter } : {}),
            ...(b.s.fairness.kind === "vtc" && (b.s.fairness.prefillReserve ?? 0) > 0
              ? { longPrefillsPending: f.longPending }
              : {}),
          })),
      })),
    };
  }
}

function before(a: Item, b: Item): boolean {
  return a.key < b.key || (a.key === b.key && a.seq < b.seq);
}

function insertSorted(items: Item[], item: Item): void {
  let lo = 0;
  let hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (before(items[mid], item)) lo = mid + 1;
    else hi = mid;
  }
  items.splice(lo, 0, item);
}

/**
 * A band's flows below their share of what it has in flight (in flight ÷ flows queued or in
 * flight): the ones the holdback keeps capacity for.
 */
function underShare(band: Band): (f: Flow) => boolean {
  let active = 0;
  for (const f of band.flows.values()) if (f.items.length > 0 || f.inflight > 0) active++;
  const share = active > 0 ? band.inflight / active : 0;
  return (f) => f.inflight === 0 || f.inflight < share;
}

/** The band's fairness policy: which backlogged flow (of those `eligible`, if given) goes next. */
function pickFlow(band: Band, eligible: ((f: Flow) => boolean) | null = null): Flow | null {
  const live = [...band.flows.values()].filter(
    (f) => f.items.length > 0 && (eligible === null || eligible(f)),
  );
  if (live.length === 0) return null;
  const fair = band.s.fairness;
  if (fair.kind === "round-robin") {
    live.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    const c = band.cursor;
    return (c === null ? undefined : live.find((f) => f.id > c)) ?? live[0];
  }
  let best = live[0];
  for (const f of live.slice(1)) {
    if (fair.kind === "vtc") {
      if (f.counter < best.counter || (f.counter === best.counter && before(f.items[0], best.items[0])))
        best = f;
    } else if (before(f.items[0], best.items[0])) best = f;
  }
  return best;
}
