/**
 * kvgate's recommender: sizes each pool from what was promised (the TTFT and ITL objectives), the
 * load the gateway sees, and the engine profile's throughput (capacity.ts), instead of from a
 * utilisation gauge. Each decision:
 *
 *  1. Load: the arrival rate over the last `shortWindow` and `longWindow` seconds; the prompt and
 *     output lengths and prefix-hit rate of recent completions; the rate's linear trend projected
 *     to `startupDelay + interval` ahead, when a replica asked for now starts serving.
 *  2. Per-replica capacity at the objectives, from the profile: an aggregated replica's mixed-step
 *     steady state; a prefill replica's chunked-prefill token throughput over the uncached prompt;
 *     a decode replica's decode-only steady state (ITL and KV bind). Planned at `utilization` of it.
 *  3. Up: ⌈max(short-window rate, forecast) + queued requests drained over `drainSeconds`⌉ ÷
 *     capacity — at once, no cooldown, so a spike is answered in the interval that sees it. When
 *     the window's requests miss the attainment goal with requests queued and nothing starting, one
 *     more replica than the model says (the model was optimistic; the queue is the evidence).
 *  4. Down: only when the long-window rate and the forecast fit fewer replicas with `hysteresis`
 *     to spare, continuously for `scaleDownDelay` seconds — noise around a threshold never flaps.
 */
import type { Profile } from "../engine/profile.ts";
import {
  aggregatedCapacity,
  decodeCapacity,
  type EngineLimits,
  type LoadShape,
  prefillCapacity,
} from "./capacity.ts";
import { arrivalRate, attainment, forecastRate, loadShape } from "./traffic.ts";
import {
  type AutoscalePolicy,
  type Bounds,
  clamp,
  type PoolDecision,
  type PoolRole,
  type PoolSample,
  type Sample,
  type Slo,
  trim,
} from "./types.ts";

export interface PoolSpec {
  name: string;
  role: PoolRole;
  profile: Profile;
  limits: EngineLimits;
  bounds: Bounds;
}

export interface RecommenderConfig {
  pools: PoolSpec[];
  slo: Slo;
  /** Seconds from asking for a replica to it serving (model load); the forecast's horizon. */
  startupDelay: number;
  /** Seconds between decisions (default 15). */
  interval?: number;
  /** Share of the modelled capacity to plan for (default 0.8). */
  utilization?: number;
  /** Scale down only when the load fits with this share to spare (default 0.1). */
  hysteresis?: number;
  /** Seconds a smaller count must be justified before scaling down (default 180). */
  scaleDownDelay?: number;
  shortWindow?: number;
  longWindow?: number;
  /** Seconds over which queued requests are to be drained (default startupDelay). */
  drainSeconds?: number;
  /** The load shape before any request has completed. */
  initialLoad?: LoadShape;
}

export const RECOMMENDER_DEFAULTS = {
  interval: 15,
  utilization: 0.8,
  hysteresis: 0.1,
  scaleDownDelay: 180,
  shortWindow: 30,
  longWindow: 300,
} as const;

/** Requests/s one replica of the pool sustains within the objectives, for this load. */
export function poolCapacity(pool: PoolSpec, load: LoadShape, slo: Slo): number {
  if (pool.role === "prefill") return prefillCapacity(pool.profile, pool.limits, load, slo.ttft);
  if (pool.role === "decode") return decodeCapacity(pool.profile, pool.limits, load, slo.itl);
  return aggregatedCapacity(pool.profile, pool.limits, load, slo);
}

export class Recommender implements AutoscalePolicy {
  readonly name = "kvgate";
  readonly interval: number;
  readonly #c: Required<Omit<RecommenderConfig, "initialLoad" | "drainSeconds">> & {
    drainSeconds: number;
    initialLoad: LoadShape;
  };
  readonly #history: Sample[] = [];
  /** Per pool: since when a smaller count has been justified. */
  readonly #downSince = new Map<string, number>();

  constructor(cfg: RecommenderConfig) {
    this.#c = {
      ...RECOMMENDER_DEFAULTS,
      ...cfg,
      drainSeconds: cfg.drainSeconds ?? Math.max(cfg.startupDelay, 30),
      initialLoad: cfg.initialLoad ?? { inputTokens: 1000, outputTokens: 200, hitRate: 0 },
    };
    this.interval = this.#c.interval;
    if (!(this.#c.utilization > 0 && this.#c.utilization <= 1))
      throw new RangeError(`utilization must be in (0, 1], got ${this.#c.utilization}`);
  }

  observe(s: Sample): void {
    this.#history.push(s);
    trim(this.#history, s.now, Math.max(this.#c.longWindow, 60) + 1);
  }

  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    const c = this.#c;
    const h = this.#history;
    const load = loadShape(h, now, c.longWindow, c.initialLoad);
    const short = arrivalRate(h, now, c.shortWindow);
    const long = arrivalRate(h, now, c.longWindow);
    const fc = forecastRate(h, now, c.longWindow, c.startupDelay + c.interval);
    const att = attainment(h, now, 60, c.slo);
    return pools.map((ps) => {
      const spec = c.pools.find((p) => p.name === ps.name);
      if (spec === undefined) throw new Error(`recommender: unknown pool ${ps.name}`);
      const cap = poolCapacity(spec, load, c.slo) * c.utilization;
      const queued = ps.replicas.reduce((n, r) => n + r.waiting, 0);
      const demandUp = Math.max(short, fc.rate) + queued / c.drainSeconds;
      const demandDown = Math.max(short, long, fc.rate) + queued / c.drainSeconds;
      const shape = `in ${load.inputTokens.toFixed(0)} out ${load.outputTokens.toFixed(0)} hit ${(load.hitRate * 100).toFixed(0)}%`;
      if (!(cap > 0))
        return {
          pool: ps.name,
          role: ps.role,
          desired: spec.bounds.max,
          reason: `no replica meets the objectives for ${shape} (TTFT ${c.slo.ttft}s, ITL ${c.slo.itl}s): asking for the maximum`,
        };
      let up = Math.ceil(demandUp / cap - 1e-9);
      let why = `${demandUp.toFixed(2)} req/s (30s ${short.toFixed(2)}, forecast ${fc.rate.toFixed(2)} at +${c.startupDelay + c.interval}s, queued ${queued}) ÷ ${cap.toFixed(2)} req/s per replica (${(c.utilization * 100).toFixed(0)}% of modelled, ${shape})`;
      if (att !== null && att < c.slo.attainment && queued > 0 && ps.starting === 0 && up <= ps.target) {
        up = ps.target + 1;
        why += `; attainment ${(att * 100).toFixed(1)}% < ${(c.slo.attainment * 100).toFixed(0)}% with ${queued} queued: +1`;
      }
      up = clamp(up, spec.bounds);
      if (up > ps.target) {
        this.#downSince.delete(ps.name);
        return { pool: ps.name, role: ps.role, desired: up, reason: `up: ${why}` };
      }
      const down = clamp(Math.ceil(demandDown / (cap * (1 - c.hysteresis)) - 1e-9), spec.bounds);
      if (down < ps.target) {
        const since = this.#downSince.get(ps.name) ?? now;
        this.#downSince.set(ps.name, since);
        if (now - since >= c.scaleDownDelay) {
          this.#downSince.delete(ps.name);
          return {
            pool: ps.name,
            role: ps.role,
            desired: down,
            reason: `down: ${why}; fits ${down} with ${c.hysteresis * 100}% to spare for ${now - since}s`,
          };
        }
        return {
          pool: ps.name,
          role: ps.role,
          desired: ps.target,
          reason: `hold: ${down} would do, for ${now - since}s of the ${c.scaleDownDelay}s needed; ${why}`,
        };
      }
      this.#downSince.delete(ps.name);
      return { pool: ps.name, role: ps.role, desired: ps.target, reason: `hold: ${why}` };
    });
  }
}
