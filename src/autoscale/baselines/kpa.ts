/**
 * Baseline: Knative's KPA concurrency rule (knative/serving pkg/autoscaler/scaling/autoscaler.go;
 * defaults from config/core/configmaps/autoscaler.yaml), as KServe serverless and AIBrix's KPA use
 * it, on a pool's in-flight requests (running + waiting per replica). Every 2 s (tick-interval):
 *   target per replica = container-concurrency-target-default 100 × target-utilization 70% = 70;
 *   stable = mean concurrency over the stable window (60 s), panic = over the panic window (10% = 6 s);
 *   desired (stable) = ⌈stable / target⌉, desired (panic) = ⌈panic / target⌉;
 *   enter panic when panic / target ≥ 2 × ready replicas (panic-threshold 200%); while panicking
 *   the count never goes down and is max(stable, panic, the panic high-water mark); leave panic
 *   after a stable window without crossing the threshold;
 *   at most × 1000 up (max-scale-up-rate) and ÷ 2 down (max-scale-down-rate) per decision.
 */
import {
  type AutoscalePolicy,
  type Bounds,
  clamp,
  lastWindow,
  type PoolDecision,
  type PoolSample,
  type Sample,
  trim,
} from "../types.ts";

export const KPA_DEFAULTS = {
  interval: 2,
  containerConcurrency: 100,
  targetUtilization: 0.7,
  stableWindow: 60,
  panicWindowPercentage: 10,
  panicThreshold: 2,
  maxScaleUpRate: 1000,
  maxScaleDownRate: 2,
} as const;
export type KpaConfig = typeof KPA_DEFAULTS;

interface PanicState {
  since: number | null;
  high: number;
}

/** Knative's decision from the window averages (pure; `state` carries panic mode between calls). */
export function kpaDesired(
  stable: number,
  panic: number,
  ready: number,
  now: number,
  state: PanicState,
  cfg: KpaConfig = KPA_DEFAULTS,
): { desired: number; panicking: boolean } {
  const target = cfg.containerConcurrency * cfg.targetUtilization;
  const readyN = Math.max(1, ready);
  const maxUp = Math.ceil(cfg.maxScaleUpRate * readyN);
  const maxDown = Math.floor(readyN / cfg.maxScaleDownRate);
  const dspc = Math.min(maxUp, Math.max(maxDown, Math.ceil(stable / target)));
  const dppc = Math.min(maxUp, Math.max(maxDown, Math.ceil(panic / target)));
  const over = panic / target / readyN >= cfg.panicThreshold;
  if (over) {
    if (state.since === null) state.high = 0;
    state.since = now;
  } else if (state.since !== null && now - state.since >= cfg.stableWindow) {
    state.since = null;
    state.high = 0;
  }
  if (state.since !== null) {
    state.high = Math.max(state.high, dspc, dppc);
    return { desired: state.high, panicking: true };
  }
  return { desired: dspc, panicking: false };
}

export class KpaPolicy implements AutoscalePolicy {
  readonly name = "kpa";
  readonly interval: number;
  readonly #history: Sample[] = [];
  readonly #panic = new Map<string, PanicState>();
  constructor(
    readonly bounds: ReadonlyMap<string, Bounds>,
    readonly cfg: KpaConfig = KPA_DEFAULTS,
  ) {
    this.interval = cfg.interval;
  }
  observe(s: Sample): void {
    this.#history.push(s);
    trim(this.#history, s.now, this.cfg.stableWindow + 1);
  }
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    const avg = (seconds: number, name: string) => {
      let sum = 0;
      let t = 0;
      for (const s of lastWindow(this.#history, now, seconds)) {
        const p = s.pools.find((x) => x.name === name);
        const c = p?.replicas.reduce((n, r) => n + r.running + r.waiting, 0) ?? 0;
        sum += c * s.period;
        t += s.period;
      }
      return t > 0 ? sum / t : 0;
    };
    return pools.map((ps) => {
      const state = this.#panic.get(ps.name) ?? { since: null, high: 0 };
      this.#panic.set(ps.name, state);
      const stable = avg(this.cfg.stableWindow, ps.name);
      const panic = avg((this.cfg.stableWindow * this.cfg.panicWindowPercentage) / 100, ps.name);
      const d = kpaDesired(stable, panic, ps.ready, now, state, this.cfg);
      const b = this.bounds.get(ps.name) ?? { min: 1, max: Number.POSITIVE_INFINITY };
      return {
        pool: ps.name,
        role: ps.role,
        desired: clamp(d.desired, b),
        reason: `concurrency stable ${stable.toFixed(1)} panic ${panic.toFixed(1)} vs ${this.cfg.containerConcurrency * this.cfg.targetUtilization}/replica${d.panicking ? " (panic)" : ""}`,
      };
    });
  }
}
