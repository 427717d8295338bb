/**
 * utilization-detector (llm-d/llm-d-router@ebab6879 `pkg/epp/flowcontrol/saturationdetector/utilization/`).
 * Per endpoint: max(waitingQueueSize/queueDepthThreshold, kvCacheUsagePercent/kvCacheUtilThreshold);
 * an endpoint with no metrics, or metrics older than metricsStalenessThreshold, counts 1.0 (fail
 * closed). Pool saturation = average over the candidates; an empty pool is 1.0. ≥ 1.0 = saturated.
 * As a filter it drops endpoints above 1.0·(1 + headroom), keeping all if that would drop every one.
 */
import { z } from "zod";
import { spec } from "../scheduler/plugin-spec.ts";
import type { CycleState, EndpointState, Filter, TypedName } from "../scheduler/types.ts";
import { parseDuration } from "./duration.ts";

export const UTILIZATION_DETECTOR_TYPE = "utilization-detector";

export const utilizationParams = z.strictObject({
  queueDepthThreshold: z.number().positive().default(5),
  kvCacheUtilThreshold: z.number().positive().default(0.8),
  metricsStalenessThreshold: z
    .string()
    .refine((s) => parseDuration(s) !== null, { message: 'expected a duration such as "200ms" or "2s"' })
    .default("200ms"),
  headroom: z.number().nonnegative().default(0),
});
export type UtilizationParams = z.output<typeof utilizationParams>;

export class UtilizationDetector implements Filter {
  readonly typedName: TypedName;
  readonly params: UtilizationParams;
  /** metricsStalenessThreshold in seconds. */
  readonly staleAfter: number;

  constructor(name = UTILIZATION_DETECTOR_TYPE, params: Partial<UtilizationParams> = {}) {
    this.typedName = { type: UTILIZATION_DETECTOR_TYPE, name };
    this.params = utilizationParams.parse(params);
    this.staleAfter = parseDuration(this.params.metricsStalenessThreshold) as number;
  }

  /** Saturation of one endpoint at time `now` (seconds). */
  endpointSaturation(ep: EndpointState, now: number): number {
    const m = ep.metrics;
    if (m === null || now - m.updateTime > this.staleAfter) return 1;
    const q = m.waitingQueueSize / this.params.queueDepthThreshold;
    const kv = m.kvCacheUsagePercent / this.params.kvCacheUtilThreshold;
    return Math.max(q, kv);
  }

  /** Average endpoint saturation; 1.0 for an empty pool. */
  saturation(endpoints: readonly EndpointState[], now: number): number {
    if (endpoints.length === 0) return 1;
    let sum = 0;
    for (const e of endpoints) sum += this.endpointSaturation(e, now);
    return sum / endpoints.length;
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    const limit = 1 + this.params.headroom;
    const kept = endpoints.filter((e) => this.endpointSaturation(e, cycle.now) <= limit);
    return kept.length === 0 ? endpoints : kept;
  }
}

export const utilizationDetectorSpec = spec({
  type: UTILIZATION_DETECTOR_TYPE,
  stability: "stable",
  kind: "saturation-detector",
  summary: "Pool saturation from queue depth and KV utilisation (drives admission); also usable as a filter.",
  params: utilizationParams,
  factory: (name, p) => new UtilizationDetector(name, p),
});
