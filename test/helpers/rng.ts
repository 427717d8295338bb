/** A seeded stream in [0, 1) for property tests: the engine's mulberry32, as a function. */
import { Rng } from "../../src/engine/output-tokens.ts";

export type RandomFn = () => number;

export function rng(seed: number): RandomFn {
  const r = new Rng(seed);
  return () => r.next();
}
