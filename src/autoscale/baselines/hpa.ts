/**
 * Baseline: the Kubernetes HorizontalPodAutoscaler on GPU utilisation (DCGM_FI_DEV_GPU_UTIL through
 * a metrics adapter), with the HPA's documented algorithm and defaults (kubernetes.io, "Horizontal
 * Pod Autoscaling"; k8s.io/kubernetes pkg/controller/podautoscaler): every 15 s (the controller's
 * --horizontal-pod-autoscaler-sync-period),
 *   desired = ⌈current × currentMetric / target⌉, skipped while |ratio − 1| ≤ 0.1 (the tolerance);
 *   scale-down stabilisation 300 s (the highest recommendation of the last 5 minutes wins);
 *   scale-up at most max(4 pods, 100%) per 15 s (the default scale-up policies).
 * The target (80%) is the user's choice; HPA has none for a GPU metric, and 80% is what
 * `kubectl autoscale` sets for CPU when none is given.
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

export const HPA_DEFAULTS = {
  interval: 15,
  target: 0.8,
  tolerance: 0.1,
  downStabilization: 300,
  upPods: 4,
  upPercent: 100,
} as const;
export type HpaConfig = typeof HPA_DEFAULTS;

/** The HPA's replica formula with its tolerance. */
export function hpaDesired(
  current: number,
  metric: number,
  target: number,
  tolerance = HPA_DEFAULTS.tolerance,
): number {
  const ratio = metric / target;
  if (Math.abs(ratio - 1) <= tolerance) return current;
  return Math.ceil(current * ratio);
}

export class HpaGpuPolicy implements AutoscalePolicy {
  readonly name = "hpa-gpu";
  readonly interval: number;
  readonly #history: Sample[] = [];
  readonly #recs = new Map<string, { now: number; n: number }[]>();
  constructor(
    readonly bounds: ReadonlyMap<string, Bounds>,
    readonly cfg: HpaConfig = HPA_DEFAULTS,
  ) {
    this.interval = cfg.interval;
  }
  observe(s: Sample): void {
    this.#history.push(s);
    trim(this.#history, s.now, this.cfg.interval + 1);
  }
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    const w = lastWindow(this.#history, now, this.cfg.interval);
    return pools.map((ps) => {
      let busy = 0;
      let n = 0;
      for (const s of w)
        for (const r of s.pools.find((x) => x.name === ps.name)?.replicas ?? []) {
          busy += r.busy * s.period;
          n += s.period;
        }
      const util = n > 0 ? busy / n : 0;
      const b = this.bounds.get(ps.name) ?? { min: 1, max: Number.POSITIVE_INFINITY };
      const current = Math.max(1, ps.target);
      let rec = clamp(hpaDesired(current, util, this.cfg.target, this.cfg.tolerance), b);
      const recs = this.#recs.get(ps.name) ?? [];
      recs.push({ now, n: rec });
      while (recs.length && recs[0].now <= now - this.cfg.downStabilization) recs.shift();
      this.#recs.set(ps.name, recs);
      let why = `GPU util ${(util * 100).toFixed(1)}% vs target ${this.cfg.target * 100}% on ${current}`;
      if (rec < current) {
        const hi = Math.max(...recs.map((r) => r.n));
        if (hi > rec)
          why += `; stabilised at ${Math.min(hi, current)} (highest of the last ${this.cfg.downStabilization}s)`;
        rec = Math.min(current, hi);
      } else if (rec > current) {
        const cap = Math.max(current + this.cfg.upPods, Math.ceil(current * (1 + this.cfg.upPercent / 100)));
        rec = Math.min(rec, cap);
      }
      return { pool: ps.name, role: ps.role, desired: rec, reason: why };
    });
  }
}
