/**
 * prefix-cache-scorer (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go`):
 *   score = w·min(1, matchBlocks·blockSize/scale)² + (1−w)·matchBlocks/totalBlocks
 * with w = matchLengthWeight (default 0: plain match ratio), scale = matchLengthScaleTokens (8192).
 * 0 when the producer wrote nothing or the prompt has no blocks.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
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
  readonly #out = new ScoreBuffer();

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
    const out = this.#out.get(endpoints.length);
    const info = cycle.get(this.#key);
    if (info === undefined || info.totalBlocks <= 0) return out;
    // Endpoints without a match score 0, so when the producer lists its matches and the cycle keeps
    // positions for this list, only the matched ones are looked up (no per-candidate scan).
    const matched = info.matches?.();
    const positions = matched !== undefined ? cycle.positions(endpoints) : null;
    if (matched !== undefined && positions !== null) {
      for (const [id, m] of matched) {
        const i = positions.indexOf(id);
        if (i >= 0) out[i] = this.#score(m, info);
      }
      return out;
    }
    for (let i = 0; i < endpoints.length; i++) out[i] = this.#score(info.matchBlocks(endpoints[i].id), info);
    return out;
  }

  #score(m: number, info: PrefixMatchInfo): number {
    const ratio = m / info.totalBlocks;
    const w = this.params.matchLengthWeight;
    if (w === 0) return ratio;
    const len = Math.min(1, (m * info.blockSizeTokens) / this.params.matchLengthScaleTokens);
    return w * len * len + (1 - w) * ratio;
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
