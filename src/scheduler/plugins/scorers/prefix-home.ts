/**
 * prefix-home-balance-scorer (kvgate-only): deals new prefixes out evenly. Under prefix-affinity
 * routing a request whose prompt no endpoint holds any of (a cold request) makes its endpoint the
 * home of that prefix: every later request sharing it follows, for as long as the prefix stays
 * cached. Its placement is a long-lived assignment, which instantaneous load (queue depth, KV use)
 * predicts badly, so this scorer places it by how many prefixes each endpoint already homes.
 *
 * A cold request of at least `minPromptTokens` prompt tokens, while prompts are being reused,
 * scores (max − homes) ÷ (max − min) over the candidates' home counts (all equal: 1 everywhere):
 * the endpoints homing the fewest score 1, so with a weight above the load scorers' summed weights
 * it wins over instantaneous load by any one home of difference, whatever the fleet size. Every
 * other request scores 0.5 everywhere (no effect):
 * - a request some endpoint holds part of (it has a home already);
 * - a short prompt: it founds nothing worth placing, and where its own prefill and decode wait is
 *   what load scorers know best;
 * - while none of the last `reuseWindow` long requests matched anywhere: traffic that does not
 *   reuse prompts founds no homes, and placing by count would only be round-robin.
 * After the pick, a long cold request adds one home to its endpoint (and the prefill profile's).
 * Counted, not weighed: dealing by the work each endpoint's groups have brought instead let the
 * counts drift on the 150 × 5 run (83–84% of its 40–60 QPS stages' bounds against 88–90%), and
 * breaking ties among the fewest by that work, not by load, only moved which light stages lose
 * (measurements in src/scheduler/README.md, "Placing new prefixes").
 * Homes are this scheduler's own picks, never forgotten while the endpoint stays in the pool, plus
 * those its synced peers report (src/scheduler/sync.ts: each gateway's batches carry its own counts,
 * which replace the last ones from it, and a peer silent for staleAfterSeconds counts for nothing).
 * Counted per gateway, 8 synced gateways each dealt their own eighth of the groups evenly and the sum
 * was not: on gateways-sync (the 150 × 5 shape) the default with 8 synced gateways made 7,477 output
 * tokens/s against 8,285 with one (seeds 7, 3, 1: −9.9%, −4.5%, −4.7%); with the counts shared,
 * 8,298 (8,289 with maxDecodeLoadRatio, below).
 * Gateways that do not sync each deal out only the groups they saw first (on the 150 × 5 run with 8
 * unsynced gateways precise lost 0.6% with it). A prefix evicted and founded again counts twice.
 *
 * `maxDecodeLoadRatio` (set in config/examples/default.yaml; needs an inflight-load producer): an
 * endpoint whose decode load — the whole prompts of the gateway's requests in flight there plus
 * `requestTokens` each, as decode-load-scorer counts it — is above this multiple of the candidates'
 * mean scores 0, and the others are scored by homes among themselves, so it founds no new prefix
 * while another endpoint can. Counts are right for the long run, but the founding request and its
 * group's next ones run there now: on mixed-length seed 11 the replica homing the fewest documents
 * was decoding five of them, the most of any, when a new one was founded there; 3 s later it decoded
 * ten, and its last requests ran at ~20 ms a token (the 160 QPS stage 27,776 output tokens/s
 * against llm-d's chart config's 29,553, −6.0%). With the ratio at 2: 29,401 (−0.5%).
 *
 * `kvUsageTieBreak` (set in config/examples/default.yaml): among the endpoints homing the fewest, the
 * one with the highest scraped KV use scores this much less (min-max among them; no metrics counts as
 * full), and every endpoint homing more is scaled by 1 − it, so one home more still loses. Which of
 * the tied endpoints founds a group is where its traffic goes for the rest of its life. Left to the
 * default's load scorers, the tie went by the moment's queues (the replica prefilling the group
 * founded last scores lowest on prefill wait); KV use reads how much of each replica's homed work is
 * running, the tie-break llm-d's precise scorers make (kv-cache-utilization-scorer). On the 150 × 5
 * run at seed 13, medians over router seeds 13–42, the default's 10 and 15 QPS stages were 1.1%
 * below precise's, its busiest replica drawing 30.4 of the 10 QPS stage's 200 requests against
 * precise's 28.8; with the tie broken on KV use, +0.5% and +0.7% (29.7 requests; 20 draws). Broken
 * on the gateway's in-flight decode load instead: −0.7% and +1.6% (30.8 requests). What it costs
 * (locality-regional-spike, where the region-blind default deals two regions' prompts by count) is in
 * src/scheduler/README.md, "Placement draws".
 *
 * `skipPrefilling` (set in config/examples/default.yaml; needs kvUsageTieBreak and an inflight-load
 * producer): the tied endpoint using the least KV is often the one that founded the last prompt and
 * is still prefilling it, its KV not yet grown. While another tied endpoint is not prefilling, one
 * with at least minPromptTokens of the gateway's uncached prompt tokens waiting for a first token
 * scores as the tie's highest KV use. On popular-prompt at a tenth of its size (a cold start of 144
 * new 4,000-token prompts) the default's TTFT p99 was 0.294 / 0.382 / 0.322 s at seeds 42 / 7 / 3
 * against round-robin's 0.230 / 0.231 / 0.231; with it 0.235 / 0.229 / 0.229.
 *
 * `stallRatio` (set in config/examples/default.yaml; needs an inflight-load producer): a cold prompt
 * of at least `stallPromptTokens` prefills for half a second or more, and every sequence decoding on
 * its endpoint runs slower until it is in. An endpoint homing at most one more than the fewest,
 * running at most stallRatio × the fewest-homed's least requests in flight and no more decode load
 * (counted as maxDecodeLoadRatio counts it) than the lightest of them, founds it instead: such
 * endpoints form the tie (for the KV tie-break), and the fewest-homed score as if homing one more.
 * The load scorers cannot make this choice: a home of difference outweighs them. On mixed-length at
 * a tenth of its size (seed 3) the default founded a 49,255-token document on a fewest-homed replica
 * with 11 requests in flight, one a 336-token answer whose tokens then came every 15 ms instead of 6
 * and ended the run up to 0.9 s after precise's, while a replica one home above had one: over 30
 * draws −3.4% against precise's output tokens/s, with it −0.2%. With requests alone as the measure
 * it also fired in flow-slo-mixed-length's overload, onto a replica with few requests because it was
 * decoding documents (seed 42: 41 fewer questions within their SLO); the decode-load condition keeps
 * it off such a replica.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type {
  CycleState,
  DataKey,
  EndpointState,
  PreRequestHook,
  ScheduleResult,
  Scorer,
  TypedName,
} from "../../types.ts";
import type { InFlightInfo, PrefixMatchInfo } from "../data.ts";
import { inflightKey, need, prefixKey } from "../data.ts";
import { PREFILL_PROFILE } from "../prefix/producer.ts";

export const prefixHomeParams = z
  .strictObject({
    minPromptTokens: z.number().int().nonnegative().default(1024),
    reuseWindow: z.number().int().positive().default(64),
    prefixMatchInfoProducerName: z.string().min(1).optional(),
    /** Unset: homes alone. Else an endpoint with more than this × the candidates' mean decode load founds nothing. */
    maxDecodeLoadRatio: z.number().gt(1).optional(),
    /** Decode load per in-flight request beyond its prompt, in context tokens (decode-load-scorer's default). */
    requestTokens: z.number().int().nonnegative().default(256),
    inFlightLoadProducerName: z.string().min(1).optional(),
    /**
     * 0: the fewest-homed all score 1 and the other scorers break the tie. Else, among them, the one
     * with the highest scraped KV use scores this much less (min-max), and every other endpoint's
     * score is scaled by 1 − this, so a home more still loses.
     */
    kvUsageTieBreak: z.number().min(0).lt(1).default(0),
    /**
     * Among the fewest-homed, one still prefilling at least minPromptTokens uncached prompt tokens of
     * this gateway's requests scores as the tie's highest KV use while a tied endpoint is not
     * prefilling (needs kvUsageTieBreak > 0 and an inflight-load producer).
     */
    skipPrefilling: z.boolean().default(false),
    /**
     * Unset: off. Else a cold prompt of at least stallPromptTokens may found on an endpoint homing one
     * more than the fewest, running at most this × the fewest-homed's least requests in flight and no
     * more decode load than the lightest of them.
     */
    stallRatio: z.number().gt(0).lt(1).optional(),
    stallPromptTokens: z.number().int().positive().default(16384),
  })
  .refine((p) => !p.skipPrefilling || p.kvUsageTieBreak > 0, {
    message:
      "skipPrefilling only reorders the kvUsageTieBreak tie: set kvUsageTieBreak above 0 (the default config uses 0.5), or drop skipPrefilling",
  });

export class PrefixHomeBalanceScorer implements Scorer, PreRequestHook {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;
  readonly #key: DataKey<PrefixMatchInfo>;
  readonly #load: DataKey<InFlightInfo> | null;
  /** endpoint id → prefixes this gateway homed there (long cold requests it picked for it). */
  readonly #own = new Map<string, number>();
  /** Synced peer → its own counts, as last reported. */
  readonly #peers = new Map<string, ReadonlyMap<string, number>>();
  /** endpoint id → own + every peer's count. */
  readonly #homes = new Map<string, number>();
  /** Whether each of the last reuseWindow long requests matched somewhere (a ring), and how many did. */
  readonly #recent: boolean[] = [];
  #next = 0;
  #matched = 0;
  readonly #out = new ScoreBuffer();
  readonly #loads = new ScoreBuffer();

  constructor(
    name: string,
    readonly params: z.output<typeof prefixHomeParams>,
  ) {
    this.typedName = { type: "prefix-home-balance-scorer", name };
    this.#key = prefixKey(params.prefixMatchInfoProducerName as string);
    this.#load =
      (params.maxDecodeLoadRatio !== undefined || params.skipPrefilling || params.stallRatio !== undefined) &&
      params.inFlightLoadProducerName !== undefined
        ? inflightKey(params.inFlightLoadProducerName)
        : null;
  }

  consumes() {
    return { required: this.#load === null ? [this.#key] : [this.#key, this.#load] };
  }

  /** Prefixes homed on an endpoint so far, by this gateway and its synced peers. */
  homes(endpointId: string): number {
    return this.#homes.get(endpointId) ?? 0;
  }

  /** This gateway's own counts, for its sync batches. */
  localHomes(): ReadonlyMap<string, number> {
    return this.#own;
  }

  /** A synced peer's own counts (replacing its last), or null when it is gone. */
  setPeerHomes(peer: string, homes: ReadonlyMap<string, number> | null): void {
    const old = this.#peers.get(peer);
    if (old !== undefined) for (const [id, n] of old) this.#add(id, -n);
    if (homes === null) {
      this.#peers.delete(peer);
      return;
    }
    this.#peers.set(peer, homes);
    for (const [id, n] of homes) this.#add(id, n);
  }

  #add(id: string, n: number): void {
    const h = (this.#homes.get(id) ?? 0) + n;
    if (h > 0) this.#homes.set(id, h);
    else this.#homes.delete(id);
  }

  #long(info: PrefixMatchInfo | undefined): info is PrefixMatchInfo {
    return info !== undefined && info.promptTokens >= this.params.minPromptTokens;
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const n = endpoints.length;
    const out = this.#out.get(n);
    const info = cycle.get(this.#key);
    if (!this.#long(info) || info.anyMatch || this.#matched === 0) return out.fill(0.5);
    // Endpoints decoding past the ratio are marked NaN and score 0; the rest by homes among themselves.
    const load = this.#load === null ? null : need(cycle, this.#load, this.typedName.name);
    const busy =
      load === null || this.params.maxDecodeLoadRatio === undefined ? null : this.#busy(load, endpoints);
    let lo = Number.POSITIVE_INFINITY;
    let hi = 0;
    for (let i = 0; i < n; i++) {
      if (busy?.[i] === 1) {
        out[i] = Number.NaN;
        continue;
      }
      const h = this.homes(endpoints[i].id);
      out[i] = h;
      lo = Math.min(lo, h);
      hi = Math.max(hi, h);
    }
    if (load !== null && this.#idleJoin(info.promptTokens, load, endpoints, out, lo)) lo--;
    const tie = this.params.kvUsageTieBreak;
    // Tied endpoints still prefilling a cold prompt's worth of the gateway's requests step back
    // while a tied one is not (skipPrefilling).
    const prefilling = (i: number) =>
      load !== null && load.tokens(endpoints[i].id) >= this.params.minPromptTokens;
    let skip = false;
    if (this.params.skipPrefilling)
      for (let i = 0; i < n && !skip; i++) if (out[i] === lo && !prefilling(i)) skip = true;
    const last = (i: number) => skip && prefilling(i);
    // The rest of the tie's lowest and highest scraped KV use; no metrics counts as full.
    const kvOf = (e: EndpointState) => e.metrics?.kvCacheUsagePercent ?? 1;
    let kvLo = 1;
    let kvHi = 0;
    if (tie > 0)
      for (let i = 0; i < n; i++)
        if (out[i] === lo && !last(i)) {
          kvLo = Math.min(kvLo, kvOf(endpoints[i]));
          kvHi = Math.max(kvHi, kvOf(endpoints[i]));
        }
    for (let i = 0; i < n; i++) {
      if (Number.isNaN(out[i])) out[i] = 0;
      else if (out[i] !== lo) out[i] = ((1 - tie) * (hi - out[i])) / (hi - lo);
      else if (last(i)) out[i] = 1 - tie;
      else out[i] = kvHi > kvLo ? 1 - (tie * (kvOf(endpoints[i]) - kvLo)) / (kvHi - kvLo) : 1;
    }
    return out;
  }

  /**
   * stallRatio: marks lo − 1 on the endpoints (homing at most lo + 1, not past the decode ratio)
   * running at most stallRatio × the fewest-homed's least requests in flight, with a decode load no
   * higher than the least of theirs; true if any did.
   */
  #idleJoin(
    promptTokens: number,
    load: InFlightInfo,
    endpoints: readonly EndpointState[],
    out: Float64Array,
    lo: number,
  ): boolean {
    const ratio = this.params.stallRatio;
    if (ratio === undefined || promptTokens < this.params.stallPromptTokens) return false;
    let fewest = Number.POSITIVE_INFINITY;
    let lightest = Number.POSITIVE_INFINITY;
    for (let i = 0; i < endpoints.length; i++)
      if (out[i] === lo) {
        fewest = Math.min(fewest, load.requests(endpoints[i].id));
        lightest = Math.min(lightest, this.#decodeLoad(load, endpoints[i].id));
      }
    // A fewest-homed endpoint running nothing: no sequence there for the prefill to stall.
    if (fewest === 0 || fewest === Number.POSITIVE_INFINITY) return false;
    let any = false;
    for (let i = 0; i < endpoints.length; i++) {
      const id = endpoints[i].id;
      if (out[i] <= lo + 1 && load.requests(id) <= ratio * fewest && this.#decodeLoad(load, id) <= lightest) {
        out[i] = lo - 1;
        any = true;
      }
    }
    return any;
  }

  /** The gateway's requests in flight on an endpoint in context tokens, as decode-load-scorer counts them. */
  #decodeLoad(load: InFlightInfo, id: string): number {
    return load.requests(id) * this.params.requestTokens + (load.contextTokens?.(id) ?? 0);
  }

  /** 1 where the endpoint's decode load is above maxDecodeLoadRatio × the candidates' mean, else 0. */
  #busy(load: InFlightInfo, endpoints: readonly EndpointState[]): Float64Array {
    const n = endpoints.length;
    const loads = this.#loads.get(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      loads[i] = this.#decodeLoad(load, endpoints[i].id);
      sum += loads[i];
    }
    const limit = ((this.params.maxDecodeLoadRatio as number) * sum) / n;
    for (let i = 0; i < n; i++) loads[i] = loads[i] > limit ? 1 : 0;
    return loads;
  }

  preRequest(cycle: CycleState, result: ScheduleResult): void {
    const info = cycle.get(this.#key);
    if (!this.#long(info)) return;
    const matched = info.anyMatch;
    if (this.#recent.length < this.params.reuseWindow) this.#recent.push(matched);
    else {
      if (this.#recent[this.#next]) this.#matched--;
      this.#recent[this.#next] = matched;
      this.#next = (this.#next + 1) % this.params.reuseWindow;
    }
    if (matched) {
      this.#matched++;
      return;
    }
    const ids = new Set([result.target?.id, result.profiles[PREFILL_PROFILE]?.target?.id]);
    for (const id of ids)
      if (id !== undefined) {
        this.#own.set(id, (this.#own.get(id) ?? 0) + 1);
        this.#add(id, 1);
      }
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const m of [this.#own, this.#homes]) for (const id of [...m.keys()]) if (!pool.has(id)) m.delete(id);
    for (const [peer, m] of this.#peers)
      if ([...m.keys()].some((id) => !pool.has(id)))
        this.#peers.set(peer, new Map([...m].filter(([id]) => pool.has(id))));
  }

  endpointView(endpointId: string): Record<string, unknown> {
    return { prefixHomes: this.homes(endpointId) };
  }
}

export const prefixHomeSpec = spec({
  type: "prefix-home-balance-scorer",
  stability: "alpha",
  kind: "scorer",
  summary: "Places long cache-cold requests on the endpoint homing the fewest prefixes.",
  params: prefixHomeParams,
  needs: (p) => [
    { family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true },
    {
      family: "inflight-load",
      param: "inFlightLoadProducerName",
      required: p.maxDecodeLoadRatio !== undefined || p.skipPrefilling || p.stallRatio !== undefined,
    },
  ],
  factory: (name, p) => new PrefixHomeBalanceScorer(name, p),
});
