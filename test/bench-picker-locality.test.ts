// bench:picker's locality~spill-set twin: it decides over exactly the list the locality-filter left,
// without running the filter; and the bench's --help prints usage instead of a parse error.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { ChatWorkload, makeEndpoints, scrape } from "../src/bench/picker-decision.ts";
import { spillSetPair } from "../src/bench/picker-locality.ts";
import { LocalityFilter } from "../src/scheduler/plugins/filters/locality.ts";
import { createRng } from "../src/scheduler/rng.ts";

const LOCALITY = readFileSync("config/examples/locality.yaml", "utf8");

describe("bench:picker locality~spill-set", () => {
  it("picks what the config itself picks, from the list its shadow's filter left", async () => {
    const { twin, shadow } = await spillSetPair("locality~spill-set", LOCALITY, 3);
    const endpoints = makeEndpoints(16, false);
    const rng = createRng(5);
    const workload = new ChatWorkload({ users: 20, systemPrompts: 4, promptTokens: 2048, seed: 9 });
    let now = 1000;
    let remote = 0;
    const filterOf = (s: typeof twin) =>
      [...s.plugins.values()].find((p) => p instanceof LocalityFilter) as LocalityFilter;
    let shadowSpilled = 0;
    let twinSpilled = 0;
    for (const spec of workload.batch(200)) {
      now += 0.01;
      if (spec.id % 10 === 0) scrape(endpoints, rng, now);
      const a = shadow.schedule(workload.materialize(spec), endpoints, now);
      const b = twin.schedule(workload.materialize(spec), endpoints, now);
      assert.equal(b.target?.id, a.target?.id, `request ${spec.id}`);
      if (filterOf(shadow).spilling() > 0) shadowSpilled++;
      if (filterOf(twin).spilling() > 0) twinSpilled++;
      shadow.onPicked(workload.materialize(spec), a, now);
      twin.onPicked(workload.materialize(spec), b, now);
      const east = a.target?.labels["topology.kubernetes.io/region"];
      if (east !== "us-east") remote++;
    }
    // Spilling: some picks leave the origin's region, so the captured lists are not the home list.
    assert.ok(remote > 0);
    // The twin's own filter never ran (its hysteresis state was never set); the shadow's did.
    assert.ok(shadowSpilled > 0);
    assert.equal(twinSpilled, 0);
  });

  it("refuses a config without a locality-filter, saying which", async () => {
    const text = readFileSync("config/examples/default.yaml", "utf8");
    await assert.rejects(
      spillSetPair("default~spill-set", text, 1),
      /default~spill-set: needs exactly one locality-filter/,
    );
  });

  it("--help prints usage and exits 0; an unknown option prints usage and exits 2", () => {
    const out = execFileSync(process.execPath, ["--import", "tsx", "src/bench/picker-bench.ts", "--help"], {
      encoding: "utf8",
    });
    assert.match(out, /^Usage: npm run bench:picker -- \[options\]/);
    assert.match(out, /~spill-set/);
    const bad = spawnSync(process.execPath, ["--import", "tsx", "src/bench/picker-bench.ts", "--nope"], {
      encoding: "utf8",
    });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /Unknown option '--nope'/);
    assert.match(bad.stderr, /Usage:/);
  });
});
