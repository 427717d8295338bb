/**
 * The precise router in the fleet simulator: a precise-prefix-cache-producer fed by the simulated
 * engines' own KV events. On a small shared-prefix fleet whose KV caches evict, it matches or beats
 * the approximate router's hit rate; events reach its index exactly kvEventsDelay after the step
 * that published them (checked against shadow indexes at every routing decision); the engines'
 * block hash changes nothing; runs replay identically; and routers without a precise producer make
 * the engines record no events.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { isDeepStrictEqual } from "node:util";
import { admissionFromConfig } from "../src/flow/admission.ts";
import type { KVEventBatch } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { preciseProducers, runFleet } from "../src/sim/fleet/fleet.ts";
import { replicaId } from "../src/sim/fleet/replica.ts";
import { parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";
import { type SimResults, scenarioWorkload, simulate, stripWallClock } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-precise.yaml");

/**
 * 4 replicas with 6,000 KV tokens each; 8 groups with 1,500-token system prompts (12,000 resident
 * tokens in all), so every replica evicts unless the groups are partitioned.
 */
const scenario = (extra = "", routers = "", arrival = "{ type: poisson, rate: 12 }") => `
name: precise
seed: 3
fleet: { replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 6000, maxModelLen: 4096, maxNumSeqs: 64 }
routers:
  - { name: approximate, config: ../config/examples/estimated.yaml }
  - { name: precise, config: ../config/examples/precise-sim.yaml }
${routers}
workload:
  workload: shared-prefix
  numRequests: 320
  options: { numGroups: 8, promptsPerGroup: 6, systemPromptLen: 1500, questionLen: 100, outputLen: 40 }
  arrival: ${arrival}
${extra}
`;

const runs = new Map<string, Promise<SimResults>>();
function results(extra = ""): Promise<SimResults> {
  let r = runs.get(extra);
  if (r === undefined) {
    r = simulate(parseScenario(scenario(extra), FILE));
    runs.set(extra, r);
  }
  return r;
}

const by = (r: SimResults, name: string) => {
  const run = r.runs.find((x) => x.router === name);
  assert.ok(run, `router ${name}`);
  return run;
};

type IndexStats = Record<string, number>;
const indexStats = (r: SimResults): IndexStats => {
  const sim = by(r, "precise").simulation as { precise_index: Record<string, IndexStats> };
  const all = Object.values(sim.precise_index);
  assert.equal(all.length, 1);
  return all[0];
};

describe("precise router in the fleet simulator", () => {
  it("matches or beats the approximate router's hit rate on a fleet that evicts", async () => {
    const r = await results();
    const precise = by(r, "precise");
    const approx = by(r, "approximate");
    assert.equal(precise.completed, 320);
    assert.ok(
      (precise.prefix_cache_hit_rate ?? 0) >= (approx.prefix_cache_hit_rate ?? 0),
      `precise ${precise.prefix_cache_hit_rate} vs approximate ${approx.prefix_cache_hit_rate}`,
    );
    const s = indexStats(r);
    // The engines evicted cached blocks and the index followed: stores and removals, all applied.
    assert.ok(s.storedBlocks > 1000, `stored ${s.storedBlocks}`);
    assert.ok(s.removedBlocks > 100, `removed ${s.removedBlocks}`);
    for (const k of [
      "unknownParent",
      "removedUnknown",
      "blockSizeMismatch",
      "malformed",
      "requests_without_tokens",
    ])
      assert.equal(s[k], 0, k);
    assert.equal(s.requests, 320);
    // The router saw what the engines hold: its hit ratio is the engines' within a few points.
    assert.ok(Math.abs(s.hit_ratio - (precise.prefix_cache_hit_rate ?? 0)) < 0.05, `${s.hit_ratio}`);
  });

  it("works with the engines' fast block hash: the same run as with vLLM's sha256_cbor", async () => {
    const fast = await results();
    const sha = await results("blockHash: sha256_cbor");
    assert.equal((fast.scenario.fleet as { block_hash: string }).block_hash, "fast64");
    assert.equal((sha.scenario.fleet as { block_hash: string }).block_hash, "sha256_cbor");
    const strip = (r: SimResults) => {
      const s = stripWallClock(r);
      return {
        ...s,
        scenario: { ...s.scenario, fleet: { ...(s.scenario.fleet as object), block_hash: "" } },
      };
    };
    assert.deepStrictEqual(strip(fast), strip(sha));
  });

  it("records KV events only in the runs of routers with a precise producer", async () => {
    const r = await results();
    assert.equal(by(r, "approximate").simulation.kv_events, false);
    assert.equal(by(r, "precise").simulation.kv_events, true);
    assert.ok((by(r, "precise").simulation.kv_event_batches as number) > 0);
    assert.equal(by(r, "approximate").simulation.kv_event_batches, undefined);
    // And the engines of a run without one publish nothing.
    const sc = parseScenario(scenario(), FILE);
    const { workload } = scenarioWorkload(sc, true);
    const { scheduler, config } = await createScheduler(sc.routers[0].configText, { seed: sc.seed });
    let batches = 0;
    runFleet({
      fleet: sc.fleet,
      workload,
      scheduler,
      admission: admissionFromConfig(config).admission,
      seed: sc.seed,
      scrapeInterval: sc.scrapeInterval,
      gatewayDelay: sc.gatewayDelay,
      routerTokenizer: false,
      kvEventsDelay: sc.kvEventsDelay,
      observer: { onStepEnd: (_t, _rep, res) => void (res.kvEvents !== null && batches++) },
    });
    assert.equal(batches, 0);
  });

  /**
   * Runs the precise router with shadows of its index, one fed each batch when due (step end +
   * delay), one at the step's end, and checks at every decision that the router saw the first.
   * Returns how many decisions the second would have changed.
   */
  async function checkDelivery(delay: number, arrival?: string): Promise<number> {
    const sc = parseScenario(scenario(`kvEventsDelayMs: ${delay * 1000}`, "", arrival), FILE);
    assert.equal(sc.kvEventsDelay, delay);
    const { workload } = scenarioWorkload(sc);
    const router = sc.routers.find((r) => r.name === "precise");
    assert.ok(router);
    // The index must hold what the engines' events say and nothing else: no speculative picks.
    const configText = router.configText.replace("speculativeIndexing: true", "speculativeIndexing: false");
    assert.notEqual(configText, router.configText);
    const { scheduler, config } = await createScheduler(configText, { seed: sc.seed });
    const [producer] = preciseProducers(scheduler);
    assert.ok(producer);
    const due = new PreciseIndex({ keyer: producer.index.keyer });
    const instant = new PreciseIndex({ keyer: producer.index.keyer });
    for (let i = 0; i < sc.fleet.replicas; i++) {
      due.setEndpointModel(replicaId(i), sc.fleet.model);
      instant.setEndpointModel(replicaId(i), sc.fleet.model);
    }
    const published: { at: number; endpoint: string; batch: KVEventBatch }[] = [];
    let applied = 0;
    let decisions = 0;
    let hidden = 0;
    runFleet({
      fleet: sc.fleet,
      workload,
      scheduler,
      admission: admissionFromConfig(config).admission,
      seed: sc.seed,
      scrapeInterval: sc.scrapeInterval,
      gatewayDelay: sc.gatewayDelay,
      routerTokenizer: sc.routerTokenizer,
      kvEventsDelay: sc.kvEventsDelay,
      observer: {
        onStepEnd(now, rep, res) {
          if (res.kvEvents === null) return;
          published.push({ at: now, endpoint: replicaId(rep), batch: res.kvEvents });
          for (const ev of res.kvEvents.events) instant.applyEvent(replicaId(rep), ev);
        },
        onSchedule(now, req, candidates) {
          // Due at step end + delay, and applied before a request arriving at that very time.
          for (; applied < published.length && published[applied].at + delay <= now; applied++)
            for (const ev of published[applied].batch.events) due.applyEvent(published[applied].endpoint, ev);
          assert.ok(req.tokenIds, "a precise router gets the prompt's token ids");
          const keys = producer.index.keyer.keys(req.tokenIds, req.model);
          const ids = candidates.map((c) => c.id);
          const seen = producer.index.longestPrefix(keys, ids, now);
          assert.deepStrictEqual(
            seen,
            due.longestPrefix(keys, ids, now),
            `request ${req.requestId} at t=${now}`,
          );
          if (!isDeepStrictEqual(seen, instant.longestPrefix(keys, ids, now))) hidden++;
          decisions++;
        },
      },
    });
    assert.equal(decisions, 320);
    return hidden;
  }

  it("applies each step's events exactly kvEventsDelay after the step's end", async () => {
    // Some decisions came before blocks already stored (or removed) became visible.
    assert.ok((await checkDelivery(0.4)) > 0, "no decision fell inside a delay window");
  });

  it("with no delay, a request arriving at a step's end sees that step's events", async () => {
    // Closed-loop users send their next request at the step end that finished the last one.
    assert.equal(await checkDelivery(0, "{ type: closed, users: 16 }"), 0);
  });

  it("replays identically", async () => {
    const a = await simulate(parseScenario(scenario(), FILE), { routers: ["precise"], quick: true });
    const b = await simulate(parseScenario(scenario(), FILE), { routers: ["precise"], quick: true });
    assert.deepStrictEqual(stripWallClock(a), stripWallClock(b));
  });

  it("refuses a precise producer whose block size is not the engines'", async () => {
    const inline = `  - name: precise-64
    config:
      plugins:
        - { type: precise-prefix-cache-producer, parameters: { blockSizeTokens: 64 } }
        - { type: prefix-cache-scorer }
        - { type: max-score-picker }
      schedulingProfiles:
        - { name: default, plugins: [{ pluginRef: prefix-cache-scorer }, { pluginRef: max-score-picker }] }`;
    const sc = parseScenario(scenario("", inline), FILE);
    await assert.rejects(
      simulate(sc, { routers: ["precise-64"], quick: true }),
      (e: unknown) =>
        e instanceof ScenarioError &&
        /blockSizeTokens 64 must equal the fleet's block size 16/.test(e.message),
    );
  });
});
