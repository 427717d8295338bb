/**
 * Routing outcomes in a small shared-prefix fleet whose KV cache holds only some of the groups'
 * prefixes per replica: a prefix-aware router keeps each group on one replica, so it beats
 * round-robin, random and load-only routing on prefix-cache hit rate and TTFT; and the hit rate
 * stays below the workload's "all repeats" ideal.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { parseScenario } from "../src/sim/fleet/scenario.ts";
import { type SimResults, simulate } from "../src/sim/fleet/simulate.ts";

/**
 * 4 replicas with 6,000 KV tokens each; 8 groups with 1,500-token system prompts (12,000 resident
 * tokens in all): partitioned, each replica keeps its 2 groups; spread, every replica cycles all 8.
 */
const SCENARIO = `
name: routing
seed: 3
fleet: { replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 6000, maxModelLen: 4096, maxNumSeqs: 64 }
routers:
  - { name: approximate, config: ../config/examples/estimated.yaml }
  - { name: default, config: ../config/examples/default.yaml }
  - { name: load, config: ../config/examples/load-only.yaml }
  - { name: random, config: ../config/examples/random.yaml }
  - { name: round-robin, config: ../config/examples/round-robin.yaml }
workload:
  workload: shared-prefix
  numRequests: 320
  options: { numGroups: 8, promptsPerGroup: 6, systemPromptLen: 1500, questionLen: 100, outputLen: 40 }
  arrival: { type: poisson, rate: 12 }
`;

let cached: SimResults | undefined;
async function results(): Promise<SimResults> {
  cached ??= await simulate(parseScenario(SCENARIO, resolve("scenarios/test-routing.yaml")));
  return cached;
}

const by = (r: SimResults, name: string) => {
  const run = r.runs.find((x) => x.router === name);
  assert.ok(run, `router ${name}`);
  return run;
};

describe("prefix-aware routing on a small shared-prefix fleet", () => {
  it("beats round-robin, random and load-only on hit rate", async () => {
    const r = await results();
    const hit = (n: string) => by(r, n).prefix_cache_hit_rate ?? 0;
    for (const aware of ["approximate", "default"])
      for (const blind of ["round-robin", "random", "load"])
        assert.ok(hit(aware) > hit(blind) + 0.15, `${aware} ${hit(aware)} vs ${blind} ${hit(blind)}`);
  });

  it("beats them on TTFT p50 and p90", async () => {
    const r = await results();
    for (const aware of ["approximate", "default"])
      for (const blind of ["round-robin", "random", "load"]) {
        const a = by(r, aware);
        const b = by(r, blind);
        assert.ok((a.ttft_p50_s ?? 0) < (b.ttft_p50_s ?? 0), `${aware} vs ${blind} p50`);
        assert.ok((a.ttft_p90_s ?? 0) < (b.ttft_p90_s ?? 0), `${aware} vs ${blind} p90`);
      }
  });

  it("stays within the workload's ideal hit rate, and every request completes", async () => {
    const r = await results();
    const ideal = r.limits.regimes.repeat.prefix_hit_rate;
    assert.ok(ideal > r.limits.regimes.group.prefix_hit_rate);
    for (const run of r.runs) {
      assert.equal(run.errors, 0);
      assert.equal(run.completed, 320);
      assert.ok((run.prefix_cache_hit_rate ?? 0) <= ideal + 1e-9, run.router);
    }
  });
});
