/**
 * Picks the scheduling signals out of a model server's parsed /metrics: queue length, running
 * requests, KV-cache usage and cache geometry. Names are the GIE/llm-d model-server protocol's
 * (llm-d/llm-d-router@ebab6879 `pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go`) with
 * vLLM's legacy KV name as fallback
 * (vLLM v0.26.0 `vllm/v1/metrics/loggers.py`).
 * Series of several data-parallel engines (`engine` label) are summed; KV usage, a fraction, is
 * averaged over them instead.
 */
import { extractLoraInfo, LORA_INFO_METRIC, type LoraInfo } from "./lora-info.ts";
import { type PromFamilies, samplesOf } from "./prom-text.ts";

export type EngineKind = "vllm" | "sglang";

export interface ExtractedMetrics {
  engine: EngineKind;
  waitingQueueSize: number;
  runningRequestsSize: number;
  /** 0..1 */
  kvCacheUsagePercent: number;
  cacheBlockSize?: number;
  cacheNumBlocks?: number;
  /** vllm:cache_config_info{num_cpu_blocks} when numeric (summed over engines); vLLM writes "None" when unset. */
  cacheNumCpuBlocks?: number;
  /** `model_name` label values seen on the queue series (served model names). */
  modelNames: string[];
  /** vLLM's cumulative token counters, when exported (for the dashboard's rates; not routed on). */
  counters?: EngineCounters;
  /** vllm:lora_requests_info's latest series (lora-info.ts), when the replica runs with --enable-lora. */
  lora?: LoraInfo;
  /** kvgate:sim_time_scale: a kvgate simulated replica's simulated seconds per wall second. */
  simTimeScale?: number;
}

/** Cumulative counters of a vLLM replica, summed over engines (vLLM v0.26.0 `vllm/v1/metrics/loggers.py`). */
export interface EngineCounters {
  /** vllm:prefix_cache_queries_total: prompt tokens looked up in the prefix cache. */
  prefixCacheQueries: number;
  /** vllm:prefix_cache_hits_total: of those, tokens found. */
  prefixCacheHits: number;
  /** vllm:generation_tokens_total: output tokens generated. */
  generationTokens: number;
}

const COUNTERS: Record<keyof EngineCounters, string[]> = {
  // gpu_prefix_cache_*: the names before vLLM 0.10 (deprecated in 0.9).
  prefixCacheQueries: ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"],
  prefixCacheHits: ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
  generationTokens: ["vllm:generation_tokens_total"],
};

function counters(families: PromFamilies): EngineCounters | undefined {
  const out: Partial<EngineCounters> = {};
  for (const key of Object.keys(COUNTERS) as Array<keyof EngineCounters>) {
    let v: number | undefined;
    for (const name of COUNTERS[key]) if ((v = total(families, name)) !== undefined) break;
    if (v === undefined || !finite(v)) return undefined;
    out[key] = v;
  }
  return out as EngineCounters;
}

interface EngineNames {
  waiting: string;
  running: string;
  kv: string[];
  cacheInfo: string;
  blockSizeLabel: string;
  numBlocksLabel: string;
}

const ENGINES: Record<EngineKind, EngineNames> = {
  vllm: {
    waiting: "vllm:num_requests_waiting",
    running: "vllm:num_requests_running",
    // gpu_cache_usage_perc: deprecated in vLLM 0.9, hidden from 0.10 (vllm/v1/metrics/loggers.py).
    kv: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    cacheInfo: "vllm:cache_config_info",
    blockSizeLabel: "block_size",
    numBlocksLabel: "num_gpu_blocks",
  },
  sglang: {
    waiting: "sglang:num_queue_reqs",
    running: "sglang:num_running_reqs",
    kv: ["sglang:token_usage"],
    cacheInfo: "sglang:cache_config_info",
    blockSizeLabel: "page_size",
    numBlocksLabel: "num_pages",
  },
};

/** Published by kvgate's simulated replicas only (src/sim/vllm-metrics.ts). */
const SIM_TIME_SCALE = "kvgate:sim_time_scale";

/** Every sample name extractMetrics reads: the scraper parses only these (parsePromText `keep`). */
const EXTRACTED_SAMPLES: ReadonlySet<string> = new Set([
  ...Object.values(ENGINES).flatMap((n) => [n.waiting, n.running, ...n.kv, n.cacheInfo]),
  ...Object.values(COUNTERS).flat(),
  LORA_INFO_METRIC,
  SIM_TIME_SCALE,
]);

export const isExtractedSample = (name: string): boolean => EXTRACTED_SAMPLES.has(name);

export class ExtractError extends Error {
  override name = "ExtractError";
}

function finite(v: number): boolean {
  return Number.isFinite(v) && v >= 0;
}

function total(families: PromFamilies, name: string): number | undefined {
  const ss = samplesOf(families, name);
  if (ss.length === 0) return undefined;
  let t = 0;
  for (const s of ss) t += s.value;
  return t;
}

function mean(families: PromFamilies, name: string): number | undefined {
  const ss = samplesOf(families, name);
  if (ss.length === 0) return undefined;
  return (total(families, name) as number) / ss.length;
}

function labelInt(v: string | undefined): number | undefined {
  if (v === undefined || !/^\d+$/.test(v)) return undefined;
  const n = Number(v);
  return n > 0 && Number.isSafeInteger(n) ? n : undefined;
}

/** Extracts the signals; throws ExtractError naming what is missing or invalid. */
export function extractMetrics(families: PromFamilies): ExtractedMetrics {
  const kind: EngineKind | undefined = families.has(ENGINES.vllm.waiting)
    ? "vllm"
    : families.has(ENGINES.sglang.waiting)
      ? "sglang"
      : undefined;
  if (!kind)
    throw new ExtractError(
      `no model-server metrics found (expected ${ENGINES.vllm.waiting} or ${ENGINES.sglang.waiting})`,
    );
  const n = ENGINES[kind];
  const waiting = total(families, n.waiting);
  const running = total(families, n.running);
  let kv: number | undefined;
  for (const name of n.kv) if ((kv = mean(families, name)) !== undefined) break;
  const missing: string[] = [];
  if (waiting === undefined) missing.push(n.waiting);
  if (running === undefined) missing.push(n.running);
  if (kv === undefined) missing.push(n.kv.join(" or "));
  if (missing.length) throw new ExtractError(`missing ${missing.join(", ")}`);
  if (!finite(waiting as number) || !finite(running as number) || !finite(kv as number))
    throw new ExtractError(`non-finite or negative value: waiting=${waiting} running=${running} kv=${kv}`);

  const out: ExtractedMetrics = {
    engine: kind,
    waitingQueueSize: waiting as number,
    runningRequestsSize: running as number,
    kvCacheUsagePercent: Math.min(1, kv as number),
    modelNames: [],
  };
  const info = samplesOf(families, n.cacheInfo);
  if (info.length > 0) {
    const bs = labelInt(info[0].labels[n.blockSizeLabel]);
    if (bs !== undefined) out.cacheBlockSize = bs;
    let blocks = 0;
    for (const s of info) blocks += labelInt(s.labels[n.numBlocksLabel]) ?? 0;
    if (blocks > 0) out.cacheNumBlocks = blocks;
    if (kind === "vllm") {
      let cpu = 0;
      for (const s of info) cpu += labelInt(s.labels.num_cpu_blocks) ?? 0;
      if (cpu > 0) out.cacheNumCpuBlocks = cpu;
    }
  }
  const models = new Set<string>();
  for (const s of samplesOf(families, n.waiting)) if (s.labels.model_name) models.add(s.labels.model_name);
  out.modelNames = [...models];
  if (kind === "vllm") {
    const c = counters(families);
    if (c) out.counters = c;
    const lora = extractLoraInfo(families);
    if (lora) out.lora = lora;
  }
  const scale = samplesOf(families, SIM_TIME_SCALE)[0]?.value;
  if (scale !== undefined && Number.isFinite(scale) && scale > 0) out.simTimeScale = scale;
  return out;
}
