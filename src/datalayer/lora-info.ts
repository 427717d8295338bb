/**
 * vLLM's LoRA gauge, vllm:lora_requests_info (vLLM v0.26.0 vllm/v1/metrics/loggers.py): labels
 * running_lora_adapters and waiting_lora_adapters (comma-joined adapter names) and max_lora (the
 * engine's --max-loras); the value is the time the series was last set. Every label combination the
 * engine ever reported stays in the exposition, so only the series with the LATEST value is current
 * (llm-d/llm-d-router pkg/epp/framework/plugins/datalayer/extractor/metrics/loraspec.go and
 * extractor.go populateLoRAMetrics read it the same way).
 */
import { type PromFamilies, samplesOf } from "./prom-text.ts";

export const LORA_INFO_METRIC = "vllm:lora_requests_info";

/** The adapters a replica reports (llm-d's Metrics.ActiveModels, WaitingModels, MaxActiveModels). */
export interface LoraInfo {
  /** Adapters with running requests, in the order reported. */
  running: string[];
  /** Adapters with waiting requests. */
  waiting: string[];
  /** max_lora; 0 when absent or not an integer (then no adapter fits: llm-d's zero value). */
  maxLora: number;
}

/** Names of a comma-separated label, trimmed, empties dropped, first occurrence kept. */
export function splitAdapters(csv: string | undefined): string[] {
  if (!csv) return [];
  const out: string[] = [];
  for (const part of csv.split(",")) {
    const name = part.trim();
    if (name !== "" && !out.includes(name)) out.push(name);
  }
  return out;
}

/**
 * The current LoRA state: the series with the latest timestamp value (the first of equal ones).
 * Undefined when the family is absent or empty: vLLM writes it only with --enable-lora.
 */
export function extractLoraInfo(families: PromFamilies, name = LORA_INFO_METRIC): LoraInfo | undefined {
  let best: { labels: Record<string, string>; value: number } | undefined;
  for (const s of samplesOf(families, name)) {
    if (!Number.isFinite(s.value)) continue;
    if (best === undefined || s.value > best.value) best = s;
  }
  if (best === undefined) return undefined;
  const raw = best.labels["max_lora"];
  const max = raw !== undefined && /^\d+$/.test(raw.trim()) ? Number(raw.trim()) : 0;
  return {
    running: splitAdapters(best.labels["running_lora_adapters"]),
    waiting: splitAdapters(best.labels["waiting_lora_adapters"]),
    maxLora: Number.isSafeInteger(max) ? max : 0,
  };
}
