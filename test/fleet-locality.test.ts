/**
 * Regions in the fleet simulator: a scenario's locality section merges each region's traffic,
 * tags requests with their origin, and charges the round trip to requests served in another
 * region (both ways, in TTFT); locality-filter keeps them home. Bad sections are errors naming
 * the field.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { formatLocality } from "../src/sim/fleet/format-locality.ts";
import { parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";
import { simulate } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-locality.yaml");
const R = "topology.kubernetes.io/region";

const LOCAL = (spill: boolean) =>
  `{ plugins: [ { type: locality-filter, parameters: { labels: [${R}], spill: ${spill} } }, { type: queue-scorer }, { type: max-score-picker } ],
     schedulingProfiles: [ { name: default, plugins: [ { pluginRef: locality-filter }, { pluginRef: queue-scorer }, { pluginRef: max-score-picker } ] } ] }`.replace(
    /\s*\n\s*/g,
    " ",
  );
const GLOBAL = "{ plugins: [ { type: round-robin-picker } ] }";

function scenario(
  locality: string,
  routers = `  - { name: local, config: ${LOCAL(false)} }\n  - { name: global, config: ${GLOBAL} }`,
) {
  return parseScenario(
    `
name: test-locality
seed: 3
fleet:
  kvTokens: 40000
  maxModelLen: 8192
  pools:
    - { replicas: 2, profile: llama-3.1-8b-h100, labels: { ${R}: east } }
    - { replicas: 2, profile: llama-3.1-8b-h100, labels: { ${R}: west } }
routers:
${routers}
workload:
  workload: random
  numRequests: 30
  options: { inputLen: { mean: 500, std: 0, min: 500, max: 500 }, outputLen: { mean: 10, std: 0, min: 10, max: 10 }, api: completion }
  arrival: { type: poisson, rate: 4 }
${locality}
slo: ttft=100ms
`,
    FILE,
  );
}

const TWO = `locality:
  rttMs: { east/west: 200 }
  origins:
    - { region: east }
    - { region: west, numRequests: 10 }`;

describe("fleet simulator: regions", () => {
  it("local-only keeps every request in its region; a global router pays the round trip on remote ones", async () => {
    const res = await simulate(scenario(TWO));
    const [local, global] = res.runs;
    const rows = (run: typeof local) => Object.fromEntries((run.locality ?? []).map((o) => [o.origin, o]));
    const l = rows(local);
    assert.deepEqual([l.east.requests, l.west.requests], [30, 10]);
    assert.deepEqual([l.east.local_share, l.west.local_share], [1, 1]);
    const g = rows(global);
    // Round-robin over four replicas, two per region: about half leave their region.
    for (const o of [g.east, g.west])
      assert.ok((o.local_share as number) > 0.2 && (o.local_share as number) < 0.8);
    // A remote request pays 100 ms each way: the global router's TTFT p90 is past the 200 ms
    // round trip, the local router's far below it, so only the local one meets the 100 ms SLO.
    assert.ok((g.east.ttft_p90 as number) > 0.2, `global p90 ${g.east.ttft_p90}`);
    assert.ok((l.east.ttft_p90 as number) < 0.1, `local p90 ${l.east.ttft_p90}`);
    assert.equal(l.east.slo_attainment, 1);
    assert.ok((g.east.slo_attainment as number) < 0.8);
    assert.match(formatLocality(res), /by region of origin[\s\S]*local\s+east\s+30\s+0\s+100\.0%/);
  });

  it("merges the regions' traffic by time with prefixed ids, each region on its own seed", async () => {
    const { scenarioWorkload } = await import("../src/sim/fleet/simulate.ts");
    const { workload } = scenarioWorkload(scenario(TWO));
    const ids = workload.requests.map((r) => r.id);
    assert.equal(ids.filter((id) => id.startsWith("east/")).length, 30);
    assert.equal(ids.filter((id) => id.startsWith("west/")).length, 10);
    for (let i = 1; i < workload.requests.length; i++)
      assert.ok(workload.requests[i].arrivalTime >= workload.requests[i - 1].arrivalTime);
    const east = workload.requests.find((r) => r.origin === "east");
    const west = workload.requests.find((r) => r.origin === "west");
    assert.notEqual(east?.prompt, west?.prompt, "regions draw their prompts from different seeds");
  });

  it("rejects a missing round trip, a pool without a region and a duplicated origin, naming the fix", () => {
    assert.throws(
      () => scenario("locality:\n  origins: [ { region: east }, { region: west } ]"),
      (e: Error) =>
        e instanceof ScenarioError &&
        /locality: rttMs: no round-trip time for "east\/west"; add it/.test(e.message),
    );
    assert.throws(
      () =>
        scenario(`locality:\n  rttMs: { east/west: 10 }\n  origins: [ { region: east }, { region: east } ]`),
      /region east is listed twice/,
    );
    assert.throws(
      () =>
        parseScenario(
          `name: x\nseed: 1\nfleet: { replicas: 2, profile: llama-3.1-8b-h100 }\nrouters: [ { name: a, config: ${GLOBAL} } ]\nworkload: { workload: random, numRequests: 4 }\nlocality: { origins: [ { region: east } ] }\n`,
          FILE,
        ),
      /fleet pool 0 has no topology.kubernetes.io\/region label/,
    );
  });

  it("P/D across regions: a KV transfer between a decoder and a prefiller in different regions crosses their link", async () => {
    const pd = (local: boolean) => {
      const loc = local
        ? `{ type: locality-filter, parameters: { labels: [${R}], spillThreshold: 100, recoverThreshold: 100 } },`
        : "";
      const ref = local ? "{ pluginRef: locality-filter }," : "";
      return `{ plugins: [ ${loc} { type: queue-scorer }, { type: prefill-filter }, { type: decode-filter }, { type: max-score-picker },
        { type: disagg-profile-handler, parameters: { deciders: { prefill: always-disagg-pd-decider } } }, { type: always-disagg-pd-decider } ],
        schedulingProfiles: [
          { name: prefill, plugins: [ { pluginRef: prefill-filter }, ${ref} { pluginRef: queue-scorer }, { pluginRef: max-score-picker } ] },
          { name: decode, plugins: [ { pluginRef: decode-filter }, ${ref} { pluginRef: queue-scorer }, { pluginRef: max-score-picker } ] } ] }`.replace(
        /\s*\n\s*/g,
        " ",
      );
    };
    const sc = parseScenario(
      `
name: test-locality-pd
seed: 3
fleet:
  kvTokens: 40000
  maxModelLen: 8192
  pools:
    - { role: prefill, replicas: 1, profile: llama-3.1-8b-h100, labels: { ${R}: east } }
    - { role: decode, replicas: 1, profile: llama-3.1-8b-h100, labels: { ${R}: east } }
    - { role: prefill, replicas: 1, profile: llama-3.1-8b-h100, labels: { ${R}: west } }
    - { role: decode, replicas: 1, profile: llama-3.1-8b-h100, labels: { ${R}: west } }
routers:
  - { name: global, config: ${pd(false)} }
  - { name: local, config: ${pd(true)} }
workload:
  workload: random
  numRequests: 30
  options: { inputLen: { mean: 2000, std: 0, min: 2000, max: 2000 }, outputLen: { mean: 10, std: 0, min: 10, max: 10 }, api: completion }
  arrival: { type: poisson, rate: 4 }
locality:
  rttMs: { east/west: 20 }
  bandwidthGbps: { east/west: 1 }
  origins:
    - { region: east }
    - { region: west, numRequests: 30 }
`,
      FILE,
    );
    const res = await simulate(sc);
    const pdOf = (k: number) =>
      (
        res.runs[k].simulation as unknown as {
          pd: { transfers: number; cross_region_transfers: number; transfer_p50_s: number };
        }
      ).pd;
    const [global, local] = [pdOf(0), pdOf(1)];
    assert.ok(global.cross_region_transfers > 0 && global.cross_region_transfers < global.transfers);
    assert.equal(local.cross_region_transfers, 0);
    assert.equal(local.transfers, 60);
  });
});
