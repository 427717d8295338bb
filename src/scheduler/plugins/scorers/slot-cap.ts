/**
 * A replica's sequence-slot cap (vLLM `--max-num-seqs`, which no metric exports), read from its
 * scraped running and waiting counts, for decode-load-scorer and prefix-cache-affinity-filter's
 * releaseWhenSlotsFull: a new request on a replica whose slots are all taken waits for a running one
 * to end.
 *
 * A cap is a plateau: while requests wait, the running count sits at the same highest value scrape
 * after scrape. Waiting behind a step's token budget or behind KV leaves the running count
 * wandering below its maximum instead, so those never read as a cap: the cap is known once at least
 * `SLOT_SCRAPES` scrapes with more requests than that count (running + waiting) were taken since
 * the highest running count was first seen, and at least half of them show exactly that count with
 * two or more waiting (one may be a request that arrived since the last step). Scrapes at ≥ 90% KV
 * utilisation are skipped (requests there wait for KV blocks). A count read too low (a plateau of
 * arrivals that waited one step) is dropped at the first scrape that runs more.
 *
 * SlotCaps holds one per endpoint and lends a learned cap to the endpoints of the same shape that
 * have not shown theirs, unless one has already run more requests than it. The shape is the KV block
 * size and count (vLLM's cache_config_info: one model on one GPU type) and, on Kubernetes, the pod
 * template's revision label (pod-template-hash of a Deployment, LeaderWorkerSet's
 * template-revision-hash, a StatefulSet's controller-revision-hash): replicas of one template share
 * their --max-num-seqs, while a canary with other flags on the same GPUs does not. A replica
 * reaching its cap for the first time is then known full at once, not five scrapes later, while
 * requests queue there. On locality-regional-spike the default's requests missing the SLO fell from
 * 25.6 to 9.9 on average over router seeds 1–24 (least-request: 3–5).
 *
 * A scrape identical to the one before (running, waiting and KV use) is skipped: the engine has not
 * ended a step since, and a long prefill step (0.4 s for Qwen3-32B's 8,192-token chunk) would
 * otherwise read as a plateau, a cap of 3 on a replica with 1,024 slots.
 *
 * The first replica of a fleet to fill has no cap to borrow, and five scrapes are half a second of
 * requests queuing there. So a learner told by its caller that one of the gateway's own requests
 * there is stalled — waiting for its first token more than three times as long as that replica
 * usually takes to start one (stalledAt) — believes the plateau after two scrapes, and takes a lone
 * waiting request at the highest count as evidence (it has waited far longer than a step); the
 * stall lasts until a scrape shows no request waiting. Two scrapes alone also read caps from
 * prefill-bound overload, where the running count holds for a step or two while arrivals wait behind
 * the step's token budget (autoscale-ramp: 49 false caps, 45 to 182 sequences on replicas with
 * vLLM's default slots); there the requests' waits rise with the queue, so none is stalled against
 * its usual wait, and no cap is read. On locality-regional-spike the default's requests missing the
 * SLO went from 5.6 to 2.9 on average over router seeds 1–24 (least-request 3.0), on
 * locality-regional-tenants from 6.0 to 2.3 (router seeds 1–12).
 */
import type { EndpointState } from "../../types.ts";
import type { InFlightInfo } from "../data.ts";

export class SlotCap {
  #last = Number.NaN;
  #max = 0;
  #waiting = 0;
  #atMax = 0;
  #known: number | undefined;
  /** A request of this gateway's has waited unusually long to start, and requests still wait. */
  #stalled = false;
  /** The last scrape's running count, waiting count and KV utilisation. */
  #prevRunning = Number.NaN;
  #prevWaiting = Number.NaN;
  #prevKv = Number.NaN;

  /**
   * One scrape (repeated reads of the same scrape, same `updateTime`, count once). `stalled`: whether
   * one of this gateway's requests on the replica has waited far longer than usual for its first
   * token (stalledAt below), asked only when the scrape may be evidence of a cap.
   */
  observe(updateTime: number, running: number, waiting: number, kvUsage = 0, stalled?: () => boolean): void {
    if (updateTime === this.#last) return;
    this.#last = updateTime;
    // The same counts and KV to the last digit as the scrape before: the engine has not finished a
    // step since (vLLM sets its gauges at the end of one), so this is the same evidence again.
    const same = running === this.#prevRunning && waiting === this.#prevWaiting && kvUsage === this.#prevKv;
    this.#prevRunning = running;
    this.#prevWaiting = waiting;
    this.#prevKv = kvUsage;
    if (same) return;
    if (running > this.#max) {
      this.#max = running;
      this.#waiting = 0;
      this.#atMax = 0;
      this.#known = undefined;
      this.#stalled = false;
    }
    // A stall lasts while requests keep waiting: a scrape with none ends it.
    if (waiting <= 0) this.#stalled = false;
    // Requests waiting for KV, not for a slot: no evidence either way.
    if (kvUsage >= KV_FULL) return;
    // Fewer requests than the highest running count: no slot was lacking (a request that arrived
    // since the last step waits for the next one on any replica).
    if (waiting <= 0 || running + waiting <= this.#max) return;
    // Asked only of a scrape that may be evidence, and only until a stall is seen.
    if (!this.#stalled && stalled !== undefined) this.#stalled = stalled();
    if (running === this.#max) {
      // One waiting request at the highest count may be a lone arrival since the last step, unless
      // one of this gateway's requests there has waited far longer than a step to start.
      if (waiting < 2 && !this.#stalled) return;
      this.#atMax++;
    }
    this.#waiting++;
    const enough = this.#waiting >= (this.#stalled ? STALLED_SCRAPES : SLOT_SCRAPES);
    this.#known = enough && this.#atMax * 2 >= this.#waiting ? this.#max : undefined;
  }

  /** The highest running count the scrapes have shown. */
  get highest(): number {
    return this.#max;
  }

  /** The learned cap, or undefined while the scrapes show none. */
  get known(): number | undefined {
    return this.#known;
  }
}

/** KV utilisation from which waiting requests are taken to wait for KV blocks. */
const KV_FULL = 0.9;
/** Scrapes with requests waiting beyond the highest running count before a cap is believed. */
const SLOT_SCRAPES = 5;
/** The same while one of the gateway's requests there is stalled (module comment). */
const STALLED_SCRAPES = 2;

/**
 * Whether the oldest of the gateway's requests on the endpoint still waiting for its first token has
 * waited more than STALL_FACTOR times the endpoint's usual wait to start (and at least STALL_FLOOR
 * seconds, a scrape interval, so a replica that starts requests in a few milliseconds is not
 * stalled by a step's jitter). `now` and the producer's times are the gateway's seconds.
 */
export function stalledAt(load: InFlightInfo, id: string, now: number): boolean {
  const since = load.oldestWaitingSince?.(id);
  if (since === undefined) return false;
  const usual = load.usualWaitToStart?.(id);
  if (usual === undefined) return false;
  return now - since > Math.max(STALL_FACTOR * usual, STALL_FLOOR);
}
const STALL_FACTOR = 3;
const STALL_FLOOR = 0.1;

/** One endpoint's learner in SlotCaps: its shape, and the cap it lends (as of its last scrape). */
export class EndpointSlotCap extends SlotCap {
  /** updateTime of the last scrape read. */
  seen = Number.NaN;
  shape = "";
  /** What the shape was made of. */
  blocks: number | undefined = -1;
  blockSize: number | undefined = -1;
  labels: Record<string, string> | null = null;
  lent: number | undefined;
}

/** Every endpoint's SlotCap, each lending its learned cap to endpoints of its shape (module comment). */
export class SlotCaps {
  readonly #caps = new Map<string, EndpointSlotCap>();
  /** The lowest cap learned per shape, rebuilt whenever one is learned, dropped or moves shape. */
  #byShape = new Map<string, number>();

  /** The endpoint's learner (the same object for the same id until it leaves the pool). */
  of(id: string): EndpointSlotCap {
    let c = this.#caps.get(id);
    if (c === undefined) this.#caps.set(id, (c = new EndpointSlotCap()));
    return c;
  }

  /**
   * Reads the endpoint's latest scrape, once, into its learner (`c`, looked up when not given);
   * `stalled` (asked only when the scrape may show a cap) tells whether a request of the gateway's
   * there is stalled.
   */
  read(e: EndpointState, c: EndpointSlotCap = this.of(e.id), stalled?: (id: string) => boolean): void {
    const m = e.metrics;
    if (m === null || m.updateTime === c.seen) return;
    c.seen = m.updateTime;
    const stall = stalled === undefined ? undefined : () => stalled(e.id);
    c.observe(m.updateTime, m.runningRequestsSize, m.waitingQueueSize, m.kvCacheUsagePercent, stall);
    // The shape changes seldom: rebuilt only when what it is made of does.
    let moved = false;
    if (m.cacheNumBlocks !== c.blocks || m.cacheBlockSize !== c.blockSize || e.labels !== c.labels) {
      c.blocks = m.cacheNumBlocks;
      c.blockSize = m.cacheBlockSize;
      c.labels = e.labels;
      const shape = shapeOf(e.labels, m.cacheNumBlocks, m.cacheBlockSize);
      moved = shape !== c.shape;
      c.shape = shape;
    }
    if (c.known !== c.lent || (moved && c.lent !== undefined)) {
      c.lent = c.known;
      this.#rebuild();
    }
  }

  /**
   * A learner's cap: its own once learned, else the lowest its shape's endpoints have learned unless
   * it has already run more requests than that; undefined when neither is known.
   */
  cap(c: EndpointSlotCap | undefined): number | undefined {
    if (c === undefined) return undefined;
    const own = c.known;
    if (own !== undefined || this.#byShape.size === 0) return own;
    const peer = this.#byShape.get(c.shape);
    return peer !== undefined && c.highest <= peer ? peer : undefined;
  }

  /** cap() of the endpoint with this id. */
  capOf(id: string): number | undefined {
    return this.cap(this.#caps.get(id));
  }

  /** The lowest cap any endpoint has learned, or undefined. */
  get lowest(): number | undefined {
    let low: number | undefined;
    for (const v of this.#byShape.values()) if (low === undefined || v < low) low = v;
    return low;
  }

  /** Endpoints that left the pool take their caps with them. */
  retain(pool: ReadonlySet<string>): void {
    for (const id of [...this.#caps.keys()]) if (!pool.has(id)) this.#caps.delete(id);
    this.#rebuild();
  }

  #rebuild(): void {
    const by = new Map<string, number>();
    for (const c of this.#caps.values()) {
      if (c.lent === undefined) continue;
      const v = by.get(c.shape);
      if (v === undefined || c.lent < v) by.set(c.shape, c.lent);
    }
    this.#byShape = by;
  }
}

/** Pod labels naming the template a replica was made from (see the module comment). */
const TEMPLATE_LABELS = [
  "leaderworkerset.sigs.k8s.io/template-revision-hash",
  "pod-template-hash",
  "controller-revision-hash",
];

function shapeOf(
  labels: Record<string, string>,
  blocks: number | undefined,
  blockSize: number | undefined,
): string {
  let template = "";
  for (const k of TEMPLATE_LABELS) {
    const v = labels[k];
    if (v !== undefined) {
      template = `${k}=${v}`;
      break;
    }
  }
  return `${blocks ?? "?"}/${blockSize ?? "?"}/${template}`;
}
