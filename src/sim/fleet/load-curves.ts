/**
 * Load over time for autoscaling scenarios, as arrival stages (src/bench/workloads/arrivals.ts):
 * a curve is cut into `step`-second stages, each at the curve's rate at its middle, so the
 * existing Poisson stage machinery generates the requests.
 *   diurnal — trough → peak → trough as (1 − cos)/2 over `period`, repeated over `duration`;
 *   flash   — `base`, then `peak` from `at` for `length` seconds (reached over `rise`), then `base`;
 *   ramp    — linear from `from` to `to` over `duration`.
 */
import type { StageSpec } from "../../bench/workloads/arrivals.ts";

export type LoadCurve =
  | { type: "diurnal"; duration: number; trough: number; peak: number; period?: number; step?: number }
  | {
      type: "flash";
      duration: number;
      base: number;
      peak: number;
      at: number;
      length: number;
      rise?: number;
      step?: number;
    }
  | { type: "ramp"; duration: number; from: number; to: number; step?: number };

/** The curve's rate (requests/s) at time t. */
export function curveRate(c: LoadCurve, t: number): number {
  switch (c.type) {
    case "diurnal": {
      const period = c.period ?? c.duration;
      return c.trough + ((c.peak - c.trough) * (1 - Math.cos((2 * Math.PI * t) / period))) / 2;
    }
    case "flash": {
      const rise = c.rise ?? 0;
      if (t < c.at || t >= c.at + c.length) return c.base;
      if (rise > 0 && t < c.at + rise) return c.base + ((c.peak - c.base) * (t - c.at)) / rise;
      return c.peak;
    }
    case "ramp":
      return c.from + (c.to - c.from) * Math.min(1, Math.max(0, t / c.duration));
  }
}

/** The curve as arrival stages of `step` seconds (default 10). */
export function curveStages(c: LoadCurve): StageSpec[] {
  const step = c.step ?? 10;
  if (!(step > 0) || !(c.duration > 0)) throw new RangeError("a load curve needs duration > 0 and step > 0");
  const out: StageSpec[] = [];
  for (let t = 0; t < c.duration - 1e-9; t += step) {
    const d = Math.min(step, c.duration - t);
    out.push({ rate: Math.max(1e-3, curveRate(c, t + d / 2)), duration: d });
  }
  return out;
}
