/**
 * Tiered-cache fleet scenarios: the 13.9× shape in small (long prompts all seen before, one-token
 * answers, documents outgrowing HBM) runs to completion on GPU-only and +CPU fleets of one seed and
 * +CPU answers sooner; the +CPU fleet's host-link bound is load bandwidth ÷ KV bytes per token, over
 * the hit tokens per request, as worked out by hand; the fleet's precise router reads the engines'
 * CPU-medium KV events (a CPU-weighted index finds more cached tokens than a GPU-only one); the
 * shipped tiered scenarios parse.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { offloadLimit } from "../src/sim/fleet/limits.ts";
import { loadScenario, parseScenario } from "../src/sim/fleet/scenario.ts";
import { simulate } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-tiered.yaml");
const RR =
  "{ apiVersion: llm-d.ai/v1alpha1, kind: EndpointPickerConfig, plugins: [ { type: round-robin-picker } ], schedulingProfiles: [ { name: default, plugins: [ { pluginRef: round-robin-picker } ] } ] }";

/** One Llama-3.1-8B replica with 20k tokens of HBM; 8 documents of 4,000 tokens (32k) cycled. */
const SMALL = `
name: test-tiered
seed: 5
fleet:
  replicas: 1
  profile: llama-3.1-8b-h100
  kvTokens: 20000
  maxModelLen: 8192
  kvOffloadingSize: 8
routers:
  - name: gpu-only
    config: ${RR}
    fleet: { replicas: 1, profile: llama-3.1-8b-h100, kvTokens: 20000, maxModelLen: 8192 }
  - name: cpu
    config: ${RR}
workload:
  workload: shared-prefix
  options: { numGroups: 8, promptsPerGroup: 1, systemPromptLen: 4000, questionLen: 8, outputLen: 1 }
  arrival:
    type: stages
    process: poisson
    barrier: true
    stages:
      - { rate: 2, duration: 4, warmup: true }
      - { rate: 8, duration: 10 }
`;

describe("tiered fleet scenarios", () => {
  it("the 13.9× shape in small: both fleets finish, +CPU has the lower TTFT on the same seed", async () => {
    const res = await simulate(parseScenario(SMALL, FILE));
    const [gpu, cpu] = res.runs;
    assert.equal(gpu.router, "gpu-only");
    // 80 measured requests (8 QPS × 10 s) after the 8 of the warm-up, all answered.
    for (const r of [gpu, cpu]) {
      assert.equal(r.stages[1].requests, 80, r.router);
      assert.equal(r.completed, r.requests, r.router);
      assert.equal(r.errors, 0, r.router);
    }
    const t = (r: typeof gpu) => r.ttft_p50_s as number;
    assert.ok(t(cpu) < t(gpu), `reloading from CPU beats recomputing: TTFT p50 ${t(cpu)} vs ${t(gpu)}`);
    // The measured stage's requests were all seen in the warm-up: +CPU serves them from a tier.
    const measured = (r: typeof gpu) =>
      (r.stages[1] as { prefix_cache_hit_rate?: number | null }).prefix_cache_hit_rate as number;
    assert.ok(measured(cpu) > measured(gpu), `${measured(cpu)} vs ${measured(gpu)}`);
    assert.ok((cpu.cached_token_rate as number) > (gpu.cached_token_rate as number));
    // The limits belong to the scenario's fleet (the +CPU one), so they carry its host-link bound.
    const o = res.limits.offload;
    assert.ok(o !== undefined, "the +CPU fleet's limits include its host-link bound");
    assert.equal(o.kv_bytes_per_token, 2 * 32 * 8 * 128 * 2);
    assert.equal(o.load_bytes_per_s, 50e9);
  });

  it("computes the host-link bound as bandwidth ÷ KV bytes per token for a hand-worked fleet", () => {
    const sc = parseScenario(
      SMALL.replace("replicas: 1\n  profile", "replicas: 2\n  profile").replace(
        "kvOffloadingSize: 8",
        "kvOffloadingSize: 8\n  kvOffloadingBandwidthGBps: 25",
      ),
      FILE,
    );
    // Llama-3.1-8B: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 131,072 B per token.
    // 25e9 / 131,072 = 190,734.863… tokens/s per replica; 2 replicas, 4,000 hit tokens per request
    // → 95.367… requests/s; × 4,016 prompt tokens and × 10 output tokens per request.
    const o = offloadLimit(sc.fleet, 4000, 4016, 10);
    assert.ok(o !== undefined);
    assert.equal(o.kv_bytes_per_token, 131072);
    assert.ok(Math.abs(o.load_tokens_per_s_per_replica - 190734.863) < 1e-3);
    assert.ok(Math.abs(o.requests_per_s - 95.3674) < 1e-4);
    assert.ok(Math.abs(o.prompt_tokens_per_s - 95.3674 * 4016) < 1);
    assert.ok(Math.abs(o.output_tokens_per_s - 953.674) < 1e-3);
    // A fleet without a CPU tier has no such bound.
    const gpuOnly = sc.routers.find((r) => r.name === "gpu-only")?.pools[0];
    assert.ok(gpuOnly !== undefined);
    assert.equal(offloadLimit(gpuOnly, 4000, 4016, 10), undefined);
  });

  it("feeds the engines' CPU-tier events to the fleet's precise index: weighting the CPU tier finds more cache", async () => {
    const precise = (tiers: string) =>
      `{ apiVersion: llm-d.ai/v1alpha1, kind: EndpointPickerConfig, plugins: [ { type: precise-prefix-cache-producer, parameters: { indexerConfig: { kvCacheBackendConfigs: ${tiers} } } }, { type: prefix-cache-scorer }, { type: queue-scorer }, { type: max-score-picker } ], schedulingProfiles: [ { name: default, plugins: [ { pluginRef: prefix-cache-scorer, weight: 3 }, { pluginRef: queue-scorer, weight: 1 }, { pluginRef: max-score-picker } ] } ] }`;
    // Two replicas of 20k HBM tokens each, 40 groups of 2,000-token prefixes (80k): most prefixes
    // live only in some replica's CPU tier by the time they come back.
    const sc = parseScenario(
      `
name: test-tiered-precise
seed: 2
fleet: { replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 20000, maxModelLen: 8192, kvOffloadingSize: 16 }
routers:
  - { name: tiers, config: ${precise("[{ name: gpu, weight: 1.0 }, { name: cpu, weight: 0.8 }]")} }
  - { name: gpu-events, config: ${precise("[{ name: gpu, weight: 1.0 }]")} }
workload:
  workload: shared-prefix
  numRequests: 240
  options: { numGroups: 40, promptsPerGroup: 6, systemPromptLen: 2000, questionLen: 50, outputLen: 20 }
  arrival: { type: poisson, rate: 20 }
`,
      FILE,
    );
    const [tiers, gpu] = (await simulate(sc)).runs;
    assert.equal(tiers.completed, 240);
    assert.equal(gpu.completed, 240);
    const c = (r: typeof tiers) => r.cached_token_rate as number;
    assert.ok(c(tiers) > c(gpu), `cached tokens with CPU events ${c(tiers)} vs GPU events only ${c(gpu)}`);
  });

  it("ships scenarios that parse: tiered-13x compares GPU-only, +CPU and +storage, tiered-shared-prefix five routers on +CPU (one with storage too)", () => {
    const x = loadScenario("scenarios/tiered-13x.yaml");
    assert.deepEqual(
      x.routers.map((r) => [
        r.name,
        r.pools[0].kvOffload !== undefined,
        r.pools[0].sharedStorage !== undefined,
      ]),
      [
        ["gpu-only", false, false],
        ["cpu", true, false],
        ["cpu-200", true, false],
        ["storage", true, true],
      ],
    );
    const s = loadScenario("scenarios/tiered-shared-prefix.yaml");
    assert.equal(s.routers.length, 5);
    assert.ok(
      s.routers[4].pools[0].sharedStorage !== undefined,
      "precise-storage adds the shared filesystem",
    );
    for (const r of s.routers) assert.ok(r.pools[0].kvOffload !== undefined, r.name);
  });
});
