/**
 * prefix-cache-affinity-filter, "sticky until saturated" (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go`;
 * https://llm-d.ai/blog/sticky-until-saturated-token-aware-routing).
 * Sticky endpoints have matchBlocks/totalBlocks ≥ affinityThreshold. None sticky → keep all.
 * With probability explorationProbability keep all. Load gate: estimated TTFT of an endpoint is
 * inFlightTokens / prefill rate · 1000 ms — the endpoint's rate learned from its first-token times
 * (learnPrefillThroughput, kvgate) or peakPrefillThroughput; if the best sticky endpoint is more than
 * maxTTFTPenaltyMs slower than the best non-sticky one, keep all (break stickiness); 0 = always
 * stick. Otherwise keep only the sticky endpoints. With `ttftSource: latencyPredictor` the gate
 * compares predicted-latency-producer's TTFT predictions instead; while the model has no
 * predictions (too few samples) the signal is missing and, as in llm-d, all endpoints are kept.
 *
 * kvgate's `releaseWhenSlotsFull`: the load gate counts prefill only, so a sticky endpoint whose
 * sequence slots are all taken (vLLM --max-num-seqs) looks idle while requests queue there for a
 * running one to end. With it, each endpoint's slot cap is learned from its scrapes as
 * decode-load-scorer learns it (slot-cap.ts; one replica's cap stands for the others of its shape
 * until they show their own, and a replica where a request of the gateway's is stalled waiting to
 * start shows its cap in two scrapes, not five), and the time between two of its responses ending
 * from the gateway's own completions (a moving average). When every sticky endpoint has at least its
 * cap in flight from this gateway, a sticky endpoint's estimated TTFT adds the wait for a slot (k = the
 * requests ahead of this one beyond the cap, plus one, ends at that interval, counted at their 90th
 * percentile as if ends came at random: k·interval + 1.28·√k·interval), an endpoint with a free
 * slot's adds this request's uncached prompt at its prefill rate, and the request goes to the free
 * endpoints that would start it sooner than the best sticky one ("slots-full"). When only some
 * sticky endpoints are full (a prompt held by two replicas), the full ones that would start it later
 * than the best of the others are dropped, and it stays on the sticky ones ("slots-full"): the load
 * scorers after the filter would weigh that replica's empty prefill queue against the other's, not
 * its wait for a slot (locality-regional-spike at seed 7: 0.25–0.77 s first tokens at a full home
 * while the prompt's other home had 13 slots free behind 0.3 s of prefill). Otherwise (no
 * sticky endpoint known full, no cap or interval learned yet) stickiness holds as before.
 *
 * kvgate's `spreadHotPrefixes`: every gate above asks whether the home is slow to *start* the
 * request, and a prefix most requests share (one application's system prompt) starts fast on its
 * home, cached, while that one replica decodes the whole fleet's traffic. So the filter counts the
 * requests of each prefix and the picks of each endpoint (decayed over `windowSeconds`,
 * hot-prefixes.ts), and while the endpoints holding a prefix were sent more than their fair shares
 * (the pool's requests per endpoint, times their number) by more than `margin` of one endpoint's
 * share, it keeps the endpoints that do not hold it ("hot-prefix"): the scorers pick one, which
 * becomes another home, as long as the prefix's own requests would give every home, the new one
 * included, `margin` of a share. What they were sent counts the other prefixes homed beside it, so
 * a prefix with all the traffic ends on every endpoint, and one with half of it beside many small
 * prefixes homed everywhere on more than half of them; prefixes that each keep one endpoint busy
 * with its share (four, a quarter each, on four endpoints) and a pool of prefixes that each bring
 * less than an endpoint's share (the 150 × 5 run's 150 groups over 8 replicas) never trigger it. A
 * request is counted, when picked, at each power-of-two depth within its sticky part and judged at
 * the deepest: questions of different lengths behind one system prompt count together, and a long
 * conversation behind a hot system prompt is judged by its own.
 */
import { z } from "zod";
import type { Need } from "../../plugin-spec.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  EndpointState,
  Filter,
  PreRequestHook,
  RequestFacts,
  ScheduleResult,
  TypedName,
} from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { InFlightInfo, PrefixMatchInfo } from "../data.ts";
import { inflightKey, matchRatio, prefixKey } from "../data.ts";
import type { LatencyPredictions } from "../latency/data.ts";
import { latencyKey } from "../latency/data.ts";
import { SlotCaps, stalledAt } from "../scorers/slot-cap.ts";
import { PrefixRates } from "./hot-prefixes.ts";

export const AFFINITY_FILTER_TYPE = "prefix-cache-affinity-filter";

export const affinityParams = z
  .strictObject({
    affinityThreshold: z.number().min(0).max(1).default(0.8),
    explorationProbability: z.number().min(0).max(1).default(0),
    maxTTFTPenaltyMs: z.number().nonnegative().default(18000),
    ttftSource: z.enum(["prefillThroughput", "latencyPredictor"]).default("prefillThroughput"),
    /** Tokens/s; Qwen3-32B on 2×H100 TP2, vLLM 0.19 (llm-d calibration). */
    peakPrefillThroughput: z.number().nonnegative().default(15928),
    /**
     * kvgate: use each endpoint's prefill rate learned from its first-token times (the in-flight
     * producer's), with peakPrefillThroughput only until one is learned. false = llm-d's fixed rate.
     */
    learnPrefillThroughput: z.boolean().default(true),
    /** kvgate: count a sticky endpoint's wait for a sequence slot (module comment). */
    releaseWhenSlotsFull: z.boolean().default(false),
    /** kvgate: give a prefix more homes while its holders are sent more than their fair shares (module comment). */
    spreadHotPrefixes: z
      .strictObject({
        /** Hot while its holders are sent more than their fair shares by this many endpoints' share (and its own requests give each home this much of a share). */
        margin: z
          .number()
          .gt(
            0,
            "must be above 0 (0.5: another home once a prefix's holders are sent half an endpoint's share more than their shares)",
          )
          .default(0.5),
        /** Time constant of the decayed request counts, seconds. */
        windowSeconds: z.number().positive().default(30),
        /** A prefix with fewer decayed requests than this is never hot. */
        minRequests: z.number().positive().default(16),
      })
      .optional(),
    prefixMatchInfoProducerName: z.string().min(1).optional(),
    inFlightLoadProducerName: z.string().min(1).optional(),
    latencyPredictionInfoProducerName: z.string().min(1).optional(),
  })
  .superRefine((p, ctx) => {
    if (p.releaseWhenSlotsFull && (p.maxTTFTPenaltyMs === 0 || p.ttftSource === "latencyPredictor")) {
      ctx.addIssue({
        code: "custom",
        path: ["releaseWhenSlotsFull"],
        message:
          "works with the prefill-throughput gate only: set maxTTFTPenaltyMs > 0 and ttftSource: prefillThroughput, or drop releaseWhenSlotsFull",
      });
    }
    if (p.ttftSource !== "latencyPredictor" && p.maxTTFTPenaltyMs > 0 && p.peakPrefillThroughput === 0) {
      ctx.addIssue({
        code: "custom",
        path: ["peakPrefillThroughput"],
        message: "must be > 0 when maxTTFTPenaltyMs > 0 and ttftSource is prefillThroughput",
      });
    }
  });
export type AffinityParams = z.output<typeof affinityParams>;

export type AffinityDecision =
  | "not-applicable"
  | "exploration"
  | "no-match"
  | "missing-signal"
  | "load-override"
  | "slots-full"
  | "hot-prefix"
  | "sticky";

export class PrefixCacheAffinityFilter implements Filter, PreRequestHook {
  readonly typedName: TypedName;
  readonly #prefix: DataKey<PrefixMatchInfo>;
  readonly #inflight: DataKey<InFlightInfo> | null;
  /** ttftSource latencyPredictor (with a load gate): the producer whose predicted TTFTs gate. */
  readonly #latency: DataKey<LatencyPredictions> | null;
  readonly #decision: DataKey<AffinityDecision>;
  /** spreadHotPrefixes: the request's prefix keys, counted when it is picked. */
  readonly #keys: DataKey<number[]>;
  /** Per-call scratch: which of the endpoints are sticky (index-aligned). */
  #isSticky = new Uint8Array(64);
  /** Decisions taken, by outcome (llm-d records the same as a metric). */
  readonly decisions: Record<AffinityDecision, number> = {
    "not-applicable": 0,
    exploration: 0,
    "no-match": 0,
    "missing-signal": 0,
    "load-override": 0,
    "slots-full": 0,
    "hot-prefix": 0,
    sticky: 0,
  };
  /** spreadHotPrefixes: requests per prefix and for the whole pool, decayed; null when off. */
  readonly #rates: PrefixRates | null;
  /** releaseWhenSlotsFull: each endpoint's learned sequence-slot cap, and its completions' pace. */
  readonly #caps = new SlotCaps();
  readonly #pace = new Map<string, { last: number; interval: number }>();
  /** Per-call scratch of #sooner: each sticky endpoint's estimated start (ms). */
  #starts = new Float64Array(8);

  constructor(
    name: string,
    readonly params: AffinityParams,
  ) {
    this.typedName = { type: AFFINITY_FILTER_TYPE, name };
    this.#prefix = prefixKey(params.prefixMatchInfoProducerName as string);
    const gate = params.maxTTFTPenaltyMs > 0;
    const predicted = params.ttftSource === "latencyPredictor";
    this.#inflight = gate && !predicted ? inflightKey(params.inFlightLoadProducerName as string) : null;
    this.#latency = gate && predicted ? latencyKey(params.latencyPredictionInfoProducerName as string) : null;
    this.#decision = dataKey(`prefix-cache-affinity/${name}`);
    this.#keys = dataKey(`prefix-cache-affinity/${name}/keys`);
    const spread = params.spreadHotPrefixes;
    this.#rates = spread === undefined ? null : new PrefixRates(spread.windowSeconds);
  }

  consumes() {
    const gate = this.#inflight ?? this.#latency;
    return { required: gate ? [this.#prefix, gate] : [this.#prefix] };
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    const p = this.params;
    if (endpoints.length <= 1 || p.affinityThreshold <= 0) return this.#done("not-applicable", endpoints);
    if (p.explorationProbability > 0 && cycle.rng.next() < p.explorationProbability) {
      return this.#done("exploration", endpoints);
    }
    const info = cycle.get(this.#prefix);
    // No endpoint holds a block: nobody reaches the threshold (> 0), so skip the per-endpoint walk.
    if (info === undefined || info.totalBlocks <= 0 || !info.anyMatch)
      return this.#done("no-match", endpoints);
    const n = endpoints.length;
    if (this.#isSticky.length < n) this.#isSticky = new Uint8Array(n * 2);
    const isSticky = this.#isSticky;
    const sticky = this.#markSticky(cycle, info, endpoints, isSticky);
    if (sticky.length === 0) return this.#done("no-match", endpoints);
    if (this.#rates !== null && sticky.length < n) {
      const spread = this.#spread(cycle, this.#rates, info, endpoints);
      if (spread !== null) return this.#done("hot-prefix", spread);
    }
    if (this.#latency !== null && sticky.length < n) {
      const d = this.#predictedGate(cycle, endpoints, isSticky, this.#latency);
      cycle.set(this.#decision, d ?? "sticky");
      if (d !== null) return this.#done(d, endpoints);
    }
    if (this.#inflight !== null && sticky.length < n) {
      const load = cycle.get(this.#inflight);
      if (load === undefined) return this.#done("not-applicable", endpoints);
      const learned = p.learnPrefillThroughput ? load.prefillRate?.bind(load) : undefined;
      const rate = (id: string) => learned?.(id) ?? p.peakPrefillThroughput;
      const ttft = (id: string) => (load.tokens(id) / rate(id)) * 1000;
      if (p.releaseWhenSlotsFull) {
        const free = this.#sooner(endpoints, sticky, isSticky, load, ttft, rate, cycle.now);
        if (free !== null) return this.#done("slots-full", free);
      }
      let bestSticky = Number.POSITIVE_INFINITY;
      for (const e of sticky) {
        const t = ttft(e.id);
        if (t < bestSticky) bestSticky = t;
      }
      // penalty = bestSticky − bestRest ≤ bestSticky (TTFTs are ≥ 0): the rest only matter when
      // the sticky endpoints alone are already slower than the allowed penalty.
      if (!(bestSticky <= p.maxTTFTPenaltyMs)) {
        let bestRest = Number.POSITIVE_INFINITY;
        const at = endpoints === cycle.candidates ? (load.byPosition?.() ?? null) : null;
        for (let i = 0; i < n; i++) {
          if (isSticky[i] === 1) continue;
          const t =
            at !== null && learned === undefined
              ? (at.tokens[i] / p.peakPrefillThroughput) * 1000
              : ttft(endpoints[i].id);
          if (t < bestRest) bestRest = t;
        }
        if (bestSticky - bestRest > p.maxTTFTPenaltyMs) return this.#done("load-override", endpoints);
      }
    }
    return this.#done("sticky", sticky);
  }

  /**
   * releaseWhenSlotsFull: when every sticky endpoint's slots are taken, the endpoints with a free slot
   * that would start the request sooner than the best sticky one (TTFTs in ms); when only some are,
   * the sticky endpoints without the full ones that would start it later than the best of the
   * others; else null.
   */
  #sooner(
    endpoints: readonly EndpointState[],
    sticky: readonly EndpointState[],
    isSticky: Uint8Array,
    load: InFlightInfo,
    ttft: (id: string) => number,
    rate: (id: string) => number,
    now: number,
  ): EndpointState[] | null {
    // Every scrape is read, so each cap is learned whether or not its endpoint is sticky this time.
    const stalled = (id: string) => stalledAt(load, id, now);
    for (const e of endpoints) this.#caps.read(e, undefined, stalled);
    const lowest = this.#caps.lowest;
    if (lowest === undefined) return null;
    // Each sticky endpoint's start: its queued prefill, plus the wait for a slot when it is full
    // (bestSticky: the best full one's, read only when every sticky endpoint is full).
    let bestSticky = Number.POSITIVE_INFINITY;
    let bestOpen = Number.POSITIVE_INFINITY;
    const starts =
      this.#starts.length >= sticky.length
        ? this.#starts
        : (this.#starts = new Float64Array(sticky.length * 2));
    for (let j = 0; j < sticky.length; j++) {
      const e = sticky[j];
      const cap = this.#caps.capOf(e.id);
      const pace = this.#pace.get(e.id)?.interval;
      const ahead = cap === undefined ? -1 : load.requests(e.id) - cap;
      const start = ttft(e.id);
      if (ahead < 0 || pace === undefined || Number.isNaN(pace)) {
        // A free slot, or no cap or pace learned yet: no wait for a slot is known (NaN: open).
        bestOpen = Math.min(bestOpen, start);
        starts[j] = Number.NaN;
      } else {
        // The slot frees when the (ahead + 1)-th of the running requests ends: at the completions'
        // pace on average, but a full batch's next end comes at no steady beat. The request is held
        // to its TTFT at the tail, so the wait counted is the 90th percentile of k gaps of that
        // mean, as if completions came at random: k·pace + z₀.₉·√k·pace (normal approximation).
        const k = ahead + 1;
        starts[j] = start + (k + Z90 * Math.sqrt(k)) * pace * 1000;
        bestSticky = Math.min(bestSticky, starts[j]);
      }
    }
    if (bestOpen < Number.POSITIVE_INFINITY) {
      // A sticky endpoint with a free slot (or none known full): the full ones that would start the
      // request later than the best open one are dropped, and the request stays on sticky ones.
      let late = 0;
      for (let j = 0; j < sticky.length; j++) if (starts[j] > bestOpen) late++;
      if (late === 0) return null;
      const keep: EndpointState[] = [];
      for (let j = 0; j < sticky.length; j++) if (!(starts[j] > bestOpen)) keep.push(sticky[j]);
      return keep;
    }
    const free: EndpointState[] = [];
    for (let i = 0; i < endpoints.length; i++) {
      if (isSticky[i] === 1) continue;
      const e = endpoints[i];
      if (load.requests(e.id) >= (this.#caps.capOf(e.id) ?? lowest)) continue;
      const start = ttft(e.id) + (load.uncachedRequestTokens(e.id) / rate(e.id)) * 1000;
      if (start < bestSticky) free.push(e);
    }
    return free.length > 0 ? free : null;
  }

  /**
   * spreadHotPrefixes: names the request's prefix at each power-of-two depth (in blocks) up to the
   * part that makes endpoints sticky (hot-prefixes.ts), to be counted when it is picked. When, at
   * the deepest of those, the requests sent to the prefix's holders exceed their fair shares by more
   * than `margin` of one share, the endpoints that do not hold it that deep (the scorers then pick
   * one, which becomes another home); else null.
   */
  #spread(
    cycle: CycleState,
    rates: PrefixRates,
    info: PrefixMatchInfo,
    endpoints: readonly EndpointState[],
  ): EndpointState[] | null {
    const now = cycle.now;
    const spread = this.params.spreadHotPrefixes as NonNullable<AffinityParams["spreadHotPrefixes"]>;
    const depth = Math.ceil(this.params.affinityThreshold * info.totalBlocks);
    // Counted at every depth, so a shorter prompt's deepest depth sees the longer ones sharing it;
    // judged only at the deepest, the prefix that makes the homes sticky: a shallower one (a system
    // prompt before a long conversation) may be hot while the rest of the prompt is only here.
    const keys: number[] = [];
    for (let d = 1; d <= depth; d *= 2) {
      const key = info.prefixKey?.(d);
      if (key === undefined) break;
      keys.push(key);
    }
    if (keys.length === 0) return null;
    cycle.set(this.#keys, keys);
    const at = 2 ** (keys.length - 1);
    const seen = rates.prefix(keys[keys.length - 1], now) + 1;
    if (seen < spread.minRequests) return null;
    const pool = rates.requests(now);
    const share = pool / endpoints.length;
    // What the holders were sent: this prefix's requests and those of the prefixes homed beside it
    // (at least the prefix's own, should an endpoint it went to have evicted it since).
    let homes = 0;
    let sent = 0;
    const holder = (id: string) => {
      homes++;
      sent += rates.picks(id, now);
    };
    const held = info.matches?.();
    const positions = held !== undefined ? cycle.positions(endpoints) : null;
    if (held !== undefined && positions !== null) {
      for (const [id, blocks] of held) if (blocks >= at && positions.indexOf(id) >= 0) holder(id);
    } else for (const e of endpoints) if (info.matchBlocks(e.id) >= at) holder(e.id);
    // Another home only while the prefix's own requests would give each home, the new one
    // included, at least `margin` of a share: what the holders were sent falls a window late after
    // a new home (the prefix's requests move to it only as they come), and a prefix whose homes are
    // busy with other prefixes' requests is not handed around the pool for it.
    if (Math.max(seen, sent) - homes * share <= spread.margin * share) return null;
    if (seen < spread.margin * (homes + 1) * share) return null;
    const rest: EndpointState[] = [];
    for (const e of endpoints) if (info.matchBlocks(e.id) < at) rest.push(e);
    return rest.length > 0 ? rest : null;
  }

  /** spreadHotPrefixes: counts the picked request for its endpoint and its prefix. */
  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void {
    if (this.#rates === null || result.target === null) return;
    this.#rates.countPick(result.target.id, now);
    for (const key of cycle.get(this.#keys) ?? []) this.#rates.countPrefix(key, now);
  }

  /** releaseWhenSlotsFull: the pace at which the endpoint's responses end (seconds apart, smoothed). */
  onResponseComplete(_req: RequestFacts, endpointId: string, now: number): void {
    if (!this.params.releaseWhenSlotsFull) return;
    const p = this.#pace.get(endpointId);
    if (p === undefined) {
      this.#pace.set(endpointId, { last: now, interval: Number.NaN });
      return;
    }
    const gap = now - p.last;
    p.last = now;
    p.interval = Number.isNaN(p.interval) ? gap : p.interval + PACE_WEIGHT * (gap - p.interval);
  }

  /** Endpoints that left the pool take their learned caps and pace with them. */
  retainEndpoints(pool: ReadonlySet<string>): void {
    this.#caps.retain(pool);
    this.#rates?.retainEndpoints(pool);
    for (const id of [...this.#pace.keys()]) if (!pool.has(id)) this.#pace.delete(id);
  }

  /**
   * llm-d's load gate on predicted TTFT: keep all ("load-override") when the best sticky endpoint's
   * predicted TTFT exceeds the best other's by more than maxTTFTPenaltyMs, or ("missing-signal")
   * when either side has no prediction; null keeps the sticky ones.
   */
  #predictedGate(
    cycle: CycleState,
    endpoints: readonly EndpointState[],
    isSticky: Uint8Array,
    key: DataKey<LatencyPredictions>,
  ): AffinityDecision | null {
    const preds = cycle.get(key);
    let bestSticky = Number.POSITIVE_INFINITY;
    let bestRest = Number.POSITIVE_INFINITY;
    for (let i = 0; i < endpoints.length; i++) {
      const t = preds?.get(endpoints[i].id)?.ttftMs;
      if (t === undefined) continue;
      if (isSticky[i] === 1) bestSticky = Math.min(bestSticky, t);
      else bestRest = Math.min(bestRest, t);
    }
    if (bestSticky === Number.POSITIVE_INFINITY || bestRest === Number.POSITIVE_INFINITY)
      return "missing-signal";
    return bestSticky - bestRest > this.params.maxTTFTPenaltyMs ? "load-override" : null;
  }

  explain(cycle: CycleState): Record<string, unknown> | undefined {
    const d = cycle.get(this.#decision);
    if (d === undefined) return undefined;
    return d === "missing-signal"
      ? { decision: d, fallback: "no latency predictions yet: TTFT load gate skipped, every endpoint kept" }
      : { decision: d };
  }

  /**
   * The sticky endpoints (matchBlocks/totalBlocks ≥ threshold), in candidate order, with
   * isSticky[i] set for each. When the producer lists its matched endpoints and the cycle keeps
   * positions for `endpoints`, only those few are looked up; otherwise every endpoint is checked.
   */
  #markSticky(
    cycle: CycleState,
    info: PrefixMatchInfo,
    endpoints: readonly EndpointState[],
    isSticky: Uint8Array,
  ): EndpointState[] {
    const threshold = this.params.affinityThreshold;
    const n = endpoints.length;
    isSticky.fill(0, 0, n);
    const matched = info.matches?.();
    const positions = matched !== undefined ? cycle.positions(endpoints) : null;
    const sticky: EndpointState[] = [];
    if (matched !== undefined && positions !== null) {
      const at: number[] = [];
      for (const [id, blocks] of matched) {
        if (blocks / info.totalBlocks < threshold) continue;
        const i = positions.indexOf(id);
        if (i >= 0 && isSticky[i] === 0) {
          isSticky[i] = 1;
          at.push(i);
        }
      }
      at.sort((a, b) => a - b);
      for (const i of at) sticky.push(endpoints[i]);
      return sticky;
    }
    for (let i = 0; i < n; i++) {
      if (matchRatio(info, endpoints[i].id) < threshold) continue;
      isSticky[i] = 1;
      sticky.push(endpoints[i]);
    }
    return sticky;
  }

  #done(d: AffinityDecision, eps: readonly EndpointState[]): readonly EndpointState[] {
    this.decisions[d]++;
    return eps;
  }

  stats() {
    return { ...this.decisions };
  }

  /** The hand-set rate beside the learned one (the in-flight producer's view shows that). */
  endpointView(): Record<string, unknown> {
    return {
      peakPrefillThroughput: this.params.peakPrefillThroughput,
      learnPrefillThroughput: this.params.learnPrefillThroughput,
      maxTTFTPenaltyMs: this.params.maxTTFTPenaltyMs,
      releaseWhenSlotsFull: this.params.releaseWhenSlotsFull,
      ...(this.params.spreadHotPrefixes !== undefined
        ? { spreadHotPrefixes: this.params.spreadHotPrefixes }
        : {}),
    };
  }
}

/** Weight of the newest gap in the completions' moving average. */
const PACE_WEIGHT = 0.2;
/** The standard normal's 90th percentile. */
const Z90 = 1.2816;

export const affinityFilterSpec = spec({
  type: AFFINITY_FILTER_TYPE,
  stability: "stable",
  kind: "filter",
  summary: "Sticks to endpoints holding ≥ affinityThreshold of the prefix until they are too loaded.",
  params: affinityParams,
  needs: (p) => {
    const needs: Need[] = [
      { family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true },
    ];
    if (p.maxTTFTPenaltyMs > 0 && p.ttftSource === "latencyPredictor")
      needs.push({
        family: "latency-prediction-info",
        param: "latencyPredictionInfoProducerName",
        required: true,
      });
    else if (p.maxTTFTPenaltyMs > 0)
      needs.push({ family: "inflight-load", param: "inFlightLoadProducerName", required: true });
    return needs;
  },
  unsupportedParams: {
    prefillCalibrationFile: "kvgate config is loaded from text, not paths; set peakPrefillThroughput instead",
    prefillCalibrationFingerprint: "calibration records are not supported; set peakPrefillThroughput instead",
    prefillCalibrationRequired: "calibration records are not supported; set peakPrefillThroughput instead",
  },
  factory: (name, p) => new PrefixCacheAffinityFilter(name, p),
});
