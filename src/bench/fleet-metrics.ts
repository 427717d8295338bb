/**
 * The fleet's own view of a benchmark run, from the replicas' vLLM /metrics: prefix-cache hit
 * rate as Δhits/Δqueries of vllm:prefix_cache_{hits,queries}_total between a scrape before and
 * one after the run, Δvllm:num_preemptions_total, and the spread of vllm:kv_cache_usage_perc
 * across replicas sampled during the run (after a run it reads ~0: vLLM counts evictable cached
 * blocks as free). Parsing and arithmetic are pure; `scrapeReplica` does the HTTP GET.
 */
import { type Dispatcher, request } from "undici";
import { parsePromText, samplesOf, sumOf } from "../datalayer/prom-text.ts";
import type { FleetResult } from "./results.ts";

export interface ReplicaSnapshot {
  url: string;
  ok: boolean;
  error?: string;
  hits?: number;
  queries?: number;
  preemptions?: number;
  /** Mean over the replica's engines (one per DP rank). */
  kvUsage?: number;
  /** kvgate:sim_time_scale: present only on kvgate's simulated replicas. */
  simTimeScale?: number;
  /** kvgate:sim_lag_max_seconds: how far behind its clock the simulated replica ever fell. */
  simLagMax?: number;
}

const FAMILIES = {
  hits: ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
  queries: ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"],
  preemptions: ["vllm:num_preemptions_total"],
  kv: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
};

/** The /metrics URL of a base URL ("http://h:p", "http://h:p/v1" or already ".../metrics"). */
export function metricsUrl(base: string): string {
  const b = base.replace(/\/+$/, "");
  if (b.endsWith("/metrics")) return b;
  return `${b.replace(/\/v1$/, "")}/metrics`;
}

export function snapshotFromText(url: string, text: string): ReplicaSnapshot {
  const { families } = parsePromText(text, { lenient: true });
  const firstSum = (names: string[]) => {
    for (const name of names) {
      const v = sumOf(families, name);
      if (v !== undefined) return v;
    }
    return undefined;
  };
  let kvUsage: number | undefined;
  for (const name of FAMILIES.kv) {
    const ss = samplesOf(families, name);
    if (ss.length) {
      kvUsage = ss.reduce((a, s) => a + s.value, 0) / ss.length;
      break;
    }
  }
  return {
    url,
    ok: true,
    hits: firstSum(FAMILIES.hits),
    queries: firstSum(FAMILIES.queries),
    preemptions: firstSum(FAMILIES.preemptions),
    kvUsage,
    simTimeScale: samplesOf(families, "kvgate:sim_time_scale")[0]?.value,
    simLagMax: samplesOf(families, "kvgate:sim_lag_max_seconds")[0]?.value,
  };
}

export async function scrapeReplica(
  url: string,
  dispatcher: Dispatcher,
  timeoutMs = 5000,
): Promise<ReplicaSnapshot> {
  try {
    const res = await request(url, { dispatcher, signal: AbortSignal.timeout(timeoutMs) });
    const text = await res.body.text();
    if (res.statusCode !== 200) return { url, ok: false, error: `HTTP ${res.statusCode}` };
    return snapshotFromText(url, text);
  } catch (e) {
    return { url, ok: false, error: (e as Error).message };
  }
}

/** after − before, or `after` alone when the counter went down (the replica restarted). */
function delta(before: number | undefined, after: number | undefined): number | undefined {
  if (after === undefined) return undefined;
  if (before === undefined || after < before) return after;
  return after - before;
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/**
 * Fleet figures from scrapes before and after the run and the samples taken during it (one array
 * of snapshots per sampling tick). Replicas are matched by URL.
 */
export function fleetStats(
  before: ReplicaSnapshot[],
  after: ReplicaSnapshot[],
  samples: ReplicaSnapshot[][],
  timing?: { wallSeconds: number; intervalSeconds: number },
): FleetResult {
  const urls = [...new Set([...before, ...after].map((s) => s.url))];
  const byUrl = (list: ReplicaSnapshot[], url: string) => list.find((s) => s.url === url && s.ok);
  let hits = 0;
  let queries = 0;
  let preempt = 0;
  let anyHits = false;
  let anyPreempt = false;
  const endpoints = urls.map((url) => {
    const b = byUrl(before, url);
    const a = byUrl(after, url);
    const h = delta(b?.hits, a?.hits);
    const q = delta(b?.queries, a?.queries);
    const p = delta(b?.preemptions, a?.preemptions);
    if (h !== undefined && q !== undefined) {
      hits += h;
      queries += q;
      anyHits = true;
    }
    if (p !== undefined) {
      preempt += p;
      anyPreempt = true;
    }
    const kv = samples.flatMap((tick) => {
      const s = byUrl(tick, url);
      return s?.kvUsage === undefined ? [] : [s.kvUsage];
    });
    const scrapeErrors = [...samples.flat(), ...before, ...after].filter(
      (s) => s.url === url && !s.ok,
    ).length;
    return {
      url,
      prefix_cache_hit_rate: h !== undefined && q ? h / q : null,
      preemptions: p ?? null,
      kv_usage_mean: mean(kv),
      kv_usage_max: kv.length ? Math.max(...kv) : null,
      scrape_errors: scrapeErrors,
    };
  });
  const mins: number[] = [];
  const means: number[] = [];
  const maxs: number[] = [];
  for (const tick of samples) {
    const kv = tick.flatMap((s) => (s.ok && s.kvUsage !== undefined ? [s.kvUsage] : []));
    if (!kv.length) continue;
    mins.push(Math.min(...kv));
    means.push(kv.reduce((a, b) => a + b, 0) / kv.length);
    maxs.push(Math.max(...kv));
  }
  return {
    prefix_cache_hit_rate: anyHits && queries > 0 ? hits / queries : null,
    prefix_cache_queries: anyHits ? queries : null,
    preemptions: anyPreempt ? preempt : null,
    kv_usage_min: mean(mins),
    kv_usage_mean: mean(means),
    kv_usage_max: mean(maxs),
    kv_usage_peak: maxs.length ? Math.max(...maxs) : null,
    samples: means.length,
    ...(means.length === 0 ? { kv_usage_note: noSampleReason(samples, timing) } : {}),
    ...simFields(after),
    endpoints,
  };
}

/** Why a run has no KV-usage sample, and what to do about it. */
function noSampleReason(
  samples: ReplicaSnapshot[][],
  timing: { wallSeconds: number; intervalSeconds: number } | undefined,
): string {
  const all = samples.flat();
  if (all.length === 0)
    return timing
      ? `no KV-usage sample: the run lasted ${timing.wallSeconds.toFixed(2)} wall s, less than the ` +
          `sampling interval (${timing.intervalSeconds} s): send more requests (--num-requests), or run ` +
          "the replicas at a lower --time-scale"
      : "no KV-usage sample was taken during the run";
  const failed = all.filter((s) => !s.ok);
  if (failed.length === all.length)
    return `no KV-usage sample: every scrape during the run failed (${failed[0].error}); check --metrics-endpoints`;
  return (
    "no KV-usage sample: the replicas' /metrics has no vllm:kv_cache_usage_perc (nor the legacy " +
    "vllm:gpu_cache_usage_perc); --metrics-endpoints must list vLLM replicas, not the gateway"
  );
}

/** Time scale and worst clock lag of simulated replicas, when the fleet is kvgate's simulator. */
function simFields(after: ReplicaSnapshot[]): { sim_time_scales?: number[]; sim_lag_max_s?: number } {
  const scales = [...new Set(after.flatMap((s) => (s.simTimeScale === undefined ? [] : [s.simTimeScale])))];
  const lags = after.flatMap((s) => (s.simLagMax === undefined ? [] : [s.simLagMax]));
  return {
    ...(scales.length ? { sim_time_scales: scales } : {}),
    ...(lags.length ? { sim_lag_max_s: Math.max(...lags) } : {}),
  };
}
