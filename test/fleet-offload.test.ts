/**
 * The CPU offload tier in the fleet simulator: a scenario with kvOffloadingSize runs to completion,
 * its loads timed by the event loop; with shared prefixes whose working set exceeds HBM the tier
 * cuts the mean TTFT against GPU-only caching on the same seed; bad offload fields are refused.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";
import { simulate } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-offload.yaml");

/** One Llama-3.1-8B replica with 20k tokens of HBM and 24 groups of 2,000-token prefixes (48k). */
function scenario(offload: string) {
  return parseScenario(
    `
name: test-offload
seed: 3
fleet:
  replicas: 1
  profile: llama-3.1-8b-h100
  kvTokens: 20000
  maxModelLen: 8192
${offload}
routers:
  - name: rr
    config: { apiVersion: llm-d.ai/v1alpha1, kind: EndpointPickerConfig, plugins: [ { type: round-robin-picker } ], schedulingProfiles: [ { name: default, plugins: [ { pluginRef: round-robin-picker } ] } ] }
workload:
  workload: shared-prefix
  numRequests: 240
  options: { numGroups: 24, promptsPerGroup: 10, systemPromptLen: 2000, questionLen: 50, outputLen: 10 }
  arrival: { type: poisson, rate: 20 }
`,
    FILE,
  );
}

describe("CPU offload tier in the fleet simulator", () => {
  it("runs to completion and cuts TTFT against GPU-only caching when the prefixes outgrow HBM", async () => {
    const gpu = (await simulate(scenario(""), { routers: ["rr"] })).runs[0];
    const cpu = (await simulate(scenario("  kvOffloadingSize: 16"), { routers: ["rr"] })).runs[0];
    assert.equal(gpu.completed, 240);
    assert.equal(cpu.completed, 240);
    assert.equal(cpu.errors, 0);
    // vllm:prefix_cache_hits counts GPU hits only, as in vLLM: the tier shows in TTFT instead.
    assert.ok((gpu.prefix_cache_hit_rate ?? 1) < 0.7, `GPU-only misses many prefixes`);
    const t = (r: typeof gpu) => r.ttft_mean_s as number;
    assert.ok(t(cpu) < 0.8 * t(gpu), `reloading beats recomputing: TTFT ${t(cpu)} vs ${t(gpu)}`);
  });

  it("refuses an offload block size that is not a multiple of the block size", () => {
    assert.throws(
      () => scenario("  kvOffloadingSize: 16\n  kvOffloadingBlockSize: 24"),
      (e: unknown) => e instanceof ScenarioError && /multiple of blockSize 16/.test(e.message),
    );
    assert.throws(() => scenario("  kvOffloadingBlockSize: 32"), /kvOffloadingSize: required/);
  });
});
