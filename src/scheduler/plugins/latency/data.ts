/**
 * What predicted-latency-producer writes for its consumers (llm-d's LatencyPredictionInfo,
 * llm-d/llm-d-router pkg/epp/framework/plugins/datalayer/attribute/latency/data_types.go): per
 * endpoint the predicted TTFT and TPOT, their headroom against the request's SLOs and whether each
 * is met, and the endpoint's dispatched request count. When the model cannot predict (too few
 * samples, predictInProduce off), `unavailable` says why and no endpoint has an entry: consumers
 * fall back exactly as llm-d's do when the attribute is missing.
 */
import type { DataKey, EndpointState } from "../../types.ts";
import { familyKey } from "../../types.ts";

export interface LatencyPredictionInfo {
  readonly ttftValid: boolean;
  readonly tpotValid: boolean;
  /** SLO − predicted, ms (no SLO: 0 − predicted, always negative). */
  readonly ttftHeadroom: number;
  /** Buffered TPOT SLO − predicted, ms; 0 when TPOT is neutralised (not streamingMode, or a prefill pod). */
  readonly tpotHeadroom: number;
  readonly ttftMs: number;
  readonly tpotMs: number;
  /** Requests the gateway has in flight on the endpoint. */
  readonly dispatchedRequestCount: number;
}

export interface LatencyPredictions {
  /** The endpoint's prediction, or undefined (no prediction: consumers fall back). */
  get(endpointId: string): LatencyPredictionInfo | undefined;
  /** Why there are no predictions in this cycle, or null when there are. */
  readonly unavailable: string | null;
}

export function latencyKey(producerName: string): DataKey<LatencyPredictions> {
  return familyKey<LatencyPredictions>("latency-prediction-info", producerName);
}

export function isValid(p: LatencyPredictionInfo): boolean {
  return p.ttftValid && p.tpotValid;
}

/** The scraped KV use of an endpoint (0 without metrics). */
export function kvUse(e: EndpointState): number {
  return e.metrics?.kvCacheUsagePercent ?? 0;
}
