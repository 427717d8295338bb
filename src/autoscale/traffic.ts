/**
 * Rolling traffic statistics over a policy's sample history: arrival rate over a window, a linear
 * trend of the rate (least squares over the window's samples) projected forward, the load's shape
 * (mean prompt and output tokens, prefix-hit rate) and the share of completed requests that met
 * the objectives. Pure: samples in, numbers out.
 */
import type { LoadShape } from "./capacity.ts";
import { lastWindow, type Sample, type Slo } from "./types.ts";

/** Arrivals per second over the samples of the last `seconds` (0 with none). */
export function arrivalRate(history: readonly Sample[], now: number, seconds: number): number {
  const w = lastWindow(history, now, seconds);
  let n = 0;
  let t = 0;
  for (const s of w) {
    n += s.traffic.arrivals;
    t += s.period;
  }
  return t > 0 ? n / t : 0;
}

/**
 * The arrival rate the least-squares line through the window's per-sample rates gives at
 * `now + ahead` (never below 0), and its slope per second.
 */
export function forecastRate(
  history: readonly Sample[],
  now: number,
  seconds: number,
  ahead: number,
): { rate: number; slope: number } {
  const w = lastWindow(history, now, seconds);
  if (w.length < 3) return { rate: arrivalRate(history, now, seconds), slope: 0 };
  let sx = 0;
  let sy = 0;
  let sw = 0;
  for (const s of w) {
    const y = s.traffic.arrivals / s.period;
    sx += s.now * s.period;
    sy += y * s.period;
    sw += s.period;
  }
  const mx = sx / sw;
  const my = sy / sw;
  let num = 0;
  let den = 0;
  for (const s of w) {
    const y = s.traffic.arrivals / s.period;
    num += s.period * (s.now - mx) * (y - my);
    den += s.period * (s.now - mx) ** 2;
  }
  const slope = den > 0 ? num / den : 0;
  return { rate: Math.max(0, my + slope * (now + ahead - mx)), slope };
}

/** Mean prompt and output tokens and prefix-hit rate of the window's completions (else `fallback`). */
export function loadShape(
  history: readonly Sample[],
  now: number,
  seconds: number,
  fallback: LoadShape,
): LoadShape {
  const w = lastWindow(history, now, seconds);
  let done = 0;
  let out = 0;
  let inp = 0;
  let cached = 0;
  let arrivals = 0;
  let arrivedIn = 0;
  for (const s of w) {
    done += s.traffic.completions;
    out += s.traffic.outputTokens;
    inp += s.traffic.completedInputTokens;
    cached += s.traffic.cachedTokens;
    arrivals += s.traffic.arrivals;
    arrivedIn += s.traffic.inputTokens;
  }
  if (done === 0) return arrivals > 0 ? { ...fallback, inputTokens: arrivedIn / arrivals } : { ...fallback };
  return {
    inputTokens: inp / done,
    outputTokens: Math.max(1, out / done),
    hitRate: inp > 0 ? Math.min(1, cached / inp) : 0,
  };
}

/** Share of the window's completed requests within both objectives (null with none completed). */
export function attainment(
  history: readonly Sample[],
  now: number,
  seconds: number,
  slo: Slo,
): number | null {
  let n = 0;
  let good = 0;
  for (const s of lastWindow(history, now, seconds)) {
    const { ttfts, tpots } = s.traffic;
    for (let i = 0; i < ttfts.length; i++) {
      n++;
      if (ttfts[i] <= slo.ttft && tpots[i] <= slo.itl) good++;
    }
  }
  return n > 0 ? good / n : null;
}
