/**
 * npm run fuzz — the fuzz properties run long: each pure property (properties.ts) and the
 * end-to-end HTTP and ext_proc properties (e2e.ts, ext-proc.ts) for --runs cases (those two for a
 * tenth of them), seeded by
 * --seed (default: the time, printed so a failure can be replayed). Prints the cases run per
 * property and in total; exits 1 with fast-check's counterexample on the first failure.
 *
 *   npm run fuzz -- [--runs 20000] [--seed N]
 */
import { parseArgs } from "node:util";
import fc from "fast-check";
import { httpProperty, startHttpFuzz } from "./e2e.ts";
import { extProcProperty, startExtProcFuzz } from "./ext-proc.ts";
import { PURE_PROPERTIES } from "./properties.ts";

const { values: a } = parseArgs({
  options: { runs: { type: "string", default: "20000" }, seed: { type: "string" } },
});
const runs = Number(a.runs);
const seed = a.seed !== undefined ? Number(a.seed) : Date.now() % 2 ** 31;
console.log(`fuzz: seed ${seed}, ${runs} cases per property (end to end: ${Math.ceil(runs / 10)})`);
let total = 0;
let failed = false;
const run = async (name: string, property: fc.IRawProperty<unknown>, numRuns: number) => {
  const t0 = performance.now();
  const r = await fc.check(property, { seed, numRuns });
  total += r.numRuns;
  const s = ((performance.now() - t0) / 1000).toFixed(1);
  console.log(
    `${r.failed ? "FAIL" : "ok  "} ${String(r.numRuns).padStart(7)} cases  ${s.padStart(6)} s  ${name}`,
  );
  if (r.failed) {
    failed = true;
    console.log(fc.defaultReportMessage(r));
  }
};
for (const p of PURE_PROPERTIES) await run(p.name, p.property, runs);
const fx = await startHttpFuzz();
try {
  await run("HTTP through a live gateway (e2e.ts)", httpProperty(fx), Math.ceil(runs / 10));
} finally {
  await fx.close();
}
const ex = await startExtProcFuzz();
try {
  await run(
    "ext_proc Process streams to a live kvgate epp (ext-proc.ts)",
    extProcProperty(ex),
    Math.ceil(runs / 10),
  );
} finally {
  await ex.close();
}
console.log(`fuzz: ${total} cases in all, ${failed ? "with failures" : "no failure"} (seed ${seed})`);
process.exitCode = failed ? 1 : 0;
