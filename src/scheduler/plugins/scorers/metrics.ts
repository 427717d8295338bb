/**
 * Scorers on scraped model-server metrics (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/scorer/`):
 *   queue-scorer                 (max − q)/(max − min) over candidates; all equal → 1
 *   running-requests-size-scorer same min-max on running requests
 *   kv-cache-utilization-scorer  1 − kvCacheUsagePercent
 *   load-aware-scorer            q = 0 → 0.5, else 0.5·(1 − min(q, threshold)/threshold)
 * An endpoint without metrics is treated as worst: score 0.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type {
  CycleState,
  EndpointMetrics,
  EndpointState,
  Scorer,
  ScorerCategory,
  TypedName,
} from "../../types.ts";

/** Min-max normalisation, lower raw value = better, in place. NaN marks "no metrics" (scores 0). */
export function minMaxLowerIsBetter(values: Float64Array): Float64Array {
  const out = values;
  let min = Number.POSITIVE_INFINITY;
  let max = Number.NEGATIVE_INFINITY;
  for (const v of values) {
    if (Number.isNaN(v)) continue;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (Number.isNaN(v)) out[i] = 0;
    else out[i] = max === min ? 1 : (max - v) / (max - min);
  }
  return out;
}

class MinMaxMetricScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category: ScorerCategory = "distribution";

  constructor(
    type: string,
    name: string,
    readonly metric: (m: EndpointMetrics) => number,
  ) {
    this.typedName = { type, name };
  }

  readonly #out = new ScoreBuffer();

  score(_cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    // minMaxLowerIsBetter(raw) computed in place: one array instead of two.
    const out = this.#out.get(endpoints.length);
    let min = Number.POSITIVE_INFINITY;
    let max = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i].metrics;
      const v = m === null ? Number.NaN : this.metric(m);
      out[i] = v;
      if (Number.isNaN(v)) continue;
      if (v < min) min = v;
      if (v > max) max = v;
    }
    for (let i = 0; i < out.length; i++) {
      const v = out[i];
      out[i] = Number.isNaN(v) ? 0 : max === min ? 1 : (max - v) / (max - min);
    }
    return out;
  }
}

export class KvCacheUtilizationScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;

  constructor(name: string) {
    this.typedName = { type: "kv-cache-utilization-scorer", name };
  }

  readonly #out = new ScoreBuffer();

  score(_cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const out = this.#out.get(endpoints.length);
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i].metrics;
      out[i] = m === null ? 0 : 1 - m.kvCacheUsagePercent;
    }
    return out;
  }
}

export const loadAwareParams = z.strictObject({ threshold: z.number().int().positive().default(128) });

export class LoadAwareScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;

  constructor(
    name: string,
    readonly threshold: number,
  ) {
    this.typedName = { type: "load-aware-scorer", name };
  }

  readonly #out = new ScoreBuffer();

  score(_cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const out = this.#out.get(endpoints.length);
    for (let i = 0; i < endpoints.length; i++) {
      const m = endpoints[i].metrics;
      if (m === null) continue;
      const q = m.waitingQueueSize;
      out[i] = q <= 0 ? 0.5 : 0.5 * (1 - Math.min(q, this.threshold) / this.threshold);
    }
    return out;
  }
}

const noParams = z.strictObject({});

export const queueScorerSpec = spec({
  type: "queue-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Min-max normalised waiting-queue size across candidates (shorter is better).",
  params: noParams,
  factory: (name) => new MinMaxMetricScorer("queue-scorer", name, (m) => m.waitingQueueSize),
});

export const runningRequestsScorerSpec = spec({
  type: "running-requests-size-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Min-max normalised running-request count across candidates (fewer is better).",
  params: noParams,
  factory: (name) =>
    new MinMaxMetricScorer("running-requests-size-scorer", name, (m) => m.runningRequestsSize),
});

export const kvCacheScorerSpec = spec({
  type: "kv-cache-utilization-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "1 − KV-cache utilisation.",
  params: noParams,
  factory: (name) => new KvCacheUtilizationScorer(name),
});

export const loadAwareScorerSpec = spec({
  type: "load-aware-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "0.5 for an empty queue, falling linearly to 0 at `threshold` waiting requests.",
  params: loadAwareParams,
  factory: (name, p) => new LoadAwareScorer(name, p.threshold),
});
