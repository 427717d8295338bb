/**
 * The fuzz properties (test/fuzz/properties.ts), seeded and bounded for the normal suite; `npm run
 * fuzz` runs the same properties for many more cases.
 */
import { test } from "node:test";
import fc from "fast-check";
import { PURE_PROPERTIES } from "./fuzz/properties.ts";

for (const p of PURE_PROPERTIES)
  test(`fuzz: ${p.name}`, () => {
    fc.assert(p.property as fc.IRawProperty<unknown>, { seed: 16, numRuns: p.runs });
  });
