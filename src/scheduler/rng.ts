/**
 * A tiny seeded PRNG (mulberry32) so scheduling is deterministic for a given seed: the fleet
 * simulator and tests replay the same picks. Not for anything security-sensitive.
 */

export interface Rng {
  /** Uniform in [0, 1). */
  next(): number;
  /** Uniform integer in [0, n). */
  int(n: number): number;
}

export class Mulberry32 implements Rng {
  #state: number;

  constructor(seed: number) {
    this.#state = seed >>> 0;
  }

  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** An independent generator at this one's current state (draws from it leave this one as is). */
  clone(): Mulberry32 {
    const c = new Mulberry32(0);
    c.#state = this.#state;
    return c;
  }
}

export function createRng(seed: number): Mulberry32 {
  return new Mulberry32(seed);
}

/** Fisher-Yates shuffle of `a` in place. */
export function shuffleInPlace<T>(rng: Rng, a: T[]): T[] {
  for (let i = a.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  return a;
}
