/** Parallel simulation (routers in worker threads) gives exactly the sequential results. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { formatSaturatedStages } from "../src/sim/fleet/format.ts";
import { scaleScenario } from "../src/sim/fleet/scale.ts";
import { loadScenario } from "../src/sim/fleet/scenario.ts";
import { simulate, stripWallClock } from "../src/sim/fleet/simulate.ts";

test("jobs 2 and jobs 1 produce identical results, in the scenario's router order", async () => {
  const file = fileURLToPath(new URL("../scenarios/tutorial.yaml", import.meta.url));
  const sc = loadScenario(file);
  const routers = ["precise", "round-robin", "default"].filter((r) => sc.routers.some((x) => x.name === r));
  const started: string[] = [];
  const seq = await simulate(sc, { quick: true, routers, jobs: 1 });
  const par = await simulate(sc, { quick: true, routers, jobs: 2, onRouterStart: (n) => started.push(n) });
  assert.deepEqual(stripWallClock(par), stripWallClock(seq));
  assert.deepEqual(
    par.runs.map((r) => r.router),
    sc.routers.filter((r) => routers.includes(r.name)).map((r) => r.name),
  );
  assert.equal(started[0], "precise", "the event-fed router is handed out first");
});

test("an unknown router in a worker is an error, not a hang", async () => {
  const file = fileURLToPath(new URL("../scenarios/tutorial.yaml", import.meta.url));
  const sc = loadScenario(file);
  const broken = { ...sc, routers: [...sc.routers.slice(0, 1), { ...sc.routers[0], name: "nope" }] };
  await assert.rejects(simulate(broken, { quick: true, jobs: 2 }), /unknown router "nope"/);
});

test("a seed override reaches the workers: other draws, and the same ones in a thread or a worker", async () => {
  const file = fileURLToPath(new URL("../scenarios/no-sharing-overload.yaml", import.meta.url));
  // Two routers: simulate runs a single one in its own thread, whatever the jobs.
  const routers = ["least-request", "round-robin"];
  const base = loadScenario(file);
  const sc = loadScenario(file, { seed: 7 });
  assert.equal(sc.seed, 7);
  const seq = await simulate(sc, { quick: true, routers, jobs: 1 });
  const par = await simulate(sc, { quick: true, routers, jobs: 2, seed: 7 });
  assert.deepEqual(stripWallClock(par), stripWallClock(seq));
  const orig = await simulate(base, { quick: true, routers, jobs: 1 });
  assert.equal(seq.runs[0].seed, 7);
  assert.equal(seq.runs[0].workload.seed, 7);
  assert.notEqual(seq.runs[0].ttft_p90_s, orig.runs[0].ttft_p90_s, "other prompts, other latencies");
});

test("every run on the scenario's fleet carries the scenario's limits, whichever worker ran it", async () => {
  const file = fileURLToPath(new URL("../scenarios/no-sharing-overload.yaml", import.meta.url));
  const sc = loadScenario(file);
  // Six routers on two workers: the worker that computed the limits runs more than one.
  const par = await simulate(sc, { quick: true, jobs: 2 });
  assert.equal(par.runs.length, 6);
  for (const r of par.runs) assert.equal(r.limits, par.limits, `${r.router}'s limits are the scenario's`);
  assert.doesNotMatch(formatSaturatedStages(par), /own fleet/);
});

test("a scale factor reaches the workers: a fleet twice the size, the same in a thread or a worker", async () => {
  const file = fileURLToPath(new URL("../scenarios/multi-turn.yaml", import.meta.url));
  const routers = ["least-request", "round-robin"];
  const sc = scaleScenario(loadScenario(file), 2);
  const seq = await simulate(sc, { quick: true, routers, jobs: 1 });
  const par = await simulate(sc, { quick: true, routers, jobs: 2 });
  assert.deepEqual(stripWallClock(par), stripWallClock(seq));
  const scenario = par.scenario as { scale?: number; fleet: { replicas: number } };
  assert.equal(scenario.fleet.replicas, 16);
  assert.equal(scenario.scale, 2);
  const plain = await simulate(loadScenario(file), { quick: true, routers, jobs: 1 });
  assert.ok(par.runs[0].requests > 1.8 * plain.runs[0].requests, "twice the sessions arrive");
});

test("workers: one router runs in a worker thread (as kvgate simulate runs it), with the same results", async () => {
  const file = fileURLToPath(new URL("../scenarios/tutorial.yaml", import.meta.url));
  const sc = loadScenario(file);
  const routers = ["default"];
  const thread = await simulate(sc, { quick: true, routers, jobs: 1 });
  const worker = await simulate(sc, { quick: true, routers, jobs: 1, workers: true });
  assert.deepEqual(stripWallClock(worker), stripWallClock(thread));
  // Only the worker path needs the file: the scenario without one is refused there.
  const inline = { ...sc, origin: "(inline)" };
  await assert.rejects(simulate(inline, { quick: true, routers, workers: true }), /loaded from a file/);
});
