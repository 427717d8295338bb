/**
 * slo-headroom-tier-filter (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/filter/
 * sloheadroomtier/plugin.go): splits the endpoints into a positive tier (TTFT and TPOT headroom both
 * ≥ 0: predicted to meet the request's SLOs) and a negative tier (the rest, and endpoints without a
 * prediction). Both non-empty: the negative tier with probability epsilonExploreNeg (so overloaded
 * endpoints still see some traffic and their predictions recover), else the positive one. One tier
 * empty: the other. No predictions at all (model not ready): all endpoints are kept.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { CycleState, DataKey, EndpointState, Filter, TypedName } from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { LatencyPredictions } from "./data.ts";
import { latencyKey } from "./data.ts";

export const TIER_FILTER_TYPE = "slo-headroom-tier-filter";

export const tierFilterParams = z.strictObject({
  epsilonExploreNeg: z.number().min(0).max(1).default(0.01),
  /** kvgate: which producer's predictions to read (llm-d reads the default one). */
  latencyPredictionInfoProducerName: z.string().min(1).optional(),
});
export type TierFilterParams = z.output<typeof tierFilterParams>;

export type TierDecision = "no-predictions" | "positive" | "negative" | "explore-negative" | "single";

export class SloHeadroomTierFilter implements Filter {
  readonly typedName: TypedName;
  readonly #latency: DataKey<LatencyPredictions>;
  readonly #decision: DataKey<TierDecision>;
  readonly decisions: Record<TierDecision, number> = {
    "no-predictions": 0,
    positive: 0,
    negative: 0,
    "explore-negative": 0,
    single: 0,
  };

  constructor(
    name: string,
    readonly params: TierFilterParams,
  ) {
    this.typedName = { type: TIER_FILTER_TYPE, name };
    this.#latency = latencyKey(params.latencyPredictionInfoProducerName as string);
    this.#decision = dataKey(`slo-headroom-tier/${name}`);
  }

  consumes() {
    return { required: [this.#latency] };
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    if (endpoints.length <= 1) return this.#done(cycle, "single", endpoints);
    const preds = cycle.get(this.#latency);
    const positive: EndpointState[] = [];
    const negative: EndpointState[] = [];
    let predicted = 0;
    for (const e of endpoints) {
      const p = preds?.get(e.id);
      if (p !== undefined) predicted++;
      if (p !== undefined && p.ttftHeadroom >= 0 && p.tpotHeadroom >= 0) positive.push(e);
      else negative.push(e);
    }
    if (predicted === 0) return this.#done(cycle, "no-predictions", endpoints);
    if (positive.length > 0 && negative.length > 0) {
      if (cycle.rng.next() < this.params.epsilonExploreNeg)
        return this.#done(cycle, "explore-negative", negative);
      return this.#done(cycle, "positive", positive);
    }
    return positive.length > 0
      ? this.#done(cycle, "positive", positive)
      : this.#done(cycle, "negative", negative);
  }

  #done(cycle: CycleState, d: TierDecision, eps: readonly EndpointState[]): readonly EndpointState[] {
    this.decisions[d]++;
    cycle.set(this.#decision, d);
    return eps;
  }

  explain(cycle: CycleState): Record<string, unknown> | undefined {
    const d = cycle.get(this.#decision);
    if (d === undefined) return undefined;
    return d === "no-predictions"
      ? { tier: d, fallback: "no latency predictions yet: every endpoint kept" }
      : { tier: d };
  }

  stats() {
    return { ...this.decisions };
  }
}

export const tierFilterSpec = spec({
  type: TIER_FILTER_TYPE,
  stability: "alpha",
  kind: "filter",
  summary: "Keeps the endpoints predicted to meet the request's SLOs (with a little exploration).",
  params: tierFilterParams,
  needs: () => [
    { family: "latency-prediction-info", param: "latencyPredictionInfoProducerName", required: true },
  ],
  factory: (name, p) => new SloHeadroomTierFilter(name, p),
});
