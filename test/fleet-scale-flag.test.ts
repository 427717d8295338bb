/** `kvgate simulate --scale`: the same traffic shape on a fleet f times the size (src/sim/fleet/scale.ts). */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import type { RequestSpec } from "../src/bench/workloads/types.ts";
import { scaleScenario } from "../src/sim/fleet/scale.ts";
import { loadScenario, parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";

const FILE = resolve("scenarios/test-scale.yaml");
const RR = "[{ name: rr, config: ../config/examples/round-robin.yaml }]";

function scenario(fleet: string, workload: string) {
  return parseScenario(`name: t\nseed: 3\nfleet: ${fleet}\nrouters: ${RR}\nworkload:\n${workload}`, FILE);
}

const group = (r: RequestSpec) => r.groupId;
const perStage = (reqs: readonly RequestSpec[]) => {
  const n = new Map<number, number>();
  for (const r of reqs) n.set(r.stage ?? -1, (n.get(r.stage ?? -1) ?? 0) + 1);
  return [...n.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => c);
};

describe("scaleScenario", () => {
  it("doubles the replicas, each stage's arrivals and the prefix groups, so each replica's load is the same", () => {
    const sc = scenario(
      "{ replicas: 3, profile: llama-3.1-8b-h100, kvTokens: 64000, maxModelLen: 8192 }",
      `  workload: shared-prefix
  arrival: { type: stages, process: poisson, stages: [{ rate: 6, duration: 5, warmup: true }, { rate: 9, duration: 10 }] }
  options: { numGroups: 12, promptsPerGroup: 4, systemPromptLen: 300, questionLen: 20, outputLen: 10 }`,
    );
    const big = scaleScenario(sc, 2);
    assert.equal(big.fleet.replicas, 6);
    assert.deepEqual(
      big.pools.map((p) => p.replicas),
      [6],
    );
    assert.equal(big.routers[0].pools, big.pools, "a router on the scenario's fleet runs on the scaled one");
    const a = generateWorkload(sc.workload).requests;
    const b = generateWorkload(big.workload).requests;
    assert.deepEqual(
      perStage(b),
      perStage(a).map((n) => 2 * n),
    );
    assert.equal(new Set(a.map(group)).size, 12);
    assert.equal(new Set(b.map(group)).size, 24);
    // Per replica: the same requests per second and the same groups to home.
    assert.equal(b.length / big.fleet.replicas, a.length / sc.fleet.replicas);
    assert.equal((big.workload.options as { promptsPerGroup: number }).promptsPerGroup, 4);
    assert.equal(sc.fleet.replicas, 3, "the scenario it was given is left as it was");
    assert.equal(scaleScenario(sc, 1), sc);
  });

  it("halves closed-loop users, request counts and a preset's groups", () => {
    const sc = loadScenario("scenarios/tutorial.yaml");
    const half = scaleScenario(sc, 0.5);
    assert.equal(half.fleet.replicas, 4);
    assert.deepEqual(half.workload.arrival, { ...sc.workload.arrival, users: 75 });
    assert.equal(half.workload.numRequests, 375);
    const reqs = generateWorkload(half.workload).requests;
    assert.equal(reqs.length, 375);
    assert.equal(new Set(reqs.map(group)).size, 75);
  });

  it("keeps one prompt everyone shares as one, and scales a mix's streams with their defaults and tags", () => {
    const sc = scenario(
      "{ replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 64000, maxModelLen: 8192 }",
      `  workload: mix
  options:
    streams:
      - { name: others, tenant: t-a, workload: shared-prefix, numRequests: 40, arrival: { type: poisson, rate: 4 }, options: { systemPromptLen: 200, questionLen: 10, outputLen: 5 } }
      - { name: popular, start: 3, workload: shared-prefix, numRequests: 30, arrival: { type: poisson, rate: 3 }, options: { numGroups: 1, promptsPerGroup: 50, systemPromptLen: 200, questionLen: 10, outputLen: 5 } }`,
    );
    const big = scaleScenario(sc, 2);
    const streams = (big.workload.options as { streams: Record<string, unknown>[] }).streams;
    assert.deepEqual(
      streams.map((s) => [s.name, s.numRequests, (s.arrival as { rate: number }).rate]),
      [
        ["others", 80, 8],
        ["popular", 60, 6],
      ],
    );
    assert.equal(streams[0].tenant, "t-a");
    assert.equal(streams[1].start, 3);
    const o = (k: number) => streams[k].options as { numGroups: number; promptsPerGroup: number };
    assert.equal(o(0).numGroups, 20, "the default 10 groups, doubled");
    assert.deepEqual([o(1).numGroups, o(1).promptsPerGroup], [1, 50]);
    const reqs = generateWorkload(big.workload).requests;
    const popular = reqs.filter((r) => r.tags?.stream === "popular");
    assert.equal(popular.length, 60);
    assert.equal(new Set(popular.map(group)).size, 1);
    assert.ok(Math.min(...popular.map((r) => r.arrivalTime)) >= 3, "the stream still starts at 3 s");
    // Same seeds as the unscaled mix: the popular stream's first prompt is the same text.
    const small = generateWorkload(sc.workload).requests.filter((r) => r.tags?.stream === "popular");
    assert.equal(popular[0].prompt, small[0].prompt);
  });

  it("scales documents and shared system prompts", () => {
    const fleet = "{ replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 140000, maxModelLen: 65536 }";
    const docs = scenario(
      fleet,
      "  workload: mixed-length\n  numRequests: 50\n  arrival: { type: poisson, rate: 10 }\n  options: { documentPool: 40 }",
    );
    assert.equal((scaleScenario(docs, 0.5).workload.options as { documentPool: number }).documentPool, 20);
    const chat = scenario(
      fleet,
      "  workload: multi-turn\n  numRequests: 50\n  arrival: { type: poisson, rate: 2 }\n  options: { sharedSystemPrompts: 8 }",
    );
    const big = scaleScenario(chat, 2).workload;
    assert.equal((big.options as { sharedSystemPrompts: number }).sharedSystemPrompts, 16);
    assert.deepEqual(big.arrival, { type: "poisson", rate: 4 });
    assert.equal(big.numRequests, 100);
  });

  it("refuses what it cannot scale, saying what to do", () => {
    const sc = loadScenario("scenarios/shared-prefix-73.yaml");
    const refuses = (f: () => unknown, pattern: RegExp) =>
      assert.throws(f, (e: unknown) => e instanceof ScenarioError && pattern.test(e.message), `${pattern}`);
    refuses(() => scaleScenario(sc, 0.3), /gives 2\.4 replicas in pool 1 \(8\); pick a factor/);
    refuses(() => scaleScenario(sc, 0), /must be a number above 0/);
    refuses(
      () => scaleScenario(loadScenario("scenarios/locality-regional-spike.yaml"), 2),
      /does not scale regions yet.*drop --scale/,
    );
    const trace = { ...sc, workload: { ...sc.workload, workload: "trace" as const } };
    refuses(() => scaleScenario(trace, 2), /a trace replays its own arrivals/);
  });
});
