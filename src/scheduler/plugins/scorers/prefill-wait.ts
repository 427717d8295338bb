/**
 * prefill-wait-scorer (kvgate-only): how long this request would wait for its first token on each
 * endpoint, relative to the best one. The wait is the endpoint's queued uncached prefill — the
 * in-flight producer's tokens, this request's own uncached tokens included — over the endpoint's
 * prefill rate (learned from its first-token times, `peakPrefillThroughput` until then):
 *
 *   wait_i  = (inFlightTokens_i + uncached_i) / rate_i                       seconds
 *   score_i = (floorSeconds + min_j wait_j) / (floorSeconds + wait_i)       ∈ (0, 1], best = 1
 *
 * Relative, so it still separates endpoints when every queue is long (an overloaded fleet, where
 * token-load-scorer's 1 − tokens/threshold has saturated at 0 everywhere); the floor keeps
 * differences far below one engine step from counting (a 40-token question on a replica with
 * 40 tokens queued is not 2× worse off than on an idle one). A request queued behind another
 * request's whole prompt waits that prompt's prefill time, while one more decoding request costs
 * every step a fraction of a millisecond: this is the signal that predicts TTFT.
 *
 * `shortLanes` (kvgate-only, off unless set): under a backlog the least-queued endpoints are kept
 * for short prompts. When the median endpoint has more than `gateSeconds` of prefill queued ahead,
 * a prompt longer than the `quantile` of the last `window` prompts (uncached tokens) scores 0 on
 * the k least-queued endpoints, unless such an endpoint's queue is under `laneSeconds` (so a lane
 * never idles). The short prompts fill f = endpoints × their share of those tokens endpoints' worth:
 * k = ⌈f ÷ `maxLaneLoad`⌉, so a lane is never loaded past that share of its capacity by them alone
 * (a lane they fill backlogs with them), at most endpoints − 2, and none when f < 0.5 (a whole lane
 * for them starves the rest). Each gateway reads its own recent prompts. Every endpoint is FCFS:
 * balancing alone makes everyone who arrives in a backlog wait it out, while a short prompt on a
 * lane is done in a fraction of the wait. Size-based assignment (SITA; Harchol-Balter, Crovella and
 * Murta, 1999) shortens the wait of the many short requests for a little more on the few long
 * ones; the lanes' queues run shorter than the rest, so a backlog drains slightly less evenly.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type { CycleState, DataKey, EndpointState, Scorer, TypedName } from "../../types.ts";
import type { InFlightInfo } from "../data.ts";
import { inflightKey, need } from "../data.ts";

export const prefillWaitParams = z.strictObject({
  /** Waits this much shorter than the best one barely count (seconds). */
  floorSeconds: z.number().positive().default(0.25),
  /** Tokens/s until an endpoint's rate is learned (the affinity filter's default). */
  peakPrefillThroughput: z.number().positive().default(15928),
  /** Use each endpoint's learned prefill rate (the in-flight producer's); false = the fixed rate. */
  learnPrefillThroughput: z.boolean().default(true),
  inFlightLoadProducerName: z.string().min(1).optional(),
  shortLanes: z
    .strictObject({
      /** Prompts above this quantile of the recent ones are long. */
      quantile: z.number().gt(0).lt(1).default(0.25),
      /** The backlog (median endpoint's prefill queued ahead, seconds) that opens the lanes. */
      gateSeconds: z.number().nonnegative().default(1),
      /** A lane whose own queue is under this takes long prompts too (seconds). */
      laneSeconds: z.number().nonnegative().default(0.5),
      /** Recent prompts the quantile is read from. */
      window: z.number().int().min(32).default(256),
      /** Lanes enough that the short prompts' tokens fill at most this share of their capacity. */
      maxLaneLoad: z.number().gt(0).lte(1).default(0.9),
    })
    .optional(),
});
export type PrefillWaitParams = z.output<typeof prefillWaitParams>;

export class PrefillWaitScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;
  readonly #key: DataKey<InFlightInfo>;
  readonly #out = new ScoreBuffer();
  readonly #lanes: ShortLanes | undefined;
  readonly #ahead = new ScoreBuffer();

  constructor(
    name: string,
    readonly params: PrefillWaitParams,
  ) {
    this.typedName = { type: "prefill-wait-scorer", name };
    this.#key = inflightKey(params.inFlightLoadProducerName as string);
    this.#lanes = params.shortLanes && new ShortLanes(params.shortLanes);
  }

  consumes() {
    return { required: [this.#key] };
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const info = need(cycle, this.#key, this.typedName.name);
    const p = this.params;
    const n = endpoints.length;
    const out = this.#out.get(n);
    const at = endpoints === cycle.candidates ? (info.byPosition?.() ?? null) : null;
    const same = info.uncachedForAll?.() ?? null;
    const learned = p.learnPrefillThroughput ? info.prefillRate?.bind(info) : undefined;
    let min = Number.POSITIVE_INFINITY;
    let minOwn = Number.POSITIVE_INFINITY;
    for (let i = 0; i < n; i++) {
      const id = endpoints[i].id;
      const queued = at !== null ? at.tokens[i] : info.tokens(id);
      const own = same ?? info.uncachedRequestTokens(id);
      const rate = learned?.(id) ?? p.peakPrefillThroughput;
      const wait = Math.max(0, queued + own) / rate;
      out[i] = wait;
      if (wait < min) min = wait;
      if (own < minOwn) minOwn = own;
    }
    const floor = p.floorSeconds;
    const lanes = this.#lanes;
    if (lanes !== undefined) {
      const k = Math.min(lanes.add(minOwn, n), n - 2); // two endpoints are left to long prompts
      if (k > 0) {
        // The prefill queued ahead of this request on each endpoint. Lanes open when the median one
        // (the ⌊n/2⌋-th smallest) has over gateSeconds: counted first, so a calm fleet sorts nothing.
        const ahead = this.#ahead.get(n);
        let over = 0;
        for (let i = 0; i < n; i++) {
          ahead[i] = Math.max(0, out[i] - minOwn / (learned?.(endpoints[i].id) ?? p.peakPrefillThroughput));
          if (ahead[i] > lanes.gateSeconds) over++;
        }
        if (over >= n - (n >> 1)) {
          const order = [...ahead.keys()].sort((a, b) => ahead[a] - ahead[b] || a - b);
          let open = Number.POSITIVE_INFINITY;
          for (let r = 0; r < n; r++) {
            const i = order[r];
            if (r < k && ahead[i] >= lanes.laneSeconds) out[i] = Number.POSITIVE_INFINITY;
            else if (out[i] < open) open = out[i];
          }
          min = open;
        }
      }
    }
    for (let i = 0; i < n; i++) out[i] = (floor + min) / (floor + out[i]);
    return out;
  }
}

/**
 * The recent prompts' sizes, for shortLanes: add() records one and says how many lanes to keep from
 * it (0 when it is short, or too few prompts are known). The cut and the short prompts' share are
 * re-read every 32 prompts, so a decision does not sort the window.
 */
class ShortLanes {
  readonly #sizes: number[] = [];
  #next = 0;
  #cut = Number.POSITIVE_INFINITY;
  #share = 0;
  #since = 0;

  readonly window: number;
  readonly quantile: number;
  readonly gateSeconds: number;
  readonly laneSeconds: number;
  readonly maxLaneLoad: number;

  constructor(o: NonNullable<PrefillWaitParams["shortLanes"]>) {
    this.window = o.window;
    this.quantile = o.quantile;
    this.gateSeconds = o.gateSeconds;
    this.laneSeconds = o.laneSeconds;
    this.maxLaneLoad = o.maxLaneLoad;
  }

  add(size: number, endpoints: number): number {
    if (this.#sizes.length < this.window) this.#sizes.push(size);
    else {
      this.#sizes[this.#next] = size;
      this.#next = (this.#next + 1) % this.window;
    }
    if (++this.#since >= 32) {
      this.#since = 0;
      const sorted = [...this.#sizes].sort((a, b) => a - b);
      this.#cut = sorted[Math.floor(this.quantile * (sorted.length - 1))];
      let short = 0;
      let all = 0;
      for (const x of sorted) {
        all += x;
        if (x <= this.#cut) short += x;
      }
      this.#share = all > 0 ? short / all : 0;
    }
    if (size <= this.#cut) return 0;
    const fill = endpoints * this.#share; // endpoints' worth of short prompts
    return fill < 0.5 ? 0 : Math.ceil(fill / this.maxLaneLoad);
  }
}

export const prefillWaitSpec = spec({
  type: "prefill-wait-scorer",
  stability: "alpha",
  kind: "scorer",
  kvgateOnly: true,
  summary:
    "Prefers the endpoint where this request's prefill would start soonest (queued uncached tokens ÷ learned prefill rate), relative to the best.",
  params: prefillWaitParams,
  needs: () => [{ family: "inflight-load", param: "inFlightLoadProducerName", required: true }],
  factory: (name, p) => new PrefillWaitScorer(name, p),
});
