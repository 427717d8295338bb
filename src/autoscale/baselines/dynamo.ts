/**
 * Baseline: NVIDIA Dynamo's SLA planner (ai-dynamo/dynamo components/src/dynamo/planner: defaults.py
 * for the defaults; docs fern/pages/planner/sla-planner.md and core/throughput_scaling.py for the
 * rule). Every adjustment_interval (180 s) it measures the interval's request count, mean ISL and
 * OSL, TTFT and ITL, predicts the next interval's (here the `constant` predictor: the last value;
 * Dynamo's default is ARIMA), and sizes the pools from pre-deployment profiles — here the engine
 * profile's step-time model stands in for the profiling sweep:
 *   prefill = ⌈req/interval · ISL·(1 − kv hit rate) · min(1, c_p) / prefill tokens/s per engine⌉,
 *             c_p = observed TTFT / the profile's TTFT for that ISL;
 *   decode  = ⌈req/interval · OSL / decode tokens/s per engine at ITL target / c_d⌉,
 *             c_d = observed ITL / the profile's ITL at the observed batch;
 *   aggregated (throughput_scaling.py _throughput_agg) = ⌈req/s / best engine req/s within both SLAs⌉;
 * each at least min_endpoint (1). max_gpu_budget (8 by default) is replaced by the pool's bound.
 */
import type { Profile } from "../../engine/profile.ts";
import { stepTime } from "../../engine/profile.ts";
import {
  aggregatedCapacity,
  decodeThroughputAtItl,
  type EngineLimits,
  type LoadShape,
  prefillThroughput,
} from "../capacity.ts";
import type { PoolSpec } from "../recommender.ts";
import { loadShape } from "../traffic.ts";
import {
  type AutoscalePolicy,
  clamp,
  lastWindow,
  type PoolDecision,
  type PoolSample,
  type Sample,
  type Slo,
  trim,
} from "../types.ts";

export const DYNAMO_DEFAULTS = { interval: 180, minEndpoint: 1 } as const;

/** Dynamo's prefill count for a predicted interval. */
export function dynamoPrefill(
  reqPerS: number,
  isl: number,
  hit: number,
  cP: number,
  tokPerS: number,
  min = 1,
): number {
  return Math.max(min, Math.ceil((reqPerS * isl * (1 - hit) * Math.min(1, cP)) / tokPerS - 1e-9));
}
/** Dynamo's decode count for a predicted interval (tokPerS: decode throughput at the corrected ITL). */
export function dynamoDecode(reqPerS: number, osl: number, tokPerS: number, min = 1): number {
  return tokPerS > 0 ? Math.max(min, Math.ceil((reqPerS * osl) / tokPerS - 1e-9)) : Number.POSITIVE_INFINITY;
}

/** The profile's TTFT for one prompt of `isl` uncached tokens alone (its prefill chunks). */
function expectedTtft(p: Profile, lim: EngineLimits, isl: number): number {
  let t = 0;
  for (let done = 0; done < isl; done += lim.maxNumBatchedTokens) {
    const n = Math.min(lim.maxNumBatchedTokens, isl - done);
    t += stepTime(p, { prefills: [{ tokens: n, context: done }], decodeContexts: [] }).total;
  }
  return t;
}

export class DynamoPolicy implements AutoscalePolicy {
  readonly name = "dynamo";
  readonly interval: number;
  readonly #history: Sample[] = [];
  constructor(
    readonly pools: readonly PoolSpec[],
    readonly slo: Slo,
    interval: number = DYNAMO_DEFAULTS.interval,
  ) {
    this.interval = interval;
  }
  observe(s: Sample): void {
    this.#history.push(s);
    trim(this.#history, s.now, this.interval + 1);
  }
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    const w = lastWindow(this.#history, now, this.interval);
    let req = 0;
    let t = 0;
    const ttfts: number[] = [];
    const tpots: number[] = [];
    for (const s of w) {
      req += s.traffic.arrivals;
      t += s.period;
      ttfts.push(...s.traffic.ttfts);
      tpots.push(...s.traffic.tpots);
    }
    const rps = t > 0 ? req / t : 0;
    const fallback: LoadShape = { inputTokens: 3000, outputTokens: 150, hitRate: 0 };
    const load = loadShape(this.#history, now, this.interval, fallback);
    const mean = (a: number[]) => (a.length ? a.reduce((x, y) => x + y, 0) / a.length : null);
    const ttft = mean(ttfts);
    const itl = mean(tpots);
    return pools.map((ps) => {
      const spec = this.pools.find((p) => p.name === ps.name);
      if (spec === undefined) throw new Error(`dynamo: unknown pool ${ps.name}`);
      const { profile: p, limits: lim } = spec;
      let desired: number;
      let why: string;
      if (ps.role === "prefill") {
        const isl = load.inputTokens * (1 - load.hitRate);
        const cP = ttft !== null ? ttft / expectedTtft(p, lim, Math.max(1, isl)) : 1;
        const thpt = prefillThroughput(p, lim, load);
        desired = dynamoPrefill(rps, load.inputTokens, load.hitRate, cP, thpt);
        why = `${rps.toFixed(2)} req/s × ISL ${load.inputTokens.toFixed(0)} (hit ${(load.hitRate * 100).toFixed(0)}%) × min(1, c_p ${cP.toFixed(2)}) ÷ ${thpt.toFixed(0)} tok/s`;
      } else if (ps.role === "decode") {
        const batch = ps.replicas.length
          ? ps.replicas.reduce((n, r) => n + r.running, 0) / ps.replicas.length
          : 1;
        const ctx = load.inputTokens + load.outputTokens / 2;
        const expItl = stepTime(p, {
          prefills: [],
          decodeContexts: new Array(Math.max(1, Math.round(batch))).fill(ctx),
        }).total;
        const cD = itl !== null ? Math.max(1e-3, itl / expItl) : 1;
        const thpt = decodeThroughputAtItl(p, lim, load, this.slo.itl / cD);
        desired = dynamoDecode(rps, load.outputTokens, thpt);
        why = `${rps.toFixed(2)} req/s × OSL ${load.outputTokens.toFixed(0)} ÷ ${thpt.toFixed(0)} tok/s at ITL ${((this.slo.itl / cD) * 1000).toFixed(1)} ms (c_d ${cD.toFixed(2)})`;
      } else {
        const cap = aggregatedCapacity(p, lim, load, this.slo);
        desired =
          cap > 0 ? Math.max(DYNAMO_DEFAULTS.minEndpoint, Math.ceil(rps / cap - 1e-9)) : spec.bounds.max;
        why = `${rps.toFixed(2)} req/s ÷ ${cap.toFixed(2)} req/s per engine within TTFT ${this.slo.ttft}s and ITL ${this.slo.itl}s`;
      }
      return {
        pool: ps.name,
        role: ps.role,
        desired: clamp(Number.isFinite(desired) ? desired : spec.bounds.max, spec.bounds),
        reason: why,
      };
    });
  }
}
