/**
 * latency-scorer (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/scorer/latency/plugin.go):
 * scores endpoints by predicted-latency headroom, meant to run after prefix-cache-affinity-filter and
 * slo-headroom-tier-filter have narrowed the set.
 *
 * - Endpoints with both headrooms ≥ 0 (or no prediction) are the positive set; if any, only they
 *   are scored (the rest 0).
 * - All negative: if some have 0 dispatched requests, only those idle ones are scored; else the
 *   least severe non-empty deficit bucket — only TPOT negative, then only TTFT negative, then both —
 *   is scored, always with strategy "least" (smallest deficit first).
 * - Scoring a set: |headroom| of TTFT and TPOT min–max normalised over the set (0.5 when flat),
 *   blended with ttftWeight / tpotWeight normalised to sum 1 (a flat dimension gives its weight to
 *   the other), then "least" → (⌊(1 − c)·100⌋ + 1)/100 (closest to the SLO: bin-packing), "most" →
 *   (⌊c·100⌋ + 1)/100.
 * - No predictions at all (model not ready): composite fallback
 *   (wKV·(1 − KV use) + wQ·(maxQ − q)/maxQ + wPrefix·prefix score)/Σw, rounded to 1/100.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { CycleState, DataKey, EndpointState, Scorer, TypedName } from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { PrefixMatchInfo } from "../data.ts";
import { matchRatio, prefixKey } from "../data.ts";
import type { LatencyPredictionInfo, LatencyPredictions } from "./data.ts";
import { kvUse, latencyKey } from "./data.ts";

export const LATENCY_SCORER_TYPE = "latency-scorer";
const W_MAX = 100;
const EPS = 1e-9;

export const latencyScorerParams = z.strictObject({
  ttftWeight: z.number().nonnegative().default(0.8),
  tpotWeight: z.number().nonnegative().default(0.2),
  headroomSelectionStrategy: z.enum(["least", "most"]).default("least"),
  compositeKVWeight: z.number().nonnegative().default(1),
  compositeQueueWeight: z.number().nonnegative().default(1),
  compositePrefixWeight: z.number().nonnegative().default(1),
  latencyPredictionInfoProducerName: z.string().min(1).optional(),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});
export type LatencyScorerParams = z.output<typeof latencyScorerParams>;

export type ScoringMode =
  | "composite-fallback"
  | "positive"
  | "idle"
  | "tpot-deficit"
  | "ttft-deficit"
  | "both-deficit";

interface Item {
  i: number;
  info: LatencyPredictionInfo | undefined;
}

export class LatencyScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "balance" as const;
  readonly #latency: DataKey<LatencyPredictions>;
  readonly #prefix: DataKey<PrefixMatchInfo>;
  readonly #mode: DataKey<{ mode: ScoringMode; why: string | null }>;
  #out = new Float64Array(16);

  constructor(
    name: string,
    readonly params: LatencyScorerParams,
  ) {
    this.typedName = { type: LATENCY_SCORER_TYPE, name };
    this.#latency = latencyKey(params.latencyPredictionInfoProducerName as string);
    this.#prefix = prefixKey(params.prefixMatchInfoProducerName as string);
    this.#mode = dataKey(`latency-scorer-mode/${name}`);
  }

  consumes() {
    return { required: [this.#latency, this.#prefix] };
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): ArrayLike<number> {
    const n = endpoints.length;
    if (this.#out.length < n) this.#out = new Float64Array(n * 2);
    const out = this.#out;
    out.fill(0, 0, n);
    const preds = cycle.get(this.#latency);
    const items: Item[] = endpoints.map((e, i) => ({ i, info: preds?.get(e.id) }));
    if (!items.some((it) => it.info !== undefined)) {
      this.#composite(cycle, endpoints, out);
      cycle.set(this.#mode, { mode: "composite-fallback", why: preds?.unavailable ?? "no predictions" });
      return out;
    }
    const neg = (it: Item) => it.info !== undefined && (it.info.ttftHeadroom < 0 || it.info.tpotHeadroom < 0);
    const positive = items.filter((it) => !neg(it));
    const set = (mode: ScoringMode, s: Item[], forceLeast: boolean) => {
      this.#bucket(s, out, forceLeast);
      cycle.set(this.#mode, { mode, why: null });
      return out;
    };
    if (positive.length > 0) return set("positive", positive, false);
    const idle = items.filter((it) => it.info !== undefined && it.info.dispatchedRequestCount === 0);
    if (idle.length > 0) return set("idle", idle, true);
    const tpotOnly = items.filter((it) => it.info && it.info.ttftHeadroom >= 0 && it.info.tpotHeadroom < 0);
    if (tpotOnly.length > 0) return set("tpot-deficit", tpotOnly, true);
    const ttftOnly = items.filter((it) => it.info && it.info.ttftHeadroom < 0 && it.info.tpotHeadroom >= 0);
    if (ttftOnly.length > 0) return set("ttft-deficit", ttftOnly, true);
    return set("both-deficit", items, true);
  }

  #bucket(items: Item[], out: Float64Array, forceLeast: boolean): void {
    const p = this.params;
    const sum = p.ttftWeight + p.tpotWeight;
    let alpha = sum > 0 ? p.ttftWeight / sum : 1;
    let beta = sum > 0 ? p.tpotWeight / sum : 0;
    const ttft = (it: Item) => Math.abs(it.info?.ttftHeadroom ?? 0);
    const tpot = (it: Item) => Math.abs(it.info?.tpotHeadroom ?? 0);
    let minA = Number.POSITIVE_INFINITY;
    let maxA = Number.NEGATIVE_INFINITY;
    let minB = Number.POSITIVE_INFINITY;
    let maxB = Number.NEGATIVE_INFINITY;
    for (const it of items) {
      const a = ttft(it);
      const b = tpot(it);
      if (a < minA) minA = a;
      if (a > maxA) maxA = a;
      if (b < minB) minB = b;
      if (b > maxB) maxB = b;
    }
    const rangeA = maxA - minA;
    const rangeB = maxB - minB;
    if (rangeA <= EPS && rangeB > EPS) [alpha, beta] = [0, 1];
    else if (rangeB <= EPS && rangeA > EPS) [alpha, beta] = [1, 0];
    const least = forceLeast || p.headroomSelectionStrategy === "least";
    for (const it of items) {
      const nA = rangeA > EPS ? (ttft(it) - minA) / rangeA : 0.5;
      const nB = rangeB > EPS ? (tpot(it) - minB) / rangeB : 0.5;
      const c = alpha * nA + beta * nB;
      const w = Math.trunc((least ? 1 - c : c) * W_MAX) + 1;
      out[it.i] = w / W_MAX;
    }
  }

  #composite(cycle: CycleState, endpoints: readonly EndpointState[], out: Float64Array): void {
    const p = this.params;
    let wkv = p.compositeKVWeight;
    let wq = p.compositeQueueWeight;
    let wp = p.compositePrefixWeight;
    let sum = wkv + wq + wp;
    if (!(sum > 0)) [wkv, wq, wp, sum] = [1, 0, 0, 1];
    let maxQ = 0;
    for (const e of endpoints) maxQ = Math.max(maxQ, e.metrics?.waitingQueueSize ?? 0);
    const info = cycle.get(this.#prefix);
    for (let i = 0; i < endpoints.length; i++) {
      const e = endpoints[i];
      const q = e.metrics?.waitingQueueSize ?? 0;
      const relQ = maxQ > 0 ? (maxQ - q) / maxQ : 1;
      const c = (wkv * (1 - kvUse(e)) + wq * relQ + wp * matchRatio(info, e.id)) / sum;
      out[i] = Math.round(W_MAX * c) / W_MAX;
    }
  }

  explain(cycle: CycleState): Record<string, unknown> | undefined {
    const m = cycle.get(this.#mode);
    if (m === undefined) return undefined;
    return m.why === null ? { mode: m.mode } : { mode: m.mode, fallback: m.why };
  }
}

export const latencyScorerSpec = spec({
  type: LATENCY_SCORER_TYPE,
  stability: "alpha",
  kind: "scorer",
  summary: "Scores endpoints by predicted TTFT/TPOT headroom against the request's SLOs.",
  params: latencyScorerParams,
  needs: () => [
    { family: "latency-prediction-info", param: "latencyPredictionInfoProducerName", required: true },
    { family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true },
  ],
  factory: (name, p) => new LatencyScorer(name, p),
});
