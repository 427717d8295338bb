/**
 * inflight-load-producer (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/`): the gateway's own synchronous view
 * of load.
 * After the pick it adds one request and the request's *uncached* prompt tokens to each profile's
 * target; at the first response chunk prefill is done, so prompt tokens are released (the
 * `prefill` profile's entry in full); at the end the request is released. Optionally adds an
 * output-token estimate (addEstimatedOutputTokens), held until the end. It also keeps each
 * endpoint's in-flight *context*: the whole prompt (cached part included) of every request it is
 * serving, held until the end — what each decode step reads, for decode-load-scorer — and, per
 * endpoint, when its oldest request still waiting for a first token was picked and its usual wait
 * from pick to first token, for slot-cap.ts's stall.
 */
import { z } from "zod";
import type { Hasher } from "../../hash.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  DataProducer,
  EndpointPositions,
  EndpointState,
  PluginStats,
  PreRequestHook,
  RequestFacts,
  ResponseHooks,
  ScheduleResult,
  TypedName,
} from "../../types.ts";
import type { InFlightInfo, InFlightLoad, PrefixMatchInfo } from "../data.ts";
import { inflightKey, prefixKey } from "../data.ts";
import { flatPrompt } from "../prefix/hashing.ts";
import { PREFILL_PROFILE } from "../prefix/producer.ts";
import { PrefillRateEstimator } from "./prefill-rate.ts";
import { RecentPicks } from "./recent-picks.ts";

export const INFLIGHT_TYPE = "inflight-load-producer";

export const inflightParams = z.strictObject({
  addEstimatedOutputTokens: z.boolean().default(false),
  outputRatio: z.number().nonnegative().default(1.5),
  maxEstimatedOutputTokens: z.number().int().nonnegative().optional(),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});
export type InflightParams = z.output<typeof inflightParams>;

interface Entry {
  endpointId: string;
  profile: string;
  tokens: number;
  holdsRequest: boolean;
  /** Uncached prompt tokens (no output estimate) and the pick time: a prefill-rate sample. */
  promptTokens: number;
  pickedAt: number;
  /** Whole prompt tokens held in the endpoint's context until the end (0 on a P/D prefill leg). */
  context: number;
  /** The endpoint's simulated seconds per wall second when picked (1 for a real server). */
  timeScale: number;
  /** Its first token has come (or it ended): no longer waiting to start. */
  started: boolean;
}

export class InflightLoadProducer implements DataProducer, PreRequestHook, ResponseHooks {
  readonly typedName: TypedName;
  readonly #key: DataKey<InFlightInfo>;
  readonly #prefix: DataKey<PrefixMatchInfo> | null;
  readonly #counters = new Counters();
  readonly #records = new Map<string, Entry[]>();
  /** Each endpoint's prefill throughput, learned from pick → first-token times. */
  readonly prefillRates = new PrefillRateEstimator();
  /** Recent picks per endpoint (time, uncached prompt tokens): KV a scrape has not seen yet. */
  readonly recentPicks = new RecentPicks();
  /** Per endpoint, its entries in pick order until each starts (the head dropped lazily). */
  readonly #pending = new Map<string, { entries: Entry[]; head: number }>();
  /** Per endpoint, a moving average of its requests' waits from pick to first token (seconds). */
  readonly #startWait = new Map<string, number>();
  /**
   * Peer gateways' in-flight load (src/scheduler/sync.ts), per peer: endpoint → [requests, tokens],
   * summed into the counters the scorers read. Empty for a single gateway.
   */
  readonly #peers = new Map<string, Map<string, readonly [number, number]>>();

  constructor(
    name: string,
    readonly params: InflightParams,
    readonly hasher: Hasher | null = null,
  ) {
    this.typedName = { type: INFLIGHT_TYPE, name };
    this.#key = inflightKey(name);
    this.#prefix = params.prefixMatchInfoProducerName ? prefixKey(params.prefixMatchInfoProducerName) : null;
  }

  produces(): DataKey<unknown>[] {
    return [this.#key];
  }

  consumes() {
    return { required: [], optional: this.#prefix ? [this.#prefix] : [] };
  }

  /** Current counters of an endpoint. */
  load(endpointId: string): InFlightLoad {
    const c = this.#counters;
    return { requests: c.requests.get(endpointId) ?? 0, tokens: c.tokens.get(endpointId) ?? 0 };
  }

  produce(cycle: CycleState): void {
    const positions = cycle.positions(cycle.candidates);
    if (positions !== null) this.#counters.align(positions, cycle.candidates);
    cycle.set(this.#key, this.#view(cycle));
  }

  /**
   * This request's view: the counters, and its uncached prompt tokens on an endpoint:
   * (totalBlocks − matchBlocks)·blockSize plus any prompt tail beyond the hashed blocks (llm-d
   * uncachedInputTokens); the whole prompt without prefix info; plus the output estimate when
   * enabled. Per-request values are computed once.
   */
  #view(cycle: CycleState): InflightView {
    const input = flatPrompt(cycle, this.hasher).tokenCount;
    const info = this.#prefix ? cycle.get(this.#prefix) : undefined;
    const extra = this.params.addEstimatedOutputTokens
      ? this.#outputEstimate(input, cycle.request.maxTokens)
      : 0;
    if (info === undefined || info.blockSizeTokens <= 0)
      return new InflightView(this.#counters, this, extra, null, 0, 0, input + extra);
    const indexed = info.totalBlocks * info.blockSizeTokens;
    const tail = Math.max(0, input - indexed) + extra;
    // Nothing matched anywhere: the same uncached count on every endpoint, no lookup per endpoint.
    if (!info.anyMatch) return new InflightView(this.#counters, this, extra, null, 0, 0, indexed + tail);
    return new InflightView(this.#counters, this, extra, info, indexed, info.blockSizeTokens, tail);
  }

  #outputEstimate(input: number, maxTokens: number | undefined): number {
    let est = Math.round(input * this.params.outputRatio);
    const cap = this.params.maxEstimatedOutputTokens;
    if (cap !== undefined && est > cap) est = cap;
    if (maxTokens !== undefined && maxTokens >= 0 && est > maxTokens) est = maxTokens;
    return est;
  }

  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void {
    const view = this.#view(cycle);
    const input = flatPrompt(cycle, this.hasher).tokenCount;
    const entries = this.#records.get(result.requestId) ?? [];
    for (const [profile, r] of Object.entries(result.profiles)) {
      if (r.target === null) continue;
      const id = r.target.id;
      const tokens = view.uncachedRequestTokens(id);
      this.#counters.bump(REQUESTS, id, 1);
      this.#counters.bump(TOKENS, id, tokens);
      const promptTokens = Math.max(0, tokens - view.outputEstimate);
      const context = profile === PREFILL_PROFILE ? 0 : input;
      if (context > 0) this.#counters.bump(CONTEXT, id, context);
      const timeScale = r.target.metrics?.simTimeScale ?? 1;
      entries.push({
        endpointId: id,
        profile,
        tokens,
        holdsRequest: true,
        promptTokens,
        pickedAt: now,
        context,
        timeScale,
        started: false,
      });
      this.recentPicks.add(id, now, promptTokens);
      let q = this.#pending.get(id);
      if (q === undefined) this.#pending.set(id, (q = { entries: [], head: 0 }));
      else dropStarted(q, id);
      q.entries.push(entries[entries.length - 1]);
    }
    if (entries.length > 0) this.#records.set(result.requestId, entries);
  }

  onResponseStarted(req: RequestFacts, endpointId: string, now: number): void {
    const entries = this.#records.get(req.requestId);
    if (entries === undefined) return;
    this.#reattribute(entries, endpointId);
    // One entry, not a P/D prefill leg: its first token timed this endpoint's prefill. A simulated
    // replica's prefill is learned in its own (simulated) seconds, the unit of maxTTFTPenaltyMs and of
    // the hand-set peakPrefillThroughput: in wall seconds a replica at --time-scale N looks N× faster.
    const [only] = entries;
    if (entries.length === 1 && only.profile !== PREFILL_PROFILE) {
      const s = only.timeScale;
      this.prefillRates.observe(only.endpointId, only.pickedAt * s, now * s, only.promptTokens);
      const w = now - only.pickedAt;
      const avg = this.#startWait.get(only.endpointId);
      this.#startWait.set(only.endpointId, avg === undefined ? w : avg + START_WAIT_WEIGHT * (w - avg));
    }
    for (const e of entries) {
      e.started = true;
      if (e.profile === PREFILL_PROFILE) this.#release(e, true);
      else if (!this.params.addEstimatedOutputTokens) this.#release(e, false);
    }
  }

  onResponseComplete(req: RequestFacts, endpointId: string): void {
    const entries = this.#records.get(req.requestId);
    if (entries === undefined) return;
    this.#reattribute(entries, endpointId);
    for (const e of entries) {
      e.started = true;
      this.#release(e, true);
    }
    this.#records.delete(req.requestId);
  }

  /** After a failover the served endpoint carries the load, not the first pick. */
  #reattribute(entries: Entry[], served: string): void {
    const primary = entries.find((e) => e.profile !== PREFILL_PROFILE);
    if (primary === undefined || primary.endpointId === served || served === "") return;
    const c = this.#counters;
    if (primary.holdsRequest) {
      c.bump(REQUESTS, primary.endpointId, -1);
      c.bump(REQUESTS, served, 1);
    }
    c.bump(TOKENS, primary.endpointId, -primary.tokens);
    c.bump(TOKENS, served, primary.tokens);
    c.bump(CONTEXT, primary.endpointId, -primary.context);
    c.bump(CONTEXT, served, primary.context);
    primary.endpointId = served;
  }

  #release(e: Entry, request: boolean): void {
    if (e.tokens !== 0) {
      this.#counters.bump(TOKENS, e.endpointId, -e.tokens);
      e.tokens = 0;
    }
    if (request && e.holdsRequest) {
      this.#counters.bump(REQUESTS, e.endpointId, -1);
      e.holdsRequest = false;
    }
    if (request && e.context > 0) {
      this.#counters.bump(CONTEXT, e.endpointId, -e.context);
      e.context = 0;
    }
  }

  /**
   * When the oldest of this gateway's requests on the endpoint still waiting for its first token was
   * picked (undefined: none waits).
   */
  oldestWaitingSince(endpointId: string): number | undefined {
    const q = this.#pending.get(endpointId);
    if (q === undefined) return undefined;
    dropStarted(q, endpointId);
    return q.head < q.entries.length ? q.entries[q.head].pickedAt : undefined;
  }

  /** The endpoint's usual wait from pick to first token (a moving average, seconds), if any. */
  usualWaitToStart(endpointId: string): number | undefined {
    return this.#startWait.get(endpointId);
  }

  /** Whole prompt tokens of this gateway's requests in flight on the endpoint. */
  contextTokens(endpointId: string): number {
    return this.#counters.context.get(endpointId) ?? 0;
  }

  /**
   * Replaces one peer gateway's reported in-flight load (null: the peer is gone or stale). The
   * counters the scorers read become own + every peer's last report.
   */
  setPeerLoad(peer: string, load: ReadonlyMap<string, readonly [number, number]> | null): void {
    const c = this.#counters;
    const old = this.#peers.get(peer);
    if (old !== undefined)
      for (const [id, [r, t]] of old) {
        c.bump(REQUESTS, id, -r);
        c.bump(TOKENS, id, -t);
      }
    if (load === null || load.size === 0) {
      this.#peers.delete(peer);
      return;
    }
    const copy = new Map<string, readonly [number, number]>();
    for (const [id, [r, t]] of load) {
      if (!(r > 0 || t > 0)) continue;
      copy.set(id, [r, t]);
      c.bump(REQUESTS, id, r);
      c.bump(TOKENS, id, t);
    }
    this.#peers.set(peer, copy);
  }

  /** This gateway's own in-flight load, without its peers': endpoint → [requests, tokens]. */
  localLoad(): Map<string, [number, number]> {
    const out = new Map<string, [number, number]>();
    const c = this.#counters;
    for (const id of new Set([...c.requests.keys(), ...c.tokens.keys()]))
      out.set(id, [c.requests.get(id) ?? 0, c.tokens.get(id) ?? 0]);
    for (const peer of this.#peers.values())
      for (const [id, [r, t]] of peer) {
        const v = out.get(id);
        if (v === undefined) continue;
        v[0] -= r;
        v[1] -= t;
      }
    for (const [id, [r, t]] of out) if (!(r > 0 || t > 0)) out.delete(id);
    return out;
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const peer of this.#peers.values())
      for (const id of [...peer.keys()]) if (!pool.has(id)) peer.delete(id);
    this.#counters.retain(pool);
    this.prefillRates.retain(pool);
    this.recentPicks.retain(pool);
    for (const id of [...this.#pending.keys()]) if (!pool.has(id)) this.#pending.delete(id);
    for (const id of [...this.#startWait.keys()]) if (!pool.has(id)) this.#startWait.delete(id);
  }

  endpointView(endpointId: string): Record<string, unknown> {
    const load = this.load(endpointId);
    const rate = this.prefillRates.view(endpointId);
    return {
      inFlightRequests: load.requests,
      inFlightTokens: load.tokens,
      inFlightContextTokens: this.contextTokens(endpointId),
      learnedPrefillThroughput: rate.tokensPerSecond === undefined ? null : Math.round(rate.tokensPerSecond),
      prefillSamples: rate.samples,
      prefillTokensObserved: rate.tokensObserved,
    };
  }

  stats(): PluginStats {
    let requests = 0;
    let tokens = 0;
    for (const v of this.#counters.requests.values()) requests += v;
    for (const v of this.#counters.tokens.values()) tokens += v;
    return { inflightRequests: requests, inflightTokens: tokens, trackedRequests: this.#records.size };
  }
}

/**
 * Drops the started (or failed-over) entries at the head of an endpoint's waiting queue, compacting
 * it once most of it is dropped: it holds at most the requests picked since its oldest waiting one.
 */
function dropStarted(q: { entries: Entry[]; head: number }, id: string): void {
  const { entries } = q;
  while (q.head < entries.length && (entries[q.head].started || entries[q.head].endpointId !== id)) q.head++;
  if (q.head >= entries.length) {
    entries.length = 0;
    q.head = 0;
  } else if (q.head > 32 && q.head * 2 > entries.length) {
    q.entries = entries.slice(q.head);
    q.head = 0;
  }
}

/** Weight of the newest wait in the moving average of waits to a first token. */
const START_WAIT_WEIGHT = 0.1;

const REQUESTS = 0;
const TOKENS = 1;
/** Whole prompt tokens in flight (decode context); this gateway's own, never a peer's. */
const CONTEXT = 2;
type Counter = typeof REQUESTS | typeof TOKENS | typeof CONTEXT;

/**
 * Per-endpoint in-flight counters by id, mirrored in arrays aligned with the positions of the
 * scheduler's candidate list, so scorers walking every candidate read them by position instead of
 * one Map lookup per endpoint. Counters change a few at a time (a pick, a response event) and
 * update both; the arrays are rebuilt only when the candidate positions change.
 */
class Counters {
  readonly requests = new Map<string, number>();
  readonly tokens = new Map<string, number>();
  readonly context = new Map<string, number>();
  readonly #maps = [this.requests, this.tokens, this.context] as const;
  #positions: EndpointPositions | null = null;
  #version = -1;
  readonly #at: [Float64Array, Float64Array, Float64Array] = [
    new Float64Array(0),
    new Float64Array(0),
    new Float64Array(0),
  ];

  align(positions: EndpointPositions, candidates: readonly EndpointState[]): void {
    const n = candidates.length;
    if (positions === this.#positions && positions.version === this.#version && this.#at[0].length === n)
      return;
    const req = (this.#at[REQUESTS] = new Float64Array(n));
    const tok = (this.#at[TOKENS] = new Float64Array(n));
    const ctx = (this.#at[CONTEXT] = new Float64Array(n));
    for (let i = 0; i < n; i++) {
      const id = candidates[i].id;
      req[i] = this.requests.get(id) ?? 0;
      tok[i] = this.tokens.get(id) ?? 0;
      ctx[i] = this.context.get(id) ?? 0;
    }
    this.#positions = positions;
    this.#version = positions.version;
  }

  /** Counters by position in the list last aligned to. */
  byPosition(): {
    readonly requests: Float64Array;
    readonly tokens: Float64Array;
    readonly context: Float64Array;
  } | null {
    if (this.#positions === null) return null;
    return { requests: this.#at[REQUESTS], tokens: this.#at[TOKENS], context: this.#at[CONTEXT] };
  }

  /** Adds `delta`, flooring at 0 (zero entries are dropped from the map). */
  bump(which: Counter, id: string, delta: number): void {
    if (delta === 0) return;
    const m = this.#maps[which];
    const v = (m.get(id) ?? 0) + delta;
    if (v > 0) m.set(id, v);
    else m.delete(id);
    const positions = this.#positions;
    // Re-indexed since the arrays were aligned: align() rebuilds them at the next request.
    if (positions === null || positions.version !== this.#version) return;
    const i = positions.indexOf(id);
    if (i >= 0) this.#at[which][i] = Math.max(v, 0);
  }

  retain(pool: ReadonlySet<string>): void {
    for (const m of this.#maps) for (const id of [...m.keys()]) if (!pool.has(id)) m.delete(id);
    this.#positions = null;
  }
}

/** One request's InFlightInfo: one object, no closures per request. */
class InflightView implements InFlightInfo {
  constructor(
    readonly counters: Counters,
    readonly producer: InflightLoadProducer,
    /** Output tokens estimated for this request (0 unless addEstimatedOutputTokens). */
    readonly outputEstimate: number,
    readonly info: PrefixMatchInfo | null,
    readonly indexed: number,
    readonly blockSize: number,
    readonly tail: number,
  ) {}

  requests(id: string): number {
    return this.counters.requests.get(id) ?? 0;
  }

  tokens(id: string): number {
    return this.counters.tokens.get(id) ?? 0;
  }

  byPosition(): {
    readonly requests: Float64Array;
    readonly tokens: Float64Array;
    readonly context: Float64Array;
  } | null {
    return this.counters.byPosition();
  }

  prefillRate(id: string): number | undefined {
    return this.producer.prefillRates.rate(id);
  }

  promptTokensPickedSince(id: string, since: number): number {
    return this.producer.recentPicks.since(id, since);
  }

  contextTokens(id: string): number {
    return this.producer.contextTokens(id);
  }

  oldestWaitingSince(id: string): number | undefined {
    return this.producer.oldestWaitingSince(id);
  }

  usualWaitToStart(id: string): number | undefined {
    return this.producer.usualWaitToStart(id);
  }

  uncachedForAll(): number | null {
    return this.info === null ? this.tail : null;
  }

  uncachedRequestTokens(id: string): number {
    const info = this.info;
    if (info === null) return this.tail;
    return Math.max(0, this.indexed - info.matchBlocks(id) * this.blockSize) + this.tail;
  }
}

export const inflightSpec = spec({
  type: INFLIGHT_TYPE,
  stability: "stable",
  kind: "producer",
  summary: "Counts the gateway's in-flight requests and uncached prompt tokens per endpoint.",
  params: inflightParams,
  produces: ["inflight-load"],
  needs: () => [{ family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: false }],
  factory: (name, p, handle) => new InflightLoadProducer(name, p, handle.hasher),
});
