/**
 * Seeded random variates for workload generation: uniform, exponential, normal, gamma and clipped
 * length distributions, plus sub-seed derivation so each part of a workload (texts, lengths,
 * arrivals) has its own stream and changing one option does not reshuffle the others.
 */
import { mixSeed } from "../../engine/output-tokens.ts";
import { createRng, type Rng } from "../../scheduler/rng.ts";

export type { Rng };

/** FNV-1a of a stream name, mixed with the workload seed. */
export function subSeed(seed: number, stream: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < stream.length; i++) {
    h ^= stream.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return mixSeed(seed >>> 0, h >>> 0);
}

/** A generator for one named stream of a seeded workload. */
export function streamRng(seed: number, stream: string): Rng {
  return createRng(subSeed(seed, stream));
}

/** Uniform in (0, 1]: safe under log. */
function openUnit(rng: Rng): number {
  return 1 - rng.next();
}

export function exponential(rng: Rng, rate: number): number {
  return -Math.log(openUnit(rng)) / rate;
}

/** Standard normal by Box-Muller (one value per call; the second is discarded for simplicity). */
export function standardNormal(rng: Rng): number {
  const u = openUnit(rng);
  const v = rng.next();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

/**
 * Gamma(shape, scale) by Marsaglia and Tsang (2000); shape < 1 uses the boost
 * Gamma(k) = Gamma(k + 1) · U^(1/k).
 */
export function gamma(rng: Rng, shape: number, scale: number): number {
  if (!(shape > 0) || !(scale > 0)) throw new RangeError(`gamma: shape and scale must be > 0`);
  if (shape < 1) return gamma(rng, shape + 1, scale) * openUnit(rng) ** (1 / shape);
  const d = shape - 1 / 3;
  const c = 1 / Math.sqrt(9 * d);
  for (;;) {
    let x: number;
    let v: number;
    do {
      x = standardNormal(rng);
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const u = openUnit(rng);
    if (u < 1 - 0.0331 * x ** 4) return d * v * scale;
    if (Math.log(u) < 0.5 * x * x + d * (1 - v + Math.log(v))) return d * v * scale;
  }
}

/** A token-length distribution: a fixed number, or a normal clipped to [min, max] and rounded. */
export type LengthDist = number | { mean: number; std?: number; min?: number; max?: number };

export function checkLength(name: string, d: LengthDist, allowZero = false): void {
  const ok = (x: number) => Number.isFinite(x) && (allowZero ? x >= 0 : x >= 1);
  if (typeof d === "number") {
    if (!ok(d) || !Number.isInteger(d)) throw new RangeError(`${name}: must be an integer ≥ ${+!allowZero}`);
    return;
  }
  if (!ok(d.mean)) throw new RangeError(`${name}.mean: must be ≥ ${+!allowZero}`);
  if (d.std !== undefined && !(d.std >= 0)) throw new RangeError(`${name}.std: must be ≥ 0`);
  if (d.min !== undefined && d.max !== undefined && d.min > d.max)
    throw new RangeError(`${name}: min must be ≤ max`);
}

export function sampleLength(rng: Rng, d: LengthDist): number {
  if (typeof d === "number") return d;
  const lo = Math.max(1, d.min ?? 1);
  const hi = d.max ?? Number.POSITIVE_INFINITY;
  const x = d.std ? d.mean + d.std * standardNormal(rng) : d.mean;
  return Math.round(Math.min(hi, Math.max(lo, x)));
}

/** Fisher-Yates permutation of 0..n-1. */
export function permutation(rng: Rng, n: number): number[] {
  const a = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  return a;
}
