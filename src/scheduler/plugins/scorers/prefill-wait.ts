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
});
export type PrefillWaitParams = z.output<typeof prefillWaitParams>;

export class PrefillWaitScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;
  readonly #key: DataKey<InFlightInfo>;
  readonly #out = new ScoreBuffer();

  constructor(
    name: string,
    readonly params: PrefillWaitParams,
  ) {
    this.typedName = { type: "prefill-wait-scorer", name };
    this.#key = inflightKey(params.inFlightLoadProducerName as string);
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
    for (let i = 0; i < n; i++) {
      const id = endpoints[i].id;
      const queued = at !== null ? at.tokens[i] : info.tokens(id);
      const own = same ?? info.uncachedRequestTokens(id);
      const rate = learned?.(id) ?? p.peakPrefillThroughput;
      const wait = Math.max(0, queued + own) / rate;
      out[i] = wait;
      if (wait < min) min = wait;
    }
    const floor = p.floorSeconds;
    for (let i = 0; i < n; i++) out[i] = (floor + min) / (floor + out[i]);
    return out;
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
