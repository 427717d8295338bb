// scenarios/one-system-prompt.yaml in the fleet simulator: with every request behind one system
// prompt, the default config serves it from every replica (spreadHotPrefixes), where sticky routing
// alone keeps it on the replica that cached it first (a second only when the load gate lets go).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import { loadScenario } from "../src/sim/fleet/scenario.ts";
import { runRouter, scenarioWorkload } from "../src/sim/fleet/simulate.ts";

/** Replicas that served the measured requests of the scenario's first tenth, under `configText`. */
async function replicasServing(configText: string): Promise<number> {
  const sc = loadScenario("scenarios/one-system-prompt.yaml");
  const r = { ...(sc.routers.find((x) => x.name === "default") as (typeof sc.routers)[number]), configText };
  const { spec, workload } = scenarioWorkload(sc, true);
  const ctx = { spec, workload, tokenizer: new PromptTokenizer(), limits: null, records: true };
  const { rows = [] } = await runRouter(sc, r, ctx);
  return new Set(rows.filter((x) => !x.warmup).map((x) => x.endpoint)).size;
}

describe("one-system-prompt scenario", () => {
  it("the default config serves the one prompt from all 8 replicas; without spreadHotPrefixes from one or two", async () => {
    const on = readFileSync("config/examples/default.yaml", "utf8");
    const off = on.replace(/\n {4}spreadHotPrefixes:\n {6}margin: 0\.5/, "");
    assert.notEqual(off, on);
    assert.equal(await replicasServing(on), 8);
    const sticky = await replicasServing(off);
    assert.ok(sticky <= 2, `${sticky} replicas`);
  });
});
