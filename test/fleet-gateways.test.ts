/**
 * Several gateway replicas in the fleet simulator (src/sim/fleet/gateways.ts): unsynced, each
 * approximate index learns from 1/N of the decisions and the fleet's real prefix hit rate falls;
 * synced (the merge `kvgate serve --nats` runs) it stays near one gateway's. Precise routing reads
 * the replicas' own KV events, so several gateways agree without any sync. One "synced" gateway is
 * exactly one gateway.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { test } from "node:test";
import { loadScenario, parseScenario } from "../src/sim/fleet/scenario.ts";
import { simulate, stripWallClock } from "../src/sim/fleet/simulate.ts";

const SCENARIO = `
name: gateways-test
seed: 7
fleet: { replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 120000, maxModelLen: 8192 }
routers:
  - { name: one, config: ../config/examples/default.yaml }
  - { name: one-synced, config: ../config/examples/default.yaml, gateways: { replicas: 1, sync: true } }
  - { name: four, config: ../config/examples/default.yaml, gateways: { replicas: 4 } }
  - { name: four-synced, config: ../config/examples/default.yaml, gateways: { replicas: 4, sync: true } }
  - { name: precise-one, config: ../config/examples/precise-sim.yaml }
  - { name: precise-four, config: ../config/examples/precise-sim.yaml, gateways: { replicas: 4 } }
workload:
  workload: shared-prefix
  numRequests: 240
  options: { numGroups: 40, promptsPerGroup: 6, systemPromptLen: 1500, questionLen: 100, outputLen: 32 }
  arrival: { type: poisson, rate: 12 }
scrapeIntervalMs: 100
kvEventsDelayMs: 5
`;

test("N gateways: unsynced approximate indexes lose hits, synced ones keep them, precise needs no sync", async () => {
  const sc = parseScenario(SCENARIO, resolve("scenarios/gateways-test.yaml"));
  const res = await simulate(sc);
  const hit = new Map(res.runs.map((r) => [r.router, r.prefix_cache_hit_rate as number]));
  const one = hit.get("one") as number;
  const four = hit.get("four") as number;
  const synced = hit.get("four-synced") as number;
  assert.ok(one > 0.6, `one gateway finds the shared prefixes (hit rate ${one})`);
  assert.ok(four < one - 0.1, `four unsynced gateways lose hits: ${four} vs ${one}`);
  assert.ok(synced > one - 0.03, `four synced gateways keep them: ${synced} vs ${one}`);
  const p1 = hit.get("precise-one") as number;
  const p4 = hit.get("precise-four") as number;
  assert.ok(Math.abs(p4 - p1) < 0.03, `precise: four gateways without sync ${p4} vs one ${p1}`);
  // One gateway with sync on has no peer: the same run, figure for figure.
  const strip = (name: string) => {
    const r = stripWallClock(res).runs.find((x) => x.router === name) as Record<string, unknown>;
    const { router: _r, router_config: _c, ...rest } = r;
    return JSON.stringify(rest);
  };
  assert.equal(strip("one-synced"), strip("one"));
});

test("scenarios/gateways-sync.yaml: 1/2/4/8 gateways, synced and unsynced, and precise at 8 both ways", () => {
  const sc = loadScenario("scenarios/gateways-sync.yaml");
  assert.deepEqual(
    sc.routers.map((r) => [r.name, r.gateways?.replicas ?? 1, r.gateways?.sync != null]),
    [
      ["gw1", 1, false],
      ["gw2-unsynced", 2, false],
      ["gw2-synced", 2, true],
      ["gw4-unsynced", 4, false],
      ["gw4-synced", 4, true],
      ["gw8-unsynced", 8, false],
      ["gw8-synced", 8, true],
      ["gw8-precise", 8, false],
      ["gw8-precise-synced", 8, true],
    ],
  );
  assert.deepEqual(sc.routers[2].gateways?.sync, { delay: 0.001, interval: 0.02 });
});
