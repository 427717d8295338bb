/**
 * Several gateway replicas in the fleet simulator: each its own scheduler instance (its own
 * approximate index, in-flight counters and session bindings), requests spread round-robin across
 * them in arrival order, as a load balancer in front of the gateways would. With sync on, each
 * gateway batches what its picks taught it (src/scheduler/sync.ts, the same merge `kvgate serve
 * --nats` runs) and its peers merge the batch `delay` seconds after it was taken; a gateway takes a
 * batch `interval` seconds after the first pick or completion since its last one, as the live
 * transport's flush timer does. Events only follow picks, so a run still ends when its requests do.
 */
import type { Scheduler } from "../../scheduler/scheduler.ts";
import { GatewaySync, type SyncBatch } from "../../scheduler/sync.ts";
import { type EventQueue, Priority, type SimEvent } from "./event-queue.ts";

export interface GatewaySyncConfig {
  /** Seconds from a batch's take to its merge on every peer (≥ 0). */
  delay: number;
  /** Seconds a gateway gathers before it takes a batch (> 0). */
  interval: number;
}

export class SimGateways {
  readonly #syncs: GatewaySync[] | null;
  readonly #flushPending: Uint8Array;
  readonly #batches: (SyncBatch | undefined)[] = [];
  readonly #free: number[] = [];
  #next = 0;
  /** Batches merged into peers (one per batch per receiving gateway). */
  merged = 0;

  constructor(
    readonly schedulers: readonly Scheduler[],
    readonly q: EventQueue,
    readonly sync: GatewaySyncConfig | null,
  ) {
    if (schedulers.length === 0) throw new RangeError("at least one gateway scheduler");
    if (sync !== null) {
      if (!(sync.delay >= 0) || !Number.isFinite(sync.delay))
        throw new RangeError(`gateway sync delay must be ≥ 0, got ${sync.delay}`);
      if (!(sync.interval > 0) || !Number.isFinite(sync.interval))
        throw new RangeError(`gateway sync interval must be > 0, got ${sync.interval}`);
    }
    this.#syncs =
      sync !== null && schedulers.length > 1
        ? schedulers.map((s, k) => new GatewaySync(s, { origin: `gw-${k}`, config: "sim" }))
        : null;
    this.#flushPending = new Uint8Array(schedulers.length);
  }

  get count(): number {
    return this.schedulers.length;
  }

  /** The gateway the next arriving request goes to (round-robin). */
  nextGateway(): number {
    const g = this.#next;
    this.#next = (g + 1) % this.schedulers.length;
    return g;
  }

  /** Gateway g's state changed at `now` (a pick or a completion): flush it after the interval. */
  touched(g: number, now: number): void {
    if (this.#syncs === null || this.#flushPending[g] === 1) return;
    this.#flushPending[g] = 1;
    this.q.push(now + (this.sync as GatewaySyncConfig).interval, Priority.KV_EVENTS, "sync-flush", g);
  }

  /** Handles a sync-flush or sync-deliver event. */
  handle(e: SimEvent, now: number): void {
    const syncs = this.#syncs as GatewaySync[];
    if (e.kind === "sync-flush") {
      this.#flushPending[e.replica] = 0;
      const b = syncs[e.replica].take(now);
      const slot = this.#free.pop() ?? this.#batches.length;
      this.#batches[slot] = b;
      this.q.push(
        now + (this.sync as GatewaySyncConfig).delay,
        Priority.KV_EVENTS,
        "sync-deliver",
        e.replica,
        slot,
      );
      return;
    }
    const b = this.#batches[e.request] as SyncBatch;
    this.#batches[e.request] = undefined;
    this.#free.push(e.request);
    for (let k = 0; k < syncs.length; k++) if (k !== e.replica && syncs[k].apply(b, now)) this.merged++;
  }
}
