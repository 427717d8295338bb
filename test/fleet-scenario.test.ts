/** Scenario files: the shipped ones parse; bad ones fail with a message naming the field. */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { loadScenario, parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";

const FILE = resolve("scenarios/test-errors.yaml");

const VALID = {
  name: "t",
  seed: 1,
  fleet: "{ replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 64000, maxModelLen: 8192 }",
  routers: "[{ name: rr, config: ../config/examples/round-robin.yaml }]",
  workload: "{ preset: smoke }",
  extra: "",
};

function yaml(over: Partial<typeof VALID> = {}): string {
  const v = { ...VALID, ...over };
  return `name: ${v.name}\nseed: ${v.seed}\nfleet: ${v.fleet}\nrouters: ${v.routers}\nworkload: ${v.workload}\n${v.extra}`;
}

function fails(text: string, pattern: RegExp): void {
  assert.throws(
    () => parseScenario(text, FILE),
    (e: unknown) => e instanceof ScenarioError && pattern.test(e.message),
    `expected ${pattern}`,
  );
}

describe("scenario files", () => {
  it("the shipped scenarios parse with the expected fleet and routers", () => {
    const s = loadScenario("scenarios/shared-prefix-73.yaml");
    assert.equal(s.fleet.replicas, 8);
    assert.equal(s.fleet.profile.name, "qwen3-32b-tp2-h100");
    assert.equal(s.kvTokens, 307328);
    assert.equal(s.fleet.numGpuBlocks, 307328 / 16 + 1);
    assert.deepEqual(
      s.routers.map((r) => r.name),
      ["approximate", "load", "random", "round-robin", "default", "precise"],
    );
    assert.equal(s.workload.preset, "llmd-73");
    assert.equal(s.scrapeInterval, 0.1);
    assert.equal(s.gatewayDelay, 0);
    assert.equal(s.fleet.blockHashAlgo, "fast64");
    const t = loadScenario("scenarios/tutorial.yaml");
    assert.equal(t.fleet.replicas, 8);
    assert.equal(t.workload.preset, "tutorial");
  });

  it("defaults come from the profile; inline router configs are accepted", () => {
    const s = parseScenario(
      yaml({
        fleet: "{ replicas: 1, profile: llama-3.1-8b-h100 }",
        routers: "[{ name: inline, config: { plugins: [{ type: random-picker }] } }]",
      }),
      FILE,
    );
    assert.equal(s.kvTokens, Math.floor(421000 / 16) * 16);
    assert.equal(s.fleet.maxNumBatchedTokens, 8192);
    assert.equal(s.routers[0].source, "inline");
    assert.match(s.routers[0].configText, /random-picker/);
  });

  it("names the field in every error", () => {
    fails(
      yaml({ fleet: "{ replica: 2, replicas: 2, profile: llama-3.1-8b-h100 }" }),
      /fleet\.replica: unknown field; allowed: replicas, profile, kvTokens, .*, pools, sharedStorage$/,
    );
    fails(
      yaml({ extra: "scrapeIntervalMS: 50" }),
      /scrapeIntervalMS: unknown field; allowed: name, description, seed, fleet, routers, workload, .*scrapeIntervalMs,/,
    );
    fails(
      yaml({
        routers:
          "[{ name: a, config: x.yaml, fleet: { pools: [{ replicas: 1, profile: p, rol: decode }] } }]",
      }),
      /routers\[0\]\.fleet\.pools\[0\]\.rol: unknown field; allowed: role, replicas, profile,/,
    );
    fails(
      yaml({ workload: "{ preset: tutorial, arrival: { type: gamma, rate: 1, burstiness: 2, burst: 2 } }" }),
      /workload\.arrival\.burst: unknown field; allowed: type, rate, burstiness$/,
    );
    fails(yaml({ fleet: "{ replicas: two, profile: llama-3.1-8b-h100 }" }), /fleet\.replicas:/);
    fails(yaml({ fleet: "{ replicas: 0, profile: llama-3.1-8b-h100 }" }), /fleet\.replicas:/);
    fails(
      yaml({ fleet: "{ replicas: 2, profile: no-such-gpu }" }),
      /fleet\.profile: unknown profile "no-such-gpu"/,
    );
    fails(
      yaml({ fleet: "{ replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 1000, numGpuBlocks: 100 }" }),
      /fleet\.numGpuBlocks: give kvTokens or numGpuBlocks, not both/,
    );
    fails(
      yaml({ fleet: "{ replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 4096 }" }),
      /fleet\.maxModelLen:/,
    );
    fails(yaml({ extra: "scrapeIntervalMs: -5" }), /scrapeIntervalMs:/);
    fails(yaml({ extra: "blockHash: md5" }), /blockHash:/);
    fails(yaml({ routers: "[]" }), /routers:/);
    fails(
      yaml({
        routers:
          "[{ name: a, config: ../config/examples/random.yaml }, { name: a, config: ../config/examples/random.yaml }]",
      }),
      /routers\[1\]\.name: duplicate router name "a"; give each router its own name$/,
    );
    fails(yaml({ routers: "[{ name: a, config: nowhere.yaml }]" }), /routers\[0\]\.config: cannot read/);
    fails(yaml({ routers: "[{ name: 'a b', config: x.yaml }]" }), /routers\[0\]\.name:/);
    fails(yaml({ workload: "{ preset: no-such-preset }" }), /workload: unknown preset "no-such-preset"/);
    fails(
      yaml({ workload: "{ workload: shared-prefix, options: { numGroup: 3 } }" }),
      /workload: .*numGroup/,
    );
    fails("name: [unclosed", /invalid YAML/);
    fails("seed: 1", /name:/);
  });
});
