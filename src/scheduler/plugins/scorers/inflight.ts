/**
 * Scorers on the gateway's in-flight counters (inflight-load-producer), after llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/scorer/activerequest/` and the token-load-scorer:
 *   active-request-scorer  count ≤ idleThreshold → 1; else (maxCount − count)/maxCount · maxBusyScore
 *   token-load-scorer      1 − min(1, (inFlightTokens + this request's uncached tokens)/queueThresholdTokens)
 *   least-request-scorer   kvgate-only baseline: min-max over in-flight requests (fewest → 1, all equal → 1)
 *   kv-pressure-scorer     kvgate-only: 1 − min(1, kvCacheUsagePercent + tokens picked since that scrape
 *                          / KV capacity) — llm-d's kv-cache-utilization-scorer without the scrape lag
 *   decode-load-scorer     kvgate-only: active-request-scorer's (max − load)/max with load counted in
 *                          context tokens, Σ (whole prompt + requestTokens) over in-flight requests;
 *                          a replica with every sequence slot taken scores 0 (slot-cap.ts)
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type {
  CycleState,
  DataKey,
  EndpointPositions,
  EndpointState,
  Scorer,
  TypedName,
} from "../../types.ts";
import type { InFlightInfo } from "../data.ts";
import { inflightKey, need } from "../data.ts";
import { minMaxLowerIsBetter } from "./metrics.ts";
import { type EndpointSlotCap, SlotCaps } from "./slot-cap.ts";

const producerParam = z.string().min(1).optional();
const inflightNeed = () => [
  { family: "inflight-load" as const, param: "inFlightLoadProducerName", required: true },
];

abstract class InflightScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;
  protected readonly key: DataKey<InFlightInfo>;
  protected readonly out = new ScoreBuffer();

  constructor(type: string, name: string, producerName: string) {
    this.typedName = { type, name };
    this.key = inflightKey(producerName);
  }

  consumes() {
    return { required: [this.key] };
  }

  protected info(cycle: CycleState): InFlightInfo {
    return need(cycle, this.key, this.typedName.name);
  }

  abstract score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array;
}

/** In-flight requests per endpoint: by candidate position when `endpoints` are the candidates. */
function requestCounts(
  cycle: CycleState,
  endpoints: readonly EndpointState[],
  info: InFlightInfo,
  out: Float64Array,
): Float64Array {
  const at = endpoints === cycle.candidates ? (info.byPosition?.() ?? null) : null;
  if (at !== null) {
    const requests = at.requests;
    for (let i = 0; i < endpoints.length; i++) out[i] = requests[i];
  } else {
    for (let i = 0; i < endpoints.length; i++) out[i] = info.requests(endpoints[i].id);
  }
  return out;
}

export const activeRequestParams = z.strictObject({
  idleThreshold: z.number().int().nonnegative().default(0),
  maxBusyScore: z.number().min(0).max(1).default(1),
  inFlightLoadProducerName: producerParam,
  /** Deprecated and ignored in llm-d too. */
  requestTimeout: z.string().optional(),
});

export class ActiveRequestScorer extends InflightScorer {
  constructor(
    name: string,
    readonly params: z.output<typeof activeRequestParams>,
  ) {
    super("active-request-scorer", name, params.inFlightLoadProducerName as string);
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const counts = requestCounts(cycle, endpoints, this.info(cycle), this.out.get(endpoints.length));
    return relativeLoad(counts, this.params.idleThreshold, this.params.maxBusyScore);
  }
}

/** In place: load ≤ idle → 1, else (max − load) / max × busy — active-request-scorer's shape. */
function relativeLoad(loads: Float64Array, idle: number, busy: number): Float64Array {
  const n = loads.length;
  let max = 0;
  for (let i = 0; i < n; i++) if (loads[i] > max) max = loads[i];
  for (let i = 0; i < n; i++) {
    const c = loads[i];
    loads[i] = c <= idle ? 1 : ((max - c) / max) * busy;
  }
  return loads;
}

export const tokenLoadParams = z.strictObject({
  queueThresholdTokens: z.number().int().positive().default(4194304),
  inFlightLoadProducerName: producerParam,
});

export class TokenLoadScorer extends InflightScorer {
  constructor(
    name: string,
    readonly params: z.output<typeof tokenLoadParams>,
  ) {
    super("token-load-scorer", name, params.inFlightLoadProducerName as string);
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const info = this.info(cycle);
    const threshold = this.params.queueThresholdTokens;
    const n = endpoints.length;
    const out = this.out.get(n);
    const at = endpoints === cycle.candidates ? (info.byPosition?.() ?? null) : null;
    const same = info.uncachedForAll?.() ?? null;
    if (at !== null && same !== null) {
      // Every candidate by position, no per-endpoint lookup (a cold request: nothing matched).
      const inflight = at.tokens;
      for (let i = 0; i < n; i++) out[i] = this.#score(inflight[i] + same, threshold);
      return out;
    }
    for (let i = 0; i < n; i++) {
      const id = endpoints[i].id;
      const tokens = (at !== null ? at.tokens[i] : info.tokens(id)) + info.uncachedRequestTokens(id);
      out[i] = this.#score(tokens, threshold);
    }
    return out;
  }

  #score(tokens: number, threshold: number): number {
    return tokens <= 0 ? 1 : 1 - Math.min(tokens, threshold) / threshold;
  }
}

export const decodeLoadParams = z.strictObject({
  /**
   * What one request adds to every decode step beyond its prompt, in tokens of context: the engine's
   * per-sequence cost (vLLM's per-request step overhead is about 70 tokens' worth of KV read on an
   * 8B model; BLIS's trained-physics β6) plus the output it accumulates while it decodes.
   */
  requestTokens: z.number().int().nonnegative().default(256),
  /**
   * The replicas' vLLM `--max-num-seqs`: a replica with that many of the gateway's requests in
   * flight has no free sequence slot, and a new request there waits for one to end. Unset: learned
   * per replica from its scrapes (the running count whenever requests were left waiting).
   */
  maxNumSeqs: z.number().int().positive().optional(),
  inFlightLoadProducerName: producerParam,
});

/**
 * Decode load as each step pays it: a decoding step reads every running sequence's whole context,
 * so a replica decoding one 50,000-token document is as slow per step as one decoding a few hundred
 * short chats, which a request count calls one request. Scored relatively, as active-request-scorer
 * does (idle → 1, else (max − load)/max), so it separates replicas at any scale; the in-flight
 * producer's own counts (no scrape lag). Without `contextTokens` from the producer, requests only.
 * With peer gateways (src/scheduler/sync.ts) their requests count at `requestTokens` each: the sync
 * carries request and un-prefilled token counts, not prompts held.
 *
 * Sequence slots: a replica with as many requests in flight as it has slots (`maxNumSeqs`, or the
 * cap its scrapes show, slot-cap.ts) makes a new request wait for a running one to end, which no
 * context count shows: it scores 0 while another replica has a free slot (which all score above 0);
 * when none has, the fewest requests beyond the cap wins.
 */
export class DecodeLoadScorer extends InflightScorer {
  constructor(
    name: string,
    readonly params: z.output<typeof decodeLoadParams>,
  ) {
    super("decode-load-scorer", name, params.inFlightLoadProducerName as string);
  }

  /** Each endpoint's sequence-slot cap, read from its scrapes (unless maxNumSeqs is set). */
  readonly #slots = new SlotCaps();
  /** #slots by position in the candidate list last seen, so a full scan needs no lookup by id. */
  #slotsAt: EndpointSlotCap[] = [];
  #aligned: EndpointPositions | null = null;
  #alignedVersion = -1;
  readonly #full = new ScoreBuffer();

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const info = this.info(cycle);
    const loads = requestCounts(cycle, endpoints, info, this.out.get(endpoints.length));
    const per = this.params.requestTokens;
    const n = loads.length;
    const full = this.#full.get(n);
    let free = 0;
    const at = endpoints === cycle.candidates ? (info.byPosition?.()?.context ?? null) : null;
    const caps = this.params.maxNumSeqs === undefined ? this.#capsAt(cycle, endpoints) : null;
    for (let i = 0; i < n; i++) {
      const e = endpoints[i];
      let slots = this.params.maxNumSeqs;
      if (slots === undefined) {
        const c = caps !== null ? caps[i] : this.#slots.of(e.id);
        this.#slots.read(e, c);
        slots = this.#slots.cap(c);
      }
      full[i] = slots !== undefined && loads[i] >= slots ? loads[i] - slots + 1 : 0;
      if (full[i] === 0) free++;
      const context = at !== null ? at[i] : (info.contextTokens?.(e.id) ?? 0);
      loads[i] = loads[i] * per + context;
    }
    if (free === n) return relativeLoad(loads, 0, 1);
    // A replica with every sequence slot taken is saturated for a new request, which would wait
    // there for a running one to end: it scores 0, below every replica with a free slot, even the
    // one with the most context (which keeps one request's worth above 0). When none has a free
    // slot, fewer requests waiting for one scores higher.
    if (free === 0) return relativeLoad(full, 0, 1);
    let max = 0;
    for (let i = 0; i < n; i++) if (loads[i] > max) max = loads[i];
    const room = Math.max(per, 1);
    for (let i = 0; i < n; i++) loads[i] = full[i] > 0 ? 0 : (max - loads[i] + room) / (max + room);
    return loads;
  }

  /** Endpoints that left the pool take their learned caps with them. */
  retainEndpoints(pool: ReadonlySet<string>): void {
    this.#slots.retain(pool);
    this.#aligned = null;
  }

  /** The caps of the candidate list by position; null for another list or without positions. */
  #capsAt(cycle: CycleState, endpoints: readonly EndpointState[]): EndpointSlotCap[] | null {
    if (endpoints !== cycle.candidates) return null;
    const positions = cycle.positions(endpoints);
    if (positions === null) return null;
    if (
      positions !== this.#aligned ||
      positions.version !== this.#alignedVersion ||
      this.#slotsAt.length !== endpoints.length
    ) {
      this.#slotsAt = endpoints.map((e) => this.#slots.of(e.id));
      this.#aligned = positions;
      this.#alignedVersion = positions.version;
    }
    return this.#slotsAt;
  }
}

export const leastRequestParams = z.strictObject({ inFlightLoadProducerName: producerParam });

export class LeastRequestScorer extends InflightScorer {
  constructor(name: string, params: z.output<typeof leastRequestParams>) {
    super("least-request-scorer", name, params.inFlightLoadProducerName as string);
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const counts = requestCounts(cycle, endpoints, this.info(cycle), this.out.get(endpoints.length));
    return minMaxLowerIsBetter(counts);
  }
}

export const activeRequestSpec = spec({
  type: "active-request-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Prefers endpoints with fewer in-flight requests; idle endpoints score 1.",
  params: activeRequestParams,
  needs: inflightNeed,
  deprecatedParams: { requestTimeout: "nothing (in-flight tracking is done by inflight-load-producer)" },
  factory: (name, p) => new ActiveRequestScorer(name, p),
});

export const tokenLoadSpec = spec({
  type: "token-load-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Prefers endpoints with fewer in-flight uncached prompt tokens, counting this request's.",
  params: tokenLoadParams,
  needs: inflightNeed,
  factory: (name, p) => new TokenLoadScorer(name, p),
});

export const decodeLoadSpec = spec({
  type: "decode-load-scorer",
  stability: "alpha",
  kind: "scorer",
  kvgateOnly: true,
  summary:
    "Prefers endpoints whose in-flight requests hold less context (whole prompts + a per-request cost).",
  params: decodeLoadParams,
  needs: inflightNeed,
  factory: (name, p) => new DecodeLoadScorer(name, p),
});

export const leastRequestSpec = spec({
  type: "least-request-scorer",
  stability: "stable",
  kind: "scorer",
  kvgateOnly: true,
  summary: "kvgate baseline: fewest in-flight requests wins (min-max normalised; ties broken by the picker).",
  params: leastRequestParams,
  needs: inflightNeed,
  factory: (name, p) => new LeastRequestScorer(name, p),
});

export const kvPressureParams = z.strictObject({ inFlightLoadProducerName: producerParam });

/**
 * KV utilisation as of now, not as of the last scrape: the scraped kv_cache_usage_perc plus the
 * uncached prompt tokens the gateway has sent the endpoint since then, over its KV capacity
 * (vllm:cache_config_info's num_gpu_blocks × block_size; without it, the scraped value alone). With
 * the scraped value alone every request of a scrape interval sees the same argmin and lands on it.
 * No metrics → 0, as the metric scorers do.
 */
export class KvPressureScorer extends InflightScorer {
  constructor(name: string, params: z.output<typeof kvPressureParams>) {
    super("kv-pressure-scorer", name, params.inFlightLoadProducerName as string);
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const info = this.info(cycle);
    const out = this.out.get(endpoints.length);
    for (let i = 0; i < endpoints.length; i++) {
      const e = endpoints[i];
      const m = e.metrics;
      if (m === null) {
        out[i] = 0;
        continue;
      }
      const capacity = (m.cacheNumBlocks ?? 0) * (m.cacheBlockSize ?? 0);
      const pending =
        capacity > 0 && info.promptTokensPickedSince
          ? info.promptTokensPickedSince(e.id, m.updateTime) / capacity
          : 0;
      out[i] = 1 - Math.min(1, m.kvCacheUsagePercent + pending);
    }
    return out;
  }
}

export const kvPressureSpec = spec({
  type: "kv-pressure-scorer",
  stability: "stable",
  kind: "scorer",
  kvgateOnly: true,
  summary:
    "1 − KV utilisation, with the prompt tokens sent since the last scrape added (no scrape-lag herding).",
  params: kvPressureParams,
  needs: inflightNeed,
  factory: (name, p) => new KvPressureScorer(name, p),
});
