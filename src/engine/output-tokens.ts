/**
 * Deterministic stand-in for sampling: output token ids and natural output lengths drawn from a
 * seeded generator, so the same seed and request give the same text on every run and replica.
 */

/** splitmix32-style mixing of two 32-bit values into a seed. */
export function mixSeed(a: number, b: number): number {
  let h = (a ^ Math.imul(b, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/** FNV-1a 32-bit of a string (request ids → seeds). */
export function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** mulberry32: a small, fast seeded PRNG returning floats in [0, 1). */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
}

/** Mean of the natural (EOS-terminated) output length when ignore_eos is off. */
export const NATURAL_OUTPUT_MEAN = 200;

/** Output length a request will reach: exact with ignore_eos, else geometric-like capped at maxTokens. */
export function targetOutputLength(rng: Rng, maxTokens: number, ignoreEos: boolean): number {
  if (ignoreEos) return maxTokens;
  const natural = 1 + Math.floor(-Math.log(1 - rng.next()) * NATURAL_OUTPUT_MEAN);
  return Math.min(maxTokens, natural);
}

/** A generated token id, avoiding the low ids that tokenizers reserve for special tokens. */
export function sampleToken(rng: Rng, vocabSize: number): number {
  const low = Math.min(1000, Math.floor(vocabSize / 4));
  return low + Math.floor(rng.next() * (vocabSize - low));
}
