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
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  EndpointPositions,
  EndpointState,
  Filter,
  TypedName,
} from "../../types.ts";
import { type InFlightInfo, inflightKey } from "../data.ts";

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

export class LocalityFilter implements Filter {
  readonly typedName: TypedName;
  readonly params: LocalityParams;
  readonly #measure: UtilizationDetector;
  /** Origin key → how many groups it currently spills into beyond the nearest (hysteresis state). */
  readonly #spilling = new Map<string, number>();
  /** The last grouping: recomputed only when the endpoint list, a labels object or the origin changes. */
  #last: {
    endpoints: readonly EndpointState[];
    labels: object[];
    key: string;
    groups: EndpointState[][];
  } | null = null;
  /** Origin key → the last measurement: when, over which grouping, and the list it gave. */
  readonly #measured = new Map<
    string,
    { at: number; groups: EndpointState[][]; out: readonly EndpointState[] }
  >();
  /** The configured origin's key (most requests carry no locality of their own). */
  readonly #originKey: string;
  /** The in-flight view, when inflightTokensThreshold is set. */
  readonly #inflight: DataKey<InFlightInfo> | null;
  /** remeasureMs in seconds. */
  readonly #remeasureS: number;
  /** #groupPositions' cache. */
  #groupPos: {
    groups: EndpointState[][];
    positions: EndpointPositions;
    version: number;
    idx: Int32Array[];
  } | null = null;
  /** maxNumSeqs: positions in the candidate list of the last list checked for full batches. */
  #outPositions: { out: readonly EndpointState[]; version: number; idx: Int32Array } | null = null;

  constructor(name = LOCALITY_FILTER_TYPE, params: Partial<z.input<typeof localityParams>> = {}) {
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
        : inflightKey(this.params.inFlightLoadProducerName ?? "inflight-load-producer");
    this.#originKey = originKey(this.params.labels, this.params.origin);
  }

  consumes() {
    return { required: this.#inflight ? [this.#inflight] : [] };
  }

  /**
   * One endpoint's saturation: the utilization measure, or the in-flight term when larger. `at` is
   * the in-flight producer's counts aligned with the candidate list and `i` the endpoint's position
   * in it (−1: read by id).
   */
  #saturation(
    e: EndpointState,
    now: number,
    inflight: InFlightInfo | undefined,
    at: Aligned | null,
    i: number,
  ): number {
    const s = this.#measure.endpointSaturation(e, now);
    if (inflight === undefined) return s;
    const p = this.params;
    const byPos = at !== null && i >= 0;
    const tokens =
      p.inflightTokensThreshold === undefined
        ? 0
        : (byPos ? at.tokens[i] : inflight.tokens(e.id)) / p.inflightTokensThreshold;
    const full =
      p.maxNumSeqs !== undefined && (byPos ? at.requests[i] : inflight.requests(e.id)) >= p.maxNumSeqs
        ? 1
        : 0;
    return Math.max(s, tokens, full);
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    if (endpoints.length === 0) return endpoints;
    const own = cycle.request.locality;
    const origin = own ?? this.params.origin;
    const key = own === undefined ? this.#originKey : originKey(this.params.labels, own);
    // The measure reads only scraped metrics, which change once per scrape (100 ms by default):
    // re-measuring on every request repeats the same answer at the cost of reading every endpoint.
    // Within a measurement's window, labels are not re-read either (a relabel waits ≤ remeasureMs).
    const last = this.#measured.get(key);
    const now = cycle.now;
    const fresh = last !== undefined && now >= last.at && now - last.at < this.#remeasureS;
    const groups = this.#grouped(key, origin, endpoints, !fresh);
    let out: readonly EndpointState[];
    if (groups.length === 1) out = endpoints;
    else if (!this.params.spill) out = groups[0];
    else if (fresh && last.groups === groups) out = last.out;
    else {
      out = this.#spill(key, groups, now, last?.out, cycle, endpoints);
      this.#measured.set(key, { at: now, groups, out });
    }
    const max = this.params.maxNumSeqs;
    return max === undefined ? out : this.#notFull(cycle, endpoints, out, max);
  }

  /** `out` without the endpoints whose batch filled since the measurement (unless all are full). */
  #notFull(
    cycle: CycleState,
    endpoints: readonly EndpointState[],
    out: readonly EndpointState[],
    max: number,
  ): readonly EndpointState[] {
    const info = cycle.get(this.#inflight as DataKey<InFlightInfo>);
    if (info === undefined) return out;
    // On every request: read the in-flight counts by position (the producer's arrays aligned with the
    // candidate list) through `out`'s positions, computed once per list, not one lookup per endpoint.
    const at = endpoints === cycle.candidates ? (info.byPosition?.() ?? null) : null;
    const positions = at === null ? null : cycle.positions(endpoints);
    let idx: Int32Array | null = null;
    if (at !== null && positions !== null) {
      const c = this.#outPositions;
      if (c !== null && c.out === out && c.version === positions.version) idx = c.idx;
      else {
        idx = Int32Array.from(out, (e) => positions.indexOf(e.id));
        this.#outPositions = { out, version: positions.version, idx };
      }
    }
    let kept: EndpointState[] | null = null;
    if (idx !== null) {
      const req = (at as Aligned).requests;
      for (let i = 0; i < out.length; i++) {
        const r = idx[i] >= 0 ? req[idx[i]] : info.requests(out[i].id);
        if (r >= max && kept === null) kept = out.slice(0, i);
        else if (r < max && kept !== null) kept.push(out[i]);
      }
    } else
      for (let i = 0; i < out.length; i++) {
        const r = info.requests(out[i].id);
        if (r >= max && kept === null) kept = out.slice(0, i);
        else if (r < max && kept !== null) kept.push(out[i]);
      }
    if (kept === null) return out;
    return kept.length > 0 ? kept : out;
  }

  /** Re-measures `key`'s saturation: the nearest group alone, or the spill list (see the header). */
  #spill(
    key: string,
    groups: EndpointState[][],
    now: number,
    prev: readonly EndpointState[] | undefined,
    cycle: CycleState,
    endpoints: readonly EndpointState[],
  ): readonly EndpointState[] {
    const was = this.#spilling.get(key) ?? 0;
    const inflight = this.#inflight ? cycle.get(this.#inflight) : undefined;
    // The in-flight counts by candidate position (no Map lookup per endpoint), with each group's
    // positions computed once per grouping and candidate indexing.
    const at =
      inflight !== undefined && endpoints === cycle.candidates ? (inflight.byPosition?.() ?? null) : null;
    const idx = at === null ? null : this.#groupPositions(groups, cycle.positions(endpoints));
    // Each endpoint's saturation is read once per measurement, when a group is first looked at: the
    // joining loop, the step-aside pass and the headroom pass below all reuse it.
    const sat: (Float64Array | undefined)[] = new Array(groups.length);
    const of = (g: number): Float64Array => {
      let s = sat[g];
      if (s === undefined) {
        const pos = idx?.[g];
        const members = groups[g];
        s = new Float64Array(members.length);
        for (let k = 0; k < members.length; k++)
          s[k] = this.#saturation(members[k], now, inflight, at, pos ? pos[k] : -1);
        sat[g] = s;
      }
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
      n += groups[last].length;
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
    // their other endpoints stay candidates beside the group that joined last.
    const out: EndpointState[] = [];
    const stepAside = this.params.stepAsideThreshold ?? this.params.spillThreshold;
    for (const g of joined.slice(0, -1)) {
      const s = of(g);
      for (let i = 0; i < s.length; i++) if (s[i] < stepAside) out.push(groups[g][i]);
    }
    // The group that joined gives only its endpoints with headroom: spilled traffic must not queue
    // behind a remote batch that is itself full (the group has some, or it was passed over above).
    const j = joined[joined.length - 1];
    const s = of(j);
    for (let i = 0; i < s.length; i++) if (s[i] < 1) out.push(groups[j][i]);
    // The same members as last time: the same array object, so later plugins' per-list caches hold.
    if (prev !== undefined && prev.length === out.length && out.every((e, i) => e === prev[i])) return prev;
    return out;
  }

  /** Each group's members' positions in the candidate list (−1: not in it), cached per grouping and indexing. */
  #groupPositions(groups: EndpointState[][], positions: EndpointPositions | null): Int32Array[] | null {
    if (positions === null) return null;
    const c = this.#groupPos;
    if (c !== null && c.groups === groups && c.positions === positions && c.version === positions.version)
      return c.idx;
    const idx = groups.map((g) => Int32Array.from(g, (e) => positions.indexOf(e.id)));
    this.#groupPos = { groups, positions, version: positions.version, idx };
    return idx;
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
  ): EndpointState[][] {
    // Callers may pass a fresh array per request: compare the elements (and, unless told not to,
    // their labels objects, which the datastore replaces when labels change), so an unchanged pool
    // is never regrouped. Comparing elements reads only the arrays, never the endpoint objects.
    const last = this.#last;
    const n = endpoints.length;
    if (last !== null && last.key === key && last.endpoints.length === n) {
      let i = 0;
      while (i < n && endpoints[i] === last.endpoints[i]) i++;
      if (i === n && checkLabels) {
        i = 0;
        while (i < n && endpoints[i].labels === last.labels[i]) i++;
      }
      if (i === n) return last.groups;
    }
    const groups = this.groups(origin, endpoints);
    this.#last = { endpoints: endpoints.slice(), labels: endpoints.map((e) => e.labels), key, groups };
    return groups;
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
  factory: (name, params) => new LocalityFilter(name, params as LocalityParams),
});
