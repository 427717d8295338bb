/**
 * prefix-cache-scorer (llm-d scheduling/scorer/prefix, reference §3.1):
 *   score = w·min(1, matchBlocks·blockSize/scale)² + (1−w)·matchBlocks/totalBlocks
 * with w = matchLengthWeight (default 0: plain match ratio), scale = matchLengthScaleTokens (8192).
 * 0 when the producer wrote nothing or the prompt has no blocks.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { CycleState, DataKey, EndpointState, Scorer, TypedName } from "../../types.ts";
import type { PrefixMatchInfo } from "../data.ts";
import { prefixKey } from "../data.ts";

export const PREFIX_SCORER_TYPE = "prefix-cache-scorer";

export const prefixScorerParams = z.strictObject({
  matchLengthWeight: z.number().min(0).max(1).default(0),
  matchLengthScaleTokens: z.number().positive().default(8192),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});
export type PrefixScorerParams = z.output<typeof prefixScorerParams>;

export class PrefixCacheScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "affinity" as const;
  readonly #key: DataKey<PrefixMatchInfo>;

  constructor(
    name: string,
    readonly params: PrefixScorerParams,
    producerName: string,
  ) {
    this.typedName = { type: PREFIX_SCORER_TYPE, name };
    this.#key = prefixKey(producerName);
  }

  consumes() {
    return { required: [this.#key] };
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const out = new Float64Array(endpoints.length);
    const info = cycle.get(this.#key);
    if (info === undefined || info.totalBlocks <= 0) return out;
    const w = this.params.matchLengthWeight;
    const scale = this.params.matchLengthScaleTokens;
    for (let i = 0; i < endpoints.length; i++) {
      const m = info.matchBlocks(endpoints[i].id);
      const ratio = m / info.totalBlocks;
      if (w === 0) {
        out[i] = ratio;
        continue;
      }
      const len = Math.min(1, (m * info.blockSizeTokens) / scale);
      out[i] = w * len * len + (1 - w) * ratio;
    }
    return out;
  }
}

export const prefixScorerSpec = spec({
  type: PREFIX_SCORER_TYPE,
  stability: "stable",
  kind: "scorer",
  summary: "Scores endpoints by how much of the request's prefix they hold.",
  params: prefixScorerParams,
  needs: () => [{ family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true }],
  factory: (name, p) => new PrefixCacheScorer(name, p, p.prefixMatchInfoProducerName as string),
});
