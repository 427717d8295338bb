/**
 * bench:latency-model's evaluation: given the observations a simulated run produced (features at
 * decision time and the TTFT / TPOT that followed, in time order), train a fresh model online on
 * the first part and measure it on the held-out rest — MAPE, median and p90 absolute percentage
 * error, p90 absolute error in ms — for each learner variant, beside a baseline that predicts the
 * training mean. Also the prequential error (predict each observation, then learn it) after the
 * warm-up, which is what the router sees live.
 */
import type { LatencyFeatures, ModelMode } from "../scheduler/latency/predictor.ts";
import { LatencyPredictor } from "../scheduler/latency/predictor.ts";
import type { LatencyObservation } from "../scheduler/plugins/latency/producer.ts";

export interface ErrorSummary {
  n: number;
  /** Mean absolute percentage error, %. */
  mape: number;
  /** Median absolute percentage error, %. */
  p50ApePct: number;
  /** 90th percentile absolute percentage error, %. */
  p90ApePct: number;
  /** 90th percentile absolute error, ms. */
  p90AbsMs: number;
  /** Mean of the actual values, ms (scale of the errors). */
  meanActualMs: number;
}

export interface VariantResult {
  heldOut: ErrorSummary | null;
  prequential: ErrorSummary | null;
}

export function summarizeErrors(pred: number[], actual: number[]): ErrorSummary | null {
  const n = actual.length;
  if (n === 0) return null;
  const ape: number[] = [];
  const abs: number[] = [];
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const a = Math.abs(pred[i] - actual[i]);
    abs.push(a);
    ape.push((a / actual[i]) * 100);
    sum += actual[i];
  }
  return {
    n,
    mape: round(ape.reduce((s, v) => s + v, 0) / n),
    p50ApePct: round(quantile(ape, 0.5)),
    p90ApePct: round(quantile(ape, 0.9)),
    p90AbsMs: round(quantile(abs, 0.9)),
    meanActualMs: round(sum / n),
  };
}

function quantile(v: number[], q: number): number {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

function round(v: number): number {
  return Math.round(v * 100) / 100;
}

export type Learner = ModelMode | "mean";

/**
 * One target's observations (TTFT or TPOT): train on the first `trainFraction`, evaluate on the
 * rest; prequential over everything after `minSamples`.
 */
export function evaluate(
  obs: readonly LatencyObservation[],
  kind: "ttft" | "tpot",
  learner: Learner,
  opts: { trainFraction: number; minSamples: number },
): VariantResult {
  const xs = obs.filter((o) => o.kind === kind);
  const cut = Math.floor(xs.length * opts.trainFraction);
  const model = makeModel(learner, opts.minSamples);
  const preqP: number[] = [];
  const preqA: number[] = [];
  for (let i = 0; i < cut; i++) {
    const o = xs[i];
    const p = model.predict(o.features, kind);
    if (p !== undefined) {
      preqP.push(p);
      preqA.push(o.ms);
    }
    model.observe(o.features, kind, o.ms);
  }
  const hp: number[] = [];
  const ha: number[] = [];
  for (let i = cut; i < xs.length; i++) {
    const p = model.predict(xs[i].features, kind);
    if (p === undefined) continue;
    hp.push(p);
    ha.push(xs[i].ms);
  }
  return { heldOut: summarizeErrors(hp, ha), prequential: summarizeErrors(preqP, preqA) };
}

interface EvalModel {
  observe(f: LatencyFeatures, kind: "ttft" | "tpot", ms: number): void;
  predict(f: LatencyFeatures, kind: "ttft" | "tpot"): number | undefined;
}

function makeModel(learner: Learner, minSamples: number): EvalModel {
  if (learner === "mean") {
    const acc = { ttft: [0, 0], tpot: [0, 0] };
    return {
      observe: (_f, k, ms) => {
        acc[k][0] += ms;
        acc[k][1]++;
      },
      predict: (_f, k) => (acc[k][1] >= minSamples ? acc[k][0] / acc[k][1] : undefined),
    };
  }
  const m = new LatencyPredictor({ minSamples, mode: learner });
  return {
    observe: (f, k, ms) => (k === "ttft" ? m.observeTtft(f, ms) : m.observeTpot(f, ms)),
    predict: (f, k) => (k === "ttft" ? m.predict(f).ttftMs : m.predict(f).tpotMs),
  };
}
