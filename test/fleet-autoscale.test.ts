/**
 * Autoscaling in the fleet simulator (src/sim/fleet/autoscale.ts): replicas asked for join the
 * router's candidates only after the start-up delay, drained replicas get no new requests and leave
 * once idle, the GPU-seconds meter charges a replica from the ask to its departure, and an
 * autoscaling scenario file runs end to end with every policy on the same requests.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import type { AutoscalePolicy, PoolDecision, PoolSample } from "../src/autoscale/types.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import { admissionFromConfig } from "../src/flow/admission.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { AutoscaleController } from "../src/sim/fleet/autoscale.ts";
import { formatAutoscale, runAutoscaleScenario } from "../src/sim/fleet/autoscale-run.ts";
import { parseAutoscaleScenario } from "../src/sim/fleet/autoscale-scenario.ts";
import { runFleet } from "../src/sim/fleet/fleet.ts";
import { curveRate, curveStages } from "../src/sim/fleet/load-curves.ts";
import { parseScenario } from "../src/sim/fleet/scenario.ts";

const FILE = resolve("scenarios/test-autoscale.yaml");

/** Asks for fixed counts at fixed times (a schedule, not a rule): what the controller does with them is under test. */
class Scripted implements AutoscalePolicy {
  readonly name = "scripted";
  readonly interval = 5;
  constructor(readonly plan: [number, number][]) {}
  observe(): void {}
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    let want = pools[0].target;
    for (const [t, n] of this.plan) if (now >= t) want = n;
    return [{ pool: pools[0].name, role: "aggregated", desired: want, reason: "scripted" }];
  }
}

async function runScripted(plan: [number, number][], startup: number) {
  const sc = parseScenario(
    `
name: scale
seed: 5
fleet: { replicas: 1, profile: llama-3.1-8b-h100, maxNumSeqs: 64 }
routers: [{ name: lr, config: ../config/examples/least-request.yaml }]
workload:
  workload: random
  numRequests: 600
  options: { inputLen: { mean: 500, std: 0 }, outputLen: { mean: 50, std: 0 } }
  arrival: { type: constant, rate: 10 }
`,
    FILE,
  );
  const created = await createScheduler(sc.routers[0].configText, { seed: 1 });
  const ctl = new AutoscaleController(
    [{ name: "p", role: "aggregated", gpus: 1, initial: 1 }],
    new Scripted(plan),
    startup,
  );
  const picks: { now: number; target: string | null }[] = [];
  const res = runFleet({
    fleet: sc.fleet,
    workload: generateWorkload(sc.workload),
    scheduler: created.scheduler,
    admission: admissionFromConfig(created.config).admission,
    seed: 5,
    scrapeInterval: 0.1,
    gatewayDelay: 0,
    routerTokenizer: false,
    observer: {
      onArrive: (n, r) => ctl.onArrive(n, r),
      onResolved: (n, r) => ctl.onResolved(n, r),
      onStepEnd: (n, i, s) => ctl.onStepEnd(n, i, s),
      onSchedule: (now, _f, _c, target) => picks.push({ now, target }),
    },
    membership: ctl,
  });
  return { ctl, picks, res };
}

describe("fleet autoscaling", () => {
  it("a replica asked for at 10 s serves from 10 + 30 s, not before, and is charged from 10 s", async () => {
    const { ctl, picks, res } = await runScripted([[10, 2]], 30);
    const first = picks.find((p) => p.target === "sim-1:8000");
    assert.ok(first !== undefined, "the new replica served requests");
    assert.ok(first.now >= 40 - 1e-9, `first pick at ${first.now}`);
    assert.ok(
      picks.some((p) => p.now >= 40 && p.target === "sim-0:8000"),
      "both serve after it joined",
    );
    assert.equal(ctl.actions.length, 1);
    assert.deepEqual(
      ctl.actions.map((a) => [a.time, a.from, a.to]),
      [[10, 1, 2]],
    );
    const expected = res.endTime + (res.endTime - 10);
    assert.ok(
      Math.abs(ctl.gpuSeconds(res.endTime) - expected) < 1e-6,
      `${ctl.gpuSeconds(res.endTime)} vs ${expected}`,
    );
    assert.equal(res.counters.completed, 600);
  });

  it("a drained replica gets no new request, finishes what it holds and stops costing", async () => {
    const { ctl, picks, res } = await runScripted(
      [
        [0, 2],
        [30, 1],
      ],
      5,
    );
    // Asked for at 5 s (the first decision), serving from 10 s, told to drain at 30 s.
    const down = ctl.actions.find((a) => a.to === 1);
    assert.ok(down !== undefined && down.time === 30);
    const drained = picks.filter((p) => p.now > 30);
    const ids = new Set(drained.map((p) => p.target));
    assert.equal(ids.size, 1, `after the drain every pick goes to one replica: ${[...ids]}`);
    const gone = ctl.sizes.find((s) => s.time >= 30 && s.draining === 0 && s.ready === 1);
    assert.ok(gone !== undefined, "the drained replica left");
    // Replica 0 for the whole run, replica 1 from 5 s to at most a few seconds after 30 s.
    const gpu = ctl.gpuSeconds(res.endTime);
    assert.ok(gpu >= res.endTime + 25 - 1e-6 && gpu <= res.endTime + 25 + 5, `GPU-seconds ${gpu}`);
    assert.equal(res.counters.completed + res.counters.dropped, 600);
    assert.equal(res.counters.dropped, 0);
  });

  it("load curves: a diurnal cosine from trough to peak, a flash crowd, a ramp, cut into stages", () => {
    const d = { type: "diurnal" as const, duration: 100, trough: 2, peak: 10 };
    assert.equal(curveRate(d, 0), 2);
    assert.ok(Math.abs(curveRate(d, 50) - 10) < 1e-9);
    const f = { type: "flash" as const, duration: 100, base: 1, peak: 9, at: 40, length: 20, rise: 10 };
    assert.deepEqual([curveRate(f, 39), curveRate(f, 45), curveRate(f, 55), curveRate(f, 60)], [1, 5, 9, 1]);
    const st = curveStages({ type: "ramp", duration: 25, from: 1, to: 6, step: 10 });
    assert.deepEqual(
      st.map((s) => [s.rate, s.duration]),
      [
        [2, 10],
        [4, 10],
        [5.5, 5],
      ],
    );
  });

  it("an autoscale scenario runs each policy on the same requests and prints the comparison", async () => {
    const sc = parseAutoscaleScenario(
      `
name: tiny
seed: 3
fleet: { replicas: 3, profile: llama-3.1-8b-h100 }
routers: [{ name: d, config: ../config/examples/default.yaml }]
workload:
  workload: random
  options: { inputLen: { mean: 400, std: 50 }, outputLen: { mean: 40, std: 10 } }
autoscale:
  startupDelay: 20
  pools: [{ name: vllm, min: 1, max: 3, initial: 1 }]
  slo: { ttft: 2, itl: 0.05, attainment: 0.95 }
  curve: { type: flash, duration: 120, base: 5, peak: 60, at: 30, length: 60, step: 10 }
  policies: [kvgate, wva, dynamo, kpa, hpa-gpu]
`,
      FILE,
    );
    const results = await runAutoscaleScenario(sc);
    assert.deepEqual(
      results.map((r) => r.policy),
      ["kvgate", "wva", "dynamo", "kpa", "hpa-gpu"],
    );
    const n = results[0].requests;
    assert.ok(n > 3000);
    for (const r of results) {
      assert.equal(r.requests, n, "same workload for every policy");
      // At least the one replica that serves throughout, at most all three for the whole run.
      assert.ok(r.gpuHours >= r.endTime / 3600 - 1e-9 && r.gpuHours <= (3 * r.endTime) / 3600 + 1e-9);
    }
    const kv = results[0];
    assert.ok(kv.actions >= 1 && kv.pools[0].peakReady >= 2, "kvgate scaled up for the crowd");
    const table = formatAutoscale(sc, results);
    assert.match(table, /\| kvgate \| \d+\.\d% \| (yes|no) \| \d+\.\d\d \|/);
    assert.equal(
      table.split("\n").filter((l) => l.startsWith("| ")).length,
      7,
      "header, rule and one row per policy",
    );
  });

  it("an autoscale section with an unknown field or bounds out of order is an error naming it", () => {
    const base = `
name: bad
seed: 1
fleet: { replicas: 2, profile: llama-3.1-8b-h100 }
routers: [{ name: d, config: ../config/examples/default.yaml }]
workload: { workload: random }
autoscale:
  startupDelay: 20
  slo: { ttft: 2, itl: 0.05, attainment: 0.95 }
  curve: { type: ramp, duration: 60, from: 1, to: 2 }
  policies: [kvgate]
`;
    assert.throws(
      () =>
        parseAutoscaleScenario(`${base}  pools: [{ name: v, min: 1, max: 2, initial: 1, surge: 2 }]\n`, FILE),
      /autoscale\.pools\.0\.surge: unknown field; allowed: name, min, max, initial$/,
    );
    assert.throws(
      () =>
        parseAutoscaleScenario(
          `${base}  pools: [{ name: v, min: 1, max: 2, initial: 1 }]\n  burst: 1\n`,
          FILE,
        ),
      /: autoscale\.burst: unknown field; allowed: startupDelay, sampleInterval, pools, slo, policies, curve, window$/,
    );
    assert.throws(
      () =>
        parseAutoscaleScenario(
          base.replace("to: 2 }", "to: 2, peak: 3 }") +
            "  pools: [{ name: v, min: 1, max: 2, initial: 1 }]\n",
          FILE,
        ),
      /autoscale\.curve\.peak: unknown field; allowed: type, duration, from, to, step$/,
    );
    assert.throws(
      () => parseAutoscaleScenario(`${base}  pools: [{ name: v, min: 2, max: 3, initial: 1 }]\n`, FILE),
      /min ≤ initial ≤ max/,
    );
  });
});
