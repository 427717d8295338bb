/**
 * What an autoscaling policy sees and says. Pure data: the gateway (or the fleet simulator) samples
 * the traffic and the pools every few seconds and hands each sample to the policy; every `interval`
 * seconds it asks the policy for each pool's desired replica count. Time is passed in, never read.
 */

/** A pool's role: an aggregated pool serves whole requests; P/D pools serve one leg each. */
export type PoolRole = "aggregated" | "prefill" | "decode";

/** One ready replica as scraped at the sample (vLLM's gauges) plus its GPU busy share since the last. */
export interface ReplicaSample {
  /** vllm:kv_cache_usage_perc, 0–1. */
  kvUsage: number;
  /** vllm:num_requests_waiting. */
  waiting: number;
  /** vllm:num_requests_running. */
  running: number;
  /** Share of the period the GPU was running a step (what DCGM_FI_DEV_GPU_UTIL reports), 0–1. */
  busy: number;
}

export interface PoolSample {
  name: string;
  role: PoolRole;
  /** Replicas serving. */
  ready: number;
  /** Replicas asked for and still starting (model loading). */
  starting: number;
  /** The count currently asked for (ready + starting; draining replicas are not counted). */
  target: number;
  replicas: ReplicaSample[];
}

/** Traffic at the gateway over the period since the previous sample. */
export interface TrafficSample {
  /** Requests that arrived. */
  arrivals: number;
  /** Prompt tokens of those arrivals. */
  inputTokens: number;
  /** Requests that completed, with their output, prompt and prefix-cached prompt tokens. */
  completions: number;
  outputTokens: number;
  completedInputTokens: number;
  cachedTokens: number;
  /** Per completed request: time to first token and mean inter-token latency (TPOT), seconds. */
  ttfts: number[];
  tpots: number[];
}

/** A sample with nothing counted yet: where each interval's traffic starts. */
export function emptyTrafficSample(): TrafficSample {
  return {
    arrivals: 0,
    inputTokens: 0,
    completions: 0,
    outputTokens: 0,
    completedInputTokens: 0,
    cachedTokens: 0,
    ttfts: [],
    tpots: [],
  };
}

export interface Sample {
  /** Sample time, seconds. */
  now: number;
  /** Seconds since the previous sample (> 0). */
  period: number;
  traffic: TrafficSample;
  pools: PoolSample[];
}

/** Latency objectives of a pool, seconds; the share of requests that must meet both. */
export interface Slo {
  ttft: number;
  itl: number;
  /** e.g. 0.95. */
  attainment: number;
}

export interface PoolDecision {
  pool: string;
  role: PoolRole;
  desired: number;
  /** One line: the figures the count came from. */
  reason: string;
}

export interface AutoscalePolicy {
  readonly name: string;
  /** Seconds between decisions. */
  readonly interval: number;
  observe(s: Sample): void;
  /** Each pool's desired count at `now`, from the samples seen so far; `pools` as of the last sample. */
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[];
}

/** Replica bounds every policy is clamped to (the Deployment's or HPA's min/max). */
export interface Bounds {
  min: number;
  max: number;
}

export function clamp(n: number, b: Bounds): number {
  return Math.max(b.min, Math.min(b.max, n));
}

/** The samples of the last `seconds` (newest last), from a history kept newest last. */
export function lastWindow<T extends { now: number }>(
  history: readonly T[],
  now: number,
  seconds: number,
): T[] {
  const out: T[] = [];
  for (let i = history.length - 1; i >= 0 && history[i].now > now - seconds + 1e-9; i--) out.push(history[i]);
  return out.reverse();
}

/** Drops samples older than `keep` seconds (in place). */
export function trim<T extends { now: number }>(history: T[], now: number, keep: number): void {
  let k = 0;
  while (k < history.length && history[k].now < now - keep) k++;
  if (k > 0) history.splice(0, k);
}
