/**
 * ext_proc fuzz (test/fuzz/ext-proc.ts), seeded and bounded: arbitrary ProcessingRequest sequences
 * over real gRPC Process streams to a live `kvgate epp`; `npm run fuzz` runs it longer.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { extProcProperty, startExtProcFuzz, stillServes, streamCounts } from "./fuzz/ext-proc.ts";

test("fuzz: ext_proc streams end cleanly, rejections are ImmediateResponses with an OpenAI error, each counted", {
  timeout: 120_000,
}, async (t) => {
  const fx = await startExtProcFuzz();
  t.after(() => fx.close());
  await fc.assert(extProcProperty(fx), { seed: 16, numRuns: 200 });
  await stillServes(fx);
  // The cases reached the refusals, not only happy paths.
  const c = await streamCounts(fx.epp);
  for (const o of ["rejected", "protocol-error", "client-disconnect"])
    assert.ok((c.get(o) ?? 0) > 0, `no fuzzed stream ended as ${o}: ${JSON.stringify([...c])}`);
});
