/**
 * concurrency-detector (llm-d/llm-d-router `pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency/`):
 * saturation from the requests the gateway itself has in flight, not from scraped metrics, so it
 * sees a burst at once instead of a scrape interval later (llm-d's flow-control guide recommends it
 * for that reason). `requests` mode: in-flight requests / (endpoints · maxConcurrency); `tokens`
 * mode: in-flight tokens / (endpoints · maxTokenConcurrency); an empty pool is 1.0. kvgate counts
 * in flight in the flow-control gate, so it needs the flowControl feature gate; the per-endpoint
 * `hybrid` mode and its use as a filter are not implemented.
 */
import { z } from "zod";
import { spec } from "../scheduler/plugin-spec.ts";
import type { Plugin, TypedName } from "../scheduler/types.ts";

export const CONCURRENCY_DETECTOR_TYPE = "concurrency-detector";

export const concurrencyParams = z.strictObject({
  concurrencyMode: z
    .enum(["requests", "tokens", "hybrid"])
    .default("requests")
    .refine((m) => m !== "hybrid", {
      message: "hybrid (per-endpoint) is not implemented in kvgate; use requests or tokens",
    }),
  maxConcurrency: z.number().int().positive().default(100),
  maxTokenConcurrency: z.number().int().positive().default(1_000_000),
  headroom: z.number().nonnegative().default(0),
});
export type ConcurrencyParams = z.output<typeof concurrencyParams>;

export class ConcurrencyDetector implements Plugin {
  readonly typedName: TypedName;
  readonly params: ConcurrencyParams;

  constructor(name = CONCURRENCY_DETECTOR_TYPE, params: Partial<ConcurrencyParams> = {}) {
    this.typedName = { type: CONCURRENCY_DETECTOR_TYPE, name };
    this.params = concurrencyParams.parse(params);
  }

  /** Pool saturation for `endpoints` ready endpoints with this much in flight. */
  saturation(inflightRequests: number, inflightTokens: number, endpoints: number): number {
    if (endpoints <= 0) return 1;
    return this.params.concurrencyMode === "tokens"
      ? inflightTokens / (endpoints * this.params.maxTokenConcurrency)
      : inflightRequests / (endpoints * this.params.maxConcurrency);
  }
}

export const concurrencyDetectorSpec = spec({
  type: CONCURRENCY_DETECTOR_TYPE,
  stability: "beta",
  kind: "saturation-detector",
  summary:
    "Pool saturation from the gateway's own in-flight requests or tokens (needs the flowControl gate).",
  params: concurrencyParams,
  factory: (name, p) => new ConcurrencyDetector(name, p),
});
