/**
 * The fleet simulator's event queue: a binary min-heap ordered by (time, priority, seq), so events
 * have a total order and a run replays identically (the style of BLIS's sim/event.go). Priorities
 * are named constants; each says why it wins a tie at the same instant.
 */

/**
 * Same-instant tie-breaks, lowest first. The order follows one request through the gateway and
 * one replica: what a step finished at t is visible to everything else that happens at t.
 */
export const Priority = {
  /**
   * A step ending at t delivers its tokens and frees its blocks first: a request arriving at t
   * then sees the fleet as the step left it, and a closed-loop user whose request ended at t sends
   * its next request at t.
   */
  STEP_END: 0,
  /**
   * A KV-event batch due at t (a step's events, published at its end, plus the delivery delay)
   * reaches the precise prefix index before anything at t reads it: with delay 0, a request
   * arriving at a step's end sees the blocks that step stored.
   */
  KV_EVENTS: 1,
  /** A scrape at t reads what the steps ending at t published. */
  SCRAPE: 2,
  /** The schedulers' between-request measurements at t (Scheduler.refresh) read the scrape at t. */
  REFRESH: 3,
  /** A gateway arrival at t is scheduled against the scrape and measurements taken at t (if any). */
  ARRIVAL: 4,
  /** A request reaches its replica after the gateway delay; with delay 0, after every arrival at t. */
  DELIVER: 5,
  /**
   * An idle replica starts its next step last, so every request delivered at t joins that step,
   * as requests queued before vLLM's scheduler runs do.
   */
  STEP_START: 6,
} as const;

export type EventKind =
  | "step-end"
  | "kv-events"
  | "scrape"
  /** The gateways' schedulers take their between-request measurements (Scheduler.refresh). */
  | "refresh"
  | "arrival"
  | "deliver"
  | "step-start"
  /** P/D (pd.ts): a (decoder, prefiller) pair's handshake is done and a KV pull may start. */
  | "kv-start"
  /** P/D: a KV pull landed on the decoder. */
  | "kv-done"
  /** CPU offload tier: a load's host→device copy ended (request: index into the run's load table). */
  | "offload-done"
  /** Several gateways (gateways.ts): gateway `replica` takes its sync batch. */
  | "sync-flush"
  /** Gateway `replica`'s batch (request: its slot) reaches its peers. */
  | "sync-deliver"
  /** Flow control (flow.ts): the queue's TTL sweep, then a dispatch attempt. */
  | "flow-sweep"
  /** Autoscaling (autoscale.ts): replicas join, drain or leave. */
  | "membership";

export interface SimEvent {
  time: number;
  priority: number;
  seq: number;
  kind: EventKind;
  /** Replica index (step-end, kv-events, deliver, step-start; the decoder for kv-start, kv-done). */
  replica: number;
  /** Request index into the run's table (deliver). */
  request: number;
}

export class EventQueue {
  readonly #a: SimEvent[] = [];
  #seq = 0;

  get size(): number {
    return this.#a.length;
  }

  /** Adds an event; `time` must be finite. Returns it (for tests). */
  push(time: number, priority: number, kind: EventKind, replica = -1, request = -1): SimEvent {
    if (!Number.isFinite(time)) throw new RangeError(`event time must be finite, got ${time}`);
    const e: SimEvent = { time, priority, seq: this.#seq++, kind, replica, request };
    const a = this.#a;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!less(a[i], a[p])) break;
      a[i] = a[p];
      a[p] = e;
      i = p;
    }
    return e;
  }

  peek(): SimEvent | undefined {
    return this.#a[0];
  }

  pop(): SimEvent | undefined {
    const a = this.#a;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last !== undefined) {
      a[0] = last;
      let i = 0;
      const n = a.length;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < n && less(a[l], a[m])) m = l;
        if (r < n && less(a[r], a[m])) m = r;
        if (m === i) break;
        const t = a[i];
        a[i] = a[m];
        a[m] = t;
        i = m;
      }
    }
    return top;
  }
}

function less(x: SimEvent, y: SimEvent): boolean {
  if (x.time !== y.time) return x.time < y.time;
  if (x.priority !== y.priority) return x.priority < y.priority;
  return x.seq < y.seq;
}
