/**
 * The multi-pool step (pool-router.ts) on its own: declared models, learned ones in pools-file order,
 * rewrites to targets in other pools, and the weighted split's shares for any seed and weights.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import type { ModelRewrite } from "../src/datalayer/pool-resources.ts";
import { PoolRouter } from "../src/gateway/multi-pool/pool-router.ts";
import { createRng } from "../src/scheduler/rng.ts";

const learnedBy: Record<string, string[]> = { b: ["m2", "shared"], c: ["shared", "m3"] };
const entries = [
  { name: "a", pool: "a", models: ["m1"] },
  { name: "b", pool: "b", models: null },
  { name: "c", pool: "c", models: null },
];
const split = (weights: number[]): ModelRewrite => ({
  name: "split",
  createdAtMs: 0,
  rules: [{ matches: ["chat"], targets: weights.map((w, i) => ({ model: `t${i}`, weight: w })) }],
});

test("declared models, then learned ones in pools-file order; null when nothing serves the model", () => {
  const r = new PoolRouter(entries, [], (p, m) => learnedBy[p]?.includes(m) ?? false);
  assert.equal(r.poolOf("m1"), "a");
  assert.equal(r.poolOf("m2"), "b");
  assert.equal(r.poolOf("shared"), "b");
  assert.equal(r.poolOf("m3"), "c");
  assert.equal(r.poolOf("nope"), null);
  // No rewrites configured: routing draws nothing.
  assert.equal(
    r.route("nope", () => assert.fail("route drew a random number without a rewrite")),
    null,
  );
});

test("a rename sends the request to the pool of its target", () => {
  const rw: ModelRewrite = {
    name: "rn",
    createdAtMs: 0,
    rules: [{ matches: ["old"], targets: [{ model: "m3", weight: null }] }],
  };
  const r = new PoolRouter(entries, [rw], (p, m) => learnedBy[p]?.includes(m) ?? false);
  assert.deepEqual(
    r.route("old", () => 0.5),
    {
      pool: "c",
      model: "m3",
      rewrite: { rewriteName: "rn", model: "old", target: "m3" },
    },
  );
  assert.deepEqual(r.rewriteSources(), ["old"]);
  // A target no pool serves is a miss, not a pick.
  const dangling: ModelRewrite = {
    ...rw,
    rules: [{ matches: ["old"], targets: [{ model: "gone", weight: null }] }],
  };
  assert.equal(
    new PoolRouter(entries, [dangling], () => false).route("old", () => 0.5),
    null,
  );
});

test("a weighted split's shares over 1,000 requests are within 2% of the weights, for any seed", () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 0, max: 2 ** 31 }),
      fc.array(fc.integer({ min: 1, max: 100 }), { minLength: 2, maxLength: 4 }),
      (seed, weights) => {
        const rng = createRng(seed);
        const r = new PoolRouter(
          [{ name: "p", pool: "p", models: weights.map((_, i) => `t${i}`) }],
          [split(weights)],
          () => false,
        );
        const counts = weights.map(() => 0);
        for (let i = 0; i < 1000; i++) {
          const d = r.route("chat", () => rng.next());
          counts[Number(d?.model.slice(1))]++;
        }
        const total = weights.reduce((a, b) => a + b, 0);
        for (let i = 0; i < weights.length; i++)
          assert.ok(Math.abs(counts[i] / 1000 - weights[i] / total) <= 0.02, `${weights} → ${counts}`);
      },
    ),
    { seed: 17, numRuns: 200 },
  );
});
