/**
 * What one replica can sustain, from the engine profile's step-time model (src/engine/profile.ts),
 * under a pool's latency objectives. Steady state at arrival rate λ with mean prompt I (a share h of
 * it prefix-cached) and mean output O, for a replica that runs mixed steps (vLLM V1, chunked
 * prefill): each step of length T decodes B = λ·O·T sequences (Little's law over the O steps a
 * request decodes for) at a mean context of I + O/2, and prefills P = λ·T·I·(1−h) new tokens. T is
 * the fixed point of T = stepTime(B, P); it exists while the step can keep up, and is found by
 * iteration from the empty-step time.
 *
 * A replica serves λ when the fixed point exists with B ≤ max_num_seqs, P ≤ max_num_batched_tokens
 * and B·(I + O) ≤ its KV tokens, the step (the inter-token latency) is within the ITL objective, and
 * a new request's prefill — ⌈I(1−h) / (max_num_batched_tokens − B)⌉ steps — is within the TTFT
 * objective. The saturation rate is the largest such λ; the recommender plans for a share of it
 * (`utilization`), because queueing delay grows without bound as λ approaches saturation.
 */
import { type BatchShape, type Profile, stepTime } from "../engine/profile.ts";

export interface EngineLimits {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** KV capacity of one replica, tokens. */
  kvTokens: number;
}

export interface LoadShape {
  /** Mean prompt tokens per request. */
  inputTokens: number;
  /** Mean output tokens per request. */
  outputTokens: number;
  /** Share of prompt tokens served from the prefix cache, 0–1. */
  hitRate: number;
}

export interface SteadyState {
  /** Whether the step keeps up with λ within the engine's limits. */
  feasible: boolean;
  /** Step time, seconds. */
  step: number;
  /** Decoding sequences per step. */
  batch: number;
  /** New prompt tokens per step. */
  prefillPerStep: number;
  /** Estimated TTFT without queueing: the steps a new prompt's prefill takes. */
  ttft: number;
}

function shape(batch: number, prefill: number, context: number, cachedContext: number): BatchShape {
  const n = Math.max(0, Math.round(batch));
  return {
    prefills: prefill > 0 ? [{ tokens: prefill, context: cachedContext }] : [],
    decodeContexts: new Array<number>(n).fill(context),
  };
}

/** The steady state of an aggregated (or decode-only when `prefill` is false) replica at rate λ. */
export function steadyState(
  p: Profile,
  lim: EngineLimits,
  load: LoadShape,
  lambda: number,
  prefill = true,
): SteadyState {
  const uncached = load.inputTokens * (1 - load.hitRate);
  const ctx = load.inputTokens + load.outputTokens / 2;
  let t = Math.max(stepTime(p, shape(1, 0, ctx, 0)).total, 1e-4);
  let batch = 0;
  let pf = 0;
  for (let k = 0; k < 200; k++) {
    batch = lambda * load.outputTokens * t;
    pf = prefill ? lambda * t * uncached : 0;
    if (batch > lim.maxNumSeqs || pf > lim.maxNumBatchedTokens || t > 60) break;
    const next = stepTime(p, shape(batch, pf, ctx, load.inputTokens - uncached)).total;
    if (Math.abs(next - t) < 1e-7) {
      t = next;
      break;
    }
    t = next;
  }
  batch = lambda * load.outputTokens * t;
  pf = prefill ? lambda * t * uncached : 0;
  const kv = batch * (load.inputTokens + load.outputTokens);
  const budget = lim.maxNumBatchedTokens - batch;
  const feasible =
    batch <= lim.maxNumSeqs && pf <= lim.maxNumBatchedTokens && kv <= lim.kvTokens && budget > 0 && t <= 60;
  const ttft = prefill && budget > 0 ? Math.max(1, Math.ceil(uncached / budget)) * t : t;
  return { feasible, step: t, batch, prefillPerStep: pf, ttft };
}

/** Largest λ (requests/s) for which `ok` holds, by bisection over (0, hi]. */
function largest(ok: (lambda: number) => boolean, hi = 1e4): number {
  let lo = 0;
  if (!ok(1e-6)) return 0;
  while (hi - lo > Math.max(1e-4, lo * 1e-4)) {
    const mid = (lo + hi) / 2;
    if (ok(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/**
 * Requests/s one aggregated replica sustains within the objectives: the largest λ whose steady
 * state is feasible with step ≤ ITL and prefill ≤ TTFT.
 */
export function aggregatedCapacity(
  p: Profile,
  lim: EngineLimits,
  load: LoadShape,
  slo: { ttft: number; itl: number },
): number {
  return largest((l) => {
    const s = steadyState(p, lim, load, l, true);
    return s.feasible && s.step <= slo.itl && s.ttft <= slo.ttft;
  });
}

/** Requests/s one decode replica sustains (decode only; KV and the ITL objective bind). */
export function decodeCapacity(p: Profile, lim: EngineLimits, load: LoadShape, itl: number): number {
  return largest((l) => {
    const s = steadyState(p, lim, load, l, false);
    return s.feasible && s.step <= itl;
  });
}

/**
 * Prefill tokens/s of one replica running full chunks (max_num_batched_tokens per step) at the
 * load's cached context — the throughput a prefill pool is sized by.
 */
export function prefillThroughput(p: Profile, lim: EngineLimits, load: LoadShape): number {
  const chunk = Math.min(lim.maxNumBatchedTokens, Math.max(1, load.inputTokens));
  const t = stepTime(p, shape(0, chunk, 0, load.inputTokens * load.hitRate)).total;
  return chunk / t;
}

/** Requests/s one prefill replica sustains (its token throughput over the uncached prompt). */
export function prefillCapacity(p: Profile, lim: EngineLimits, load: LoadShape, ttft: number): number {
  const uncached = Math.max(1, load.inputTokens * (1 - load.hitRate));
  const r = prefillThroughput(p, lim, load);
  // One prompt alone must prefill within the TTFT objective, or no replica count meets it.
  if (uncached / r > ttft) return 0;
  return r / uncached;
}

/** Decode tokens/s of one replica at the largest batch whose step stays within `itl` (Dynamo's thpt_per_gpu_decode × TP). */
export function decodeThroughputAtItl(p: Profile, lim: EngineLimits, load: LoadShape, itl: number): number {
  const ctx = load.inputTokens + load.outputTokens / 2;
  const maxByKv = Math.floor(lim.kvTokens / Math.max(1, load.inputTokens + load.outputTokens));
  let best = 0;
  let lo = 1;
  let hi = Math.max(1, Math.min(lim.maxNumSeqs, maxByKv));
  if (stepTime(p, shape(1, 0, ctx, 0)).total > itl) return 0;
  while (lo <= hi) {
    const b = (lo + hi) >> 1;
    if (stepTime(p, shape(b, 0, ctx, 0)).total <= itl) {
      best = b;
      lo = b + 1;
    } else hi = b - 1;
  }
  return best / stepTime(p, shape(best, 0, ctx, 0)).total;
}
