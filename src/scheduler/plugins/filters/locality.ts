/**
 * locality-filter (kvgate; llm-d has no locality plugin): keep a request in the gateway's own
 * locality and spill to the next-nearest one only while the local endpoints are saturated.
 *
 * Localities come from endpoint labels, coarsest first (default `topology.kubernetes.io/region`,
 * then `.../zone`, the well-known Kubernetes node labels). An endpoint's distance from the origin is
 * the number of those labels, from the coarsest, that differ: same zone 0, same region 1, elsewhere
 * 2 (further regions are ordered by `rttMs` when given, else by name). The origin is the gateway's
 * own locality (`origin`), or the request's `locality` fact when the caller sets one (the fleet
 * simulator, for requests arriving at several regions' gateways). Headers never set it.
 *
 * Spilling: the nearest group is kept alone unless its saturation — the utilization detector's
 * measure, average over the group of max(queue / queueDepthThreshold, KV use /
 * kvCacheUtilThreshold) — has reached `spillThreshold`; then the nearest other group with headroom
 * joins, and so on. A group itself saturated (≥ 1.0, the utilization detector's own line) is passed
 * over — two busy regions spilling into each other would only trade their traffic — and with none
 * that has headroom the traffic stays home. While a group spills, its endpoints that are themselves
 * at or above `stepAsideThreshold` (default: `spillThreshold`) are left out, so the overflow goes
 * to the group that joined instead of back to a warm local replica that the prefix scorer favours;
 * the other local endpoints stay in. With `maxNumSeqs` (below), which sees a full batch at once,
 * set it to 1.0: a replica then keeps its prefix groups until it is really saturated, and a group
 * moves only then (the prefix scorers keep it where it went). At a low threshold, ordinary load (a
 * queue of one, a cold prompt in flight) pushes warm replicas out, and with many prompts per region
 * each step aside sends a group's next requests to replicas that must prefill it afresh. Of the
 * group that joined, only its endpoints below 1.0 are candidates: spilled traffic pays a round trip
 * already and must not also queue behind a full remote batch. Hysteresis: once a group spilled it
 * keeps spilling until its saturation falls below `recoverThreshold`, so a pool near the threshold
 * does not flap between local and remote (each flap shreds prefix locality). With `spill: false`
 * the filter is "local only": the nearest group that has any endpoint, always.
 *
 * When: the saturation is measured every `remeasureMs` between requests, in refresh() (the
 * gateway's timer, the simulator's clock; Scheduler.refreshIntervalS), for every origin requests
 * came from lately; a request only reads the last measurement. Measuring reads every endpoint of
 * the pool (tens of µs at 256), which on the request path was most of the step's p99. A caller
 * that never calls refresh() gets the same measure on the first request after each `remeasureMs`.
 *
 * `maxNumSeqs` (the replicas' vLLM `--max-num-seqs`) adds the gateway's own request count: a replica
 * it has that many requests in flight on has a full batch, where one more waits for a running
 * request to end (hundreds of ms for long answers) while its prefix cache makes it look the best
 * choice. It counts as saturation 1.0, and between measurements a replica whose batch fills is
 * dropped from the list on the next request (unless every candidate is full), so no request is sent
 * into a full batch while another candidate has a free place. Scrapes lag by up to a scrape period;
 * the in-flight count does not.
 */
import { z } from "zod";
import { UtilizationDetector } from "../../../flow/utilization-detector.ts";
import { type PluginHandle, spec } from "../../plugin-spec.ts";
import type { CycleState, DataKey, EndpointState, Filter, TypedName } from "../../types.ts";
import { type InFlightInfo, type InFlightLoad, inflightKey } from "../data.ts";

export const LOCALITY_FILTER_TYPE = "locality-filter";
export const REGION_LABEL = "topology.kubernetes.io/region";
export const ZONE_LABEL = "topology.kubernetes.io/zone";

/** The in-flight producer's counts by candidate position (InFlightInfo.byPosition). */
type Aligned = NonNullable<ReturnType<NonNullable<InFlightInfo["byPosition"]>>>;

export const localityParams = z
  .strictObject({
    /** Locality labels, coarsest first. */
    labels: z.array(z.string().min(1)).min(1).default([REGION_LABEL, ZONE_LABEL]),
    /** This gateway's locality: label → value (a missing label matches nothing). */
    origin: z.record(z.string(), z.string()).default({}),
    spill: z.boolean().default(true),
    /** Saturation (≥ this) at which the next locality joins. */
    spillThreshold: z.number().positive().default(1),
    /**
     * While a locality spills, its endpoints at or above this saturation step aside (default: the
     * spillThreshold). 1.0 with maxNumSeqs: see the header.
     */
    stepAsideThreshold: z.number().positive().optional(),
    /** Saturation (< this) at which a spilling locality takes its traffic back. */
    recoverThreshold: z.number().positive().default(0.8),
    /** The utilization measure's thresholds (utilization-detector's parameters and defaults). */
    queueDepthThreshold: z.number().positive().default(5),
    kvCacheUtilThreshold: z.number().positive().default(0.8),
    metricsStalenessThreshold: z.string().default("2s"),
    /**
     * Saturation is re-measured at most this often (ms); in between, requests get the last answer.
     * Half the default scrape period: the metrics it reads do not change faster. 0 = every request.
     */
    remeasureMs: z.number().nonnegative().default(50),
    /**
     * Optional: uncached prompt tokens the gateway itself has in flight on an endpoint that count as
     * saturation 1.0 (from the inflight-load-producer named by inFlightLoadProducerName). The
     * gateway's own dispatches are fresher than any scrape, so a spike is seen at its first requests.
     */
    inflightTokensThreshold: z.number().positive().optional(),
    inFlightLoadProducerName: z.string().min(1).optional(),
    /**
     * Optional: the replicas' vLLM `--max-num-seqs`. A replica the gateway has this many requests in
     * flight on has a full batch — one more waits for a running request to end, which no scrape
     * shows until the next one — and counts as saturation 1.0.
     */
    maxNumSeqs: z.number().int().positive().optional(),
    /** Round-trip times between values of the coarsest label, "a/b": ms (either order). */
    rttMs: z.record(z.string(), z.number().nonnegative()).default({}),
  })
  .refine((p) => p.recoverThreshold <= p.spillThreshold, {
    message: "recoverThreshold must not exceed spillThreshold (it is the lower edge of the hysteresis)",
  });
export type LocalityParams = z.output<typeof localityParams>;

/** A list of endpoints with each one's position in the candidate list it was taken from. */
interface Placed {
  readonly list: readonly EndpointState[];
  /** pos[i]: list[i]'s index in the endpoint list the grouping was made from. */
  readonly pos: Int32Array;
}

/** One origin's grouping of one endpoint list. */
interface Grouping {
  readonly endpoints: readonly EndpointState[];
  /** Each endpoint's labels object when grouped (the datastore replaces it when labels change). */
  readonly labels: readonly object[];
  readonly groups: readonly Placed[];
}

/** One origin's last measurement: over which grouping, when, and the list it gave. */
interface Measurement {
  readonly grouping: Grouping;
  at: number;
  /** The last request from this origin (refresh() forgets origins idle for IDLE_ORIGIN_S). */
  usedAt: number;
  out: Placed;
}

/** A measurement's per-group saturations, read on demand (each group at most once). */
type Reader = (g: number) => Float64Array;

/** The in-flight counts of an endpoint, read by id (inflight-load-producer's load()). */
interface LoadSource {
  load(endpointId: string): InFlightLoad;
}

/** A driven measurement older than this many periods means the timer stalled: requests re-measure. */
const STALE_PERIODS = 4;
/** refresh() stops re-measuring an origin no request has come from for this long (seconds). */
const IDLE_ORIGIN_S = 10;

export class LocalityFilter implements Filter {
  readonly typedName: TypedName;
  readonly params: LocalityParams;
  readonly #measure: UtilizationDetector;
  /** Origin key → how many groups it currently spills into beyond the nearest (hysteresis state). */
  readonly #spilling = new Map<string, number>();
  /** Origin key → its last grouping: remade only when the endpoint list or a labels object changes. */
  readonly #groupings = new Map<string, Grouping>();
  /** Origin key → its last measurement. */
  readonly #measured = new Map<string, Measurement>();
  /** refresh() has been called: measurements are taken between requests, on its timer. */
  #driven = false;
  /** The configured origin's key (most requests carry no locality of their own). */
  readonly #originKey: string;
  /** The in-flight view, when inflightTokensThreshold or maxNumSeqs is set. */
  readonly #inflight: DataKey<InFlightInfo> | null;
  /** Other plugins by name (the in-flight producer, for refresh()); absent in bare tests. */
  readonly #handle: PluginHandle | undefined;
  /** remeasureMs in seconds. */
  readonly #remeasureS: number;

  constructor(
    name = LOCALITY_FILTER_TYPE,
    params: Partial<z.input<typeof localityParams>> = {},
    handle?: PluginHandle,
  ) {
    this.typedName = { type: LOCALITY_FILTER_TYPE, name };
    this.params = localityParams.parse(params);
    this.#measure = new UtilizationDetector(`${name}/saturation`, {
      queueDepthThreshold: this.params.queueDepthThreshold,
      kvCacheUtilThreshold: this.params.kvCacheUtilThreshold,
      metricsStalenessThreshold: this.params.metricsStalenessThreshold,
    });
    this.#remeasureS = this.params.remeasureMs / 1000;
    this.#inflight =
      this.params.inflightTokensThreshold === undefined && this.params.maxNumSeqs === undefined
        ? null
        : inflightKey(this.#producerName());
    this.#handle = handle;
    this.#originKey = originKey(this.params.labels, this.params.origin);
  }

  #producerName(): string {
    return this.params.inFlightLoadProducerName ?? "inflight-load-producer";
  }

  consumes() {
    return { required: this.#inflight ? [this.#inflight] : [] };
  }

  /**
   * The saturation measure is taken between requests, every remeasureMs, when the caller drives
   * refresh() (the gateway's timer, the simulator's clock); null when the filter never spills
   * (nothing to measure) or remeasureMs is 0 (every request measures).
   */
  get refreshIntervalS(): number | null {
    return this.params.spill && this.#remeasureS > 0 ? this.#remeasureS : null;
  }

  /** One endpoint's saturation: the utilization measure, or the in-flight terms when larger. */
  #saturation(e: EndpointState, now: number, requests: number, tokens: number): number {
    const s = this.#measure.endpointSaturation(e, now);
    const p = this.params;
    const t = p.inflightTokensThreshold === undefined ? 0 : tokens / p.inflightTokensThreshold;
    const full = p.maxNumSeqs !== undefined && requests >= p.maxNumSeqs ? 1 : 0;
    return Math.max(s, t, full);
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    if (endpoints.length === 0) return endpoints;
    const own = cycle.request.locality;
    const origin = own ?? this.params.origin;
    const key = own === undefined ? this.#originKey : originKey(this.params.labels, own);
    // The measure reads only scraped metrics, which change once per scrape (100 ms by default):
    // re-measuring on every request repeats the same answer at the cost of reading every endpoint.
    // With refresh() driven, the measurement is taken between requests and a request only reads it
    // (it measures itself only when the timer has stalled); without, the first request after
    // remeasureMs takes it. Within a measurement's window labels are not re-read on the request
    // path (a relabel waits ≤ remeasureMs; refresh() checks them).
    const last = this.#measured.get(key);
    const now = cycle.now;
    const maxAge = this.#driven ? STALE_PERIODS * this.#remeasureS : this.#remeasureS;
    const fresh = last !== undefined && now >= last.at && now - last.at < maxAge;
    const grouping = this.#grouped(key, origin, endpoints, !fresh);
    const groups = grouping.groups;
    let out: Placed | null;
    if (groups.length === 1) out = null;
    else if (!this.params.spill) out = groups[0];
    else if (fresh && last.grouping === grouping) {
      out = last.out;
      last.usedAt = now;
    } else {
      out = this.#spill(key, groups, last?.out, this.#requestReader(cycle, endpoints, groups, now));
      this.#measured.set(key, { grouping, at: now, usedAt: now, out });
    }
    const max = this.params.maxNumSeqs;
    if (max === undefined) return out === null ? endpoints : out.list;
    return this.#notFull(cycle, endpoints, out, max);
  }

  /**
   * Re-measures every origin a request came from lately, over the grouping that request saw, so
   * the next requests read the result. A grouping whose endpoints were relabelled is dropped: the
   * next request regroups and measures. The in-flight terms are read by id from the producer.
   */
  refresh(now: number): void {
    if (!this.params.spill) return;
    this.#driven = true;
    const src = this.#inflight === null ? undefined : this.#loadSource();
    for (const [key, m] of this.#measured) {
      if (now - m.usedAt > IDLE_ORIGIN_S) {
        this.#measured.delete(key);
        this.#groupings.delete(key);
        continue;
      }
      const g = m.grouping;
      if (this.#groupings.get(key) !== g || !sameLabels(g)) {
        this.#measured.delete(key);
        continue;
      }
      const read: Reader = (k) =>
        Float64Array.from(g.groups[k].list, (e) => {
          const l = src?.load(e.id);
          return this.#saturation(e, now, l?.requests ?? 0, l?.tokens ?? 0);
        });
      m.out = this.#spill(key, g.groups, m.out, read);
      m.at = now;
    }
  }

  /** The in-flight producer, when it can be read outside a request (inflight-load-producer). */
  #loadSource(): LoadSource | undefined {
    const p = this.#handle?.plugin(this.#producerName()) as Partial<LoadSource> | undefined;
    return typeof p?.load === "function" ? (p as LoadSource) : undefined;
  }

  /**
   * The in-flight producer's counts by position, when they are aligned with `endpoints` (the
   * candidate list, indexed): then a grouping's positions read them with no lookup by id.
   */
  #aligned(cycle: CycleState, endpoints: readonly EndpointState[], info: InFlightInfo): Aligned | null {
    if (endpoints !== cycle.candidates || cycle.positions(endpoints) === null) return null;
    return info.byPosition?.() ?? null;
  }

  /** A request's reader of the groups' saturations. */
  #requestReader(
    cycle: CycleState,
    endpoints: readonly EndpointState[],
    groups: readonly Placed[],
    now: number,
  ): Reader {
    const info = this.#inflight ? cycle.get(this.#inflight) : undefined;
    const at = info === undefined ? null : this.#aligned(cycle, endpoints, info);
    return (g) => {
      const { list, pos } = groups[g];
      const s = new Float64Array(list.length);
      for (let k = 0; k < list.length; k++) {
        const e = list[k];
        if (info === undefined) s[k] = this.#saturation(e, now, 0, 0);
        else if (at !== null) s[k] = this.#saturation(e, now, at.requests[pos[k]], at.tokens[pos[k]]);
        else s[k] = this.#saturation(e, now, info.requests(e.id), info.tokens(e.id));
      }
      return s;
    };
  }

  /**
   * The list (`out`, or every endpoint when null) without the endpoints whose batch filled since
   * the measurement, unless all are full. On every request: reads the in-flight request counts
   * by position through the list's positions, no lookup by id.
   */
  #notFull(
    cycle: CycleState,
    endpoints: readonly EndpointState[],
    out: Placed | null,
    max: number,
  ): readonly EndpointState[] {
    const list = out === null ? endpoints : out.list;
    const info = cycle.get(this.#inflight as DataKey<InFlightInfo>);
    if (info === undefined) return list;
    const req = this.#aligned(cycle, endpoints, info)?.requests ?? null;
    let kept: EndpointState[] | null = null;
    for (let i = 0; i < list.length; i++) {
      const r = req === null ? info.requests(list[i].id) : req[out === null ? i : out.pos[i]];
      if (r >= max && kept === null) kept = list.slice(0, i);
      else if (r < max && kept !== null) kept.push(list[i]);
    }
    if (kept === null) return list;
    return kept.length > 0 ? kept : list;
  }

  /**
   * Measures `key`'s saturation: the nearest group alone, or the spill list (see the header).
   * `read` gives a group's members' saturations; `prev` is the last list, returned itself when the
   * members are the same.
   */
  #spill(key: string, groups: readonly Placed[], prev: Placed | undefined, read: Reader): Placed {
    const was = this.#spilling.get(key) ?? 0;
    // Each endpoint's saturation is read once per measurement, when a group is first looked at: the
    // joining loop, the step-aside pass and the headroom pass below all reuse it.
    const sat: (Float64Array | undefined)[] = new Array(groups.length);
    const of = (g: number): Float64Array => {
      let s = sat[g];
      if (s === undefined) sat[g] = s = read(g);
      return s;
    };
    const mean = (g: number): number => {
      const s = of(g);
      let sum = 0;
      for (const v of s) sum += v;
      return s.length === 0 ? 1 : sum / s.length;
    };
    // The nearest group with headroom joins while the groups already in are saturated together (or
    // were, and have not recovered). A group itself saturated (≥ 1.0, the utilization detector's
    // line) is passed over: two busy regions spilling into each other would only trade their traffic.
    const joined = [0];
    let sum = 0;
    let n = 0;
    let next = 1;
    while (next < groups.length) {
      const last = joined[joined.length - 1];
      for (const v of of(last)) sum += v;
      n += groups[last].list.length;
      const threshold = joined.length - 1 < was ? this.params.recoverThreshold : this.params.spillThreshold;
      if (sum / n < threshold) break;
      while (next < groups.length && mean(next) >= 1) next++;
      if (next === groups.length) break;
      joined.push(next++);
    }
    if (joined.length === 1) {
      this.#spilling.delete(key);
      // The cached group itself: while the pool is unchanged later plugins see the same array
      // object and keep their per-list caches (CycleState.positions).
      return groups[0];
    }
    this.#spilling.set(key, joined.length - 1);
    // Spilling: the nearer groups' endpoints at stepAsideThreshold step aside, so the overflow
    // really leaves (a warm, busy local replica would otherwise keep winning on its prefix cache);
    // their other endpoints stay candidates beside the group that joined last. The group that
    // joined gives only its endpoints with headroom: spilled traffic must not queue behind a remote
    // batch that is itself full (the group has some, or it was passed over above).
    const list: EndpointState[] = [];
    const pos: number[] = [];
    const stepAside = this.params.stepAsideThreshold ?? this.params.spillThreshold;
    const j = joined[joined.length - 1];
    for (const g of joined) {
      const s = of(g);
      const below = g === j ? 1 : stepAside;
      for (let i = 0; i < s.length; i++)
        if (s[i] < below) {
          list.push(groups[g].list[i]);
          pos.push(groups[g].pos[i]);
        }
    }
    // The same members as last time: the same array object, so later plugins' per-list caches hold.
    const p = prev?.list;
    if (p !== undefined && p.length === list.length && list.every((e, i) => e === p[i]))
      return prev as Placed;
    return { list, pos: Int32Array.from(pos) };
  }

  /** How many groups `origin`'s traffic currently spills into beyond its own (for /explain, tests). */
  spilling(origin: Record<string, string> = this.params.origin): number {
    return this.#spilling.get(originKey(this.params.labels, origin)) ?? 0;
  }

  #grouped(
    key: string,
    origin: Record<string, string>,
    endpoints: readonly EndpointState[],
    checkLabels: boolean,
  ): Grouping {
    // Callers may pass a fresh array per request: compare the elements (and, unless told not to,
    // their labels objects), so an unchanged pool is never regrouped. Comparing elements reads
    // only the arrays, never the endpoint objects. Equal elements also keep the positions valid.
    const last = this.#groupings.get(key);
    const n = endpoints.length;
    if (last !== undefined && last.endpoints.length === n) {
      let i = 0;
      while (i < n && endpoints[i] === last.endpoints[i]) i++;
      if (i === n && (!checkLabels || sameLabels(last))) return last;
    }
    const at = new Map<EndpointState, number>();
    for (let i = n - 1; i >= 0; i--) at.set(endpoints[i], i);
    const grouping: Grouping = {
      endpoints: endpoints.slice(),
      labels: endpoints.map((e) => e.labels),
      groups: this.groups(origin, endpoints).map((list) => ({
        list,
        pos: Int32Array.from(list, (e) => at.get(e) as number),
      })),
    };
    this.#groupings.set(key, grouping);
    return grouping;
  }

  /** The endpoints grouped by distance from `origin`, nearest first; empty groups left out. */
  groups(origin: Record<string, string>, endpoints: readonly EndpointState[]): EndpointState[][] {
    const labels = this.params.labels;
    const coarse = labels[0];
    const byKey = new Map<string, { rank: [number, number, string]; eps: EndpointState[] }>();
    for (const e of endpoints) {
      let same = 0;
      while (
        same < labels.length &&
        origin[labels[same]] !== undefined &&
        e.labels[labels[same]] === origin[labels[same]]
      )
        same++;
      const distance = labels.length - same;
      // Endpoints outside the origin's coarsest locality group by that locality, nearest first.
      const where = same === 0 ? (e.labels[coarse] ?? "") : "";
      const rtt = same === 0 ? this.#rtt(origin[coarse], e.labels[coarse]) : 0;
      const k = `${distance}\u0000${where}`;
      let g = byKey.get(k);
      if (g === undefined) {
        g = { rank: [distance, rtt, where], eps: [] };
        byKey.set(k, g);
      }
      g.eps.push(e);
    }
    return [...byKey.values()]
      .sort((a, b) => a.rank[0] - b.rank[0] || a.rank[1] - b.rank[1] || (a.rank[2] < b.rank[2] ? -1 : 1))
      .map((g) => g.eps);
  }

  #rtt(a: string | undefined, b: string | undefined): number {
    if (a === undefined || b === undefined) return Number.POSITIVE_INFINITY;
    return this.params.rttMs[`${a}/${b}`] ?? this.params.rttMs[`${b}/${a}`] ?? Number.POSITIVE_INFINITY;
  }
}

/** The grouping's endpoints still carry the labels objects they were grouped by. */
function sameLabels(g: Grouping): boolean {
  for (let i = 0; i < g.endpoints.length; i++) if (g.endpoints[i].labels !== g.labels[i]) return false;
  return true;
}

function originKey(labels: readonly string[], origin: Record<string, string>): string {
  return labels.map((l) => origin[l] ?? "").join("\u0000");
}

export const localityFilterSpec = spec({
  type: LOCALITY_FILTER_TYPE,
  stability: "alpha",
  kind: "filter",
  summary:
    "Keeps the gateway's own locality (region/zone labels) and spills to the nearest other one only while it is saturated, with hysteresis (kvgate).",
  params: localityParams,
  kvgateOnly: true,
  needs: (p) =>
    (p as LocalityParams).inflightTokensThreshold === undefined &&
    (p as LocalityParams).maxNumSeqs === undefined
      ? []
      : [{ family: "inflight-load", param: "inFlightLoadProducerName", required: true }],
  factory: (name, params, handle) => new LocalityFilter(name, params as LocalityParams, handle),
});
