/**
 * lora-affinity-scorer (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/
 * lora_affinity.go): prefers endpoints where the request's target model, a LoRA adapter, is already
 * in use. From the endpoint's vllm:lora_requests_info (EndpointMetrics.activeModels, waitingModels,
 * maxActiveModels), checked in this order:
 *   1.0  the adapter has running requests there (active);
 *   0.8  there is room for one more adapter: active + waiting adapters < max_lora;
 *   0.6  the adapter is waiting there (queued for a slot);
 *   0.0  otherwise (every slot taken by other adapters, or no LoRA state reported).
 * No parameters (llm-d has none). Category affinity. Pure.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type { CycleState, EndpointMetrics, EndpointState, Scorer, TypedName } from "../../types.ts";

export const LORA_ACTIVE = 1.0;
export const LORA_CAPACITY = 0.8;
export const LORA_WAITING = 0.6;
export const LORA_FULL = 0.0;

/** The score of one endpoint's metrics for `targetModel` (null metrics: nothing known, 0). */
export function loraAffinity(m: EndpointMetrics | null, targetModel: string): number {
  if (m === null) return LORA_FULL;
  const active = m.activeModels ?? [];
  const waiting = m.waitingModels ?? [];
  if (active.includes(targetModel)) return LORA_ACTIVE;
  if (active.length + waiting.length < (m.maxActiveModels ?? 0)) return LORA_CAPACITY;
  if (waiting.includes(targetModel)) return LORA_WAITING;
  return LORA_FULL;
}

export class LoraAffinityScorer implements Scorer {
  readonly typedName: TypedName;
  readonly category = "affinity" as const;
  readonly #out = new ScoreBuffer();

  constructor(name: string) {
    this.typedName = { type: "lora-affinity-scorer", name };
  }

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const out = this.#out.get(endpoints.length);
    const model = cycle.request.model;
    for (let i = 0; i < endpoints.length; i++) out[i] = loraAffinity(endpoints[i].metrics, model);
    return out;
  }
}

export const loraAffinitySpec = spec({
  type: "lora-affinity-scorer",
  stability: "stable",
  kind: "scorer",
  summary:
    "1 where the request's LoRA adapter is running, 0.8 where a slot is free, 0.6 where it waits, else 0 (vllm:lora_requests_info).",
  params: z.strictObject({}),
  factory: (name) => new LoraAffinityScorer(name),
});
