/**
 * End-to-end fuzz (test/fuzz/e2e.ts), seeded and bounded: arbitrary requests through a live gateway
 * whose replica streams arbitrary SSE bytes; `npm run fuzz` runs it longer.
 */
import { test } from "node:test";
import fc from "fast-check";
import { httpProperty, startHttpFuzz } from "./fuzz/e2e.ts";

test("fuzz: requests to kvgate serve get the replica's bytes or an OpenAI error, each counted once", {
  timeout: 120_000,
}, async (t) => {
  const fx = await startHttpFuzz();
  t.after(() => fx.close());
  await fc.assert(httpProperty(fx), { seed: 16, numRuns: 150 });
  const health = await fx.client.request({ path: "/health", method: "GET" });
  await health.body.text();
  if (health.statusCode !== 200) throw new Error(`gateway unhealthy after fuzzing: ${health.statusCode}`);
});
