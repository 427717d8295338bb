/**
 * Flow control in the fleet simulator, against hand-worked cases in virtual time: a request that
 * waits at the gateway is dispatched at the very instant the saturation detector's gate clears (a
 * response ends), a full sheddable band answers 429 rejected-saturated and the breakdown counts
 * it, the TTL sweep answers 503 rejected-ttl-expired; and the controller's holdback keeps the top
 * of the ceiling for a flow below its share.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { breakdown } from "../src/bench/breakdown.ts";
import { requestMetrics } from "../src/bench/metrics.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import { Admission } from "../src/flow/admission.ts";
import { FlowController, type FlowControlSettings } from "../src/flow/flow-control.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { runFleet } from "../src/sim/fleet/fleet.ts";
import { FlowSim } from "../src/sim/fleet/flow.ts";
import { parseScenario } from "../src/sim/fleet/scenario.ts";

const FLEET = parseScenario(
  `
name: t
seed: 3
fleet: { replicas: 1, profile: llama-3.1-8b-h100, maxNumSeqs: 8 }
routers: [{ name: r, config: { plugins: [{ type: queue-scorer }, { type: max-score-picker }] } }]
workload: { workload: random, numRequests: 1 }
`,
  resolve("scenarios/t.yaml"),
).fleet;

function config(maxConcurrency: number, flowControl: string): string {
  return `featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: concurrency-detector
  parameters: { maxConcurrency: ${maxConcurrency} }
schedulingProfiles: [{ name: default, plugins: [{ pluginRef: queue-scorer }, { pluginRef: max-score-picker }] }]
flowControl:
  saturationDetector: { pluginRef: concurrency-detector }
${flowControl}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: { name: sheddable }
spec: { priority: -10 }
`;
}

async function run(cfg: string, streams: Record<string, unknown>[]) {
  const created = await createScheduler(cfg, { seed: 3 });
  const flow = FlowSim.of(created.scheduler) as FlowSim;
  assert.ok(flow instanceof FlowSim, "the flowControl gate gives the run a FlowSim");
  const workload = generateWorkload({ workload: "mix", seed: 3, options: { streams } });
  const objectives = new Map(Object.entries(created.config.objectives));
  const res = runFleet({
    fleet: FLEET,
    workload,
    scheduler: created.scheduler,
    admission: new Admission(),
    flow,
    objectives,
    seed: 3,
    scrapeInterval: 0.1,
    gatewayDelay: 0,
    routerTokenizer: false,
  });
  const byId = new Map(res.records.map((r) => [r.id, r]));
  return { res, flow, workload, objectives, byId };
}

const stream = (name: string, n: number, extra: Record<string, unknown> = {}) => ({
  name,
  tenant: name,
  workload: "random",
  numRequests: n,
  arrival: { type: "constant", rate: 1000 },
  options: { inputLen: 64, outputLen: 20 },
  ...extra,
});

describe("flow control in the fleet simulator", () => {
  it("a request waiting at the gateway is dispatched when the gate clears, in virtual time", async () => {
    // maxConcurrency 1: the first request saturates the pool (1/1), the second waits for its end.
    const { res, flow, byId } = await run(config(1, ""), [stream("a", 2)]);
    const first = byId.get("a-r0");
    const second = byId.get("a-r1");
    assert.ok(first && second && !first.error && !second.error);
    assert.ok(second.start > first.start, "the second request arrives after the first");
    // It starts (first token) only after the first request has ended, and waited exactly that long.
    const ttft2 = requestMetrics(second, false).ttft as number;
    assert.ok(second.start + ttft2 > first.end, "second's first token after the first's end");
    assert.equal(flow.stats.dispatched, 2);
    assert.equal(flow.stats.dispatchedAtOnce, 1);
    assert.ok(Math.abs(flow.stats.waitMax - (first.end - second.start)) < 1e-9);
    assert.equal(res.counters.completed, 2);
  });

  it("a full sheddable band answers 429 rejected-saturated, counted per priority", async () => {
    // One in flight, one queued (band maxRequests 1), the third is turned away at once.
    const bands = `  priorityBands:\n  - { priority: -10, maxRequests: "1" }`;
    const { byId, workload, objectives, res } = await run(config(1, bands), [
      stream("x", 3, { objective: "sheddable" }),
    ]);
    const third = byId.get("x-r2");
    assert.equal(third?.error?.status, 429);
    assert.equal(third?.error?.reason, "rejected-saturated");
    assert.ok(!byId.get("x-r0")?.error && !byId.get("x-r1")?.error);
    const b = breakdown(res.records, workload.requests, objectives);
    assert.deepEqual(
      b?.by_priority.map((g) => [g.group, g.completed, g.rejected]),
      [["sheddable (-10)", 2, { "429 rejected-saturated": 1 }]],
    );
  });

  it("a request queued past the TTL gets 503 rejected-ttl-expired at the sweep", async () => {
    // The first request (400 output tokens) holds the gate for well over the 0.5 s TTL; the sweep
    // runs a virtual second after the second request queued.
    const { byId } = await run(config(1, '  defaultRequestTTL: "500ms"'), [
      stream("a", 2, { options: { inputLen: 64, outputLen: 400 } }),
    ]);
    const second = byId.get("a-r1");
    assert.equal(second?.error?.status, 503);
    assert.equal(second?.error?.reason, "rejected-ttl-expired");
    assert.ok(Math.abs((second?.end ?? 0) - (second?.start ?? 0) - 1) < 1e-6, "expired at the 1 s sweep");
    assert.equal(byId.get("a-r0")?.error, undefined);
  });
});

describe("holdback (vtc-fairness-policy)", () => {
  const settings = (holdback: number): FlowControlSettings => ({
    maxRequests: 0,
    maxBytes: 0,
    defaultRequestTTL: 60,
    noEndpointRequestTTL: 60,
    bands: [],
    defaultBand: {
      maxRequests: 0,
      maxBytes: 0,
      fairness: { kind: "vtc", promptTokenWeight: 1, outputTokenWeight: 2, holdback },
      ordering: "fcfs",
    },
    defaultNegativeBand: null,
    usageLimit: { kind: "static", threshold: 1 },
    flowGcAfter: 300,
  });
  const req = (id: string, fairnessId: string) => ({
    id,
    fairnessId,
    priority: 0,
    bytes: 10,
    receivedAt: 0,
    promptTokens: 10,
  });
  /** Dispatches while the gate (5 slots, saturation = in flight / 5) lets anything go. */
  const drain = (c: FlowController, inflight: string[]) => {
    for (let d = c.dispatch(0, inflight.length / 5); d; d = c.dispatch(0, inflight.length / 5))
      inflight.push(d.request.fairnessId);
  };

  /** B sent one request that was served: the band knows two flows. */
  const knowsB = (c: FlowController) => {
    c.enqueue(req("b-early", "B"), 0);
    assert.equal(c.dispatch(0, 0)?.request.id, "b-early");
    c.completed("B", 0, 1);
  };

  it("a flooding flow stops at ceiling − holdback; a newcomer goes at once, up to its share", () => {
    const c = new FlowController(settings(0.4));
    knowsB(c);
    for (let i = 0; i < 6; i++) c.enqueue(req(`a${i}`, "A"), 0);
    const inflight: string[] = [];
    drain(c, inflight);
    // A alone holds all the band has in flight (its share): dispatched at 0, 0.2, 0.4; held at 0.6.
    assert.deepEqual(inflight, ["A", "A", "A"]);
    c.enqueue(req("b0", "B"), 0);
    c.enqueue(req("b1", "B"), 0);
    c.enqueue(req("b2", "B"), 0);
    drain(c, inflight);
    // B (0 in flight, then 1 < share 4/2) takes the two held-back slots; at 1.0 nothing goes.
    assert.deepEqual(inflight, ["A", "A", "A", "B", "B"]);
    // A request of A ends: 4 in flight, A 2 = share 2 is not below it, B 2 neither → held at 0.8.
    c.completed("A", 0, 1);
    inflight.splice(0, 1);
    drain(c, inflight);
    assert.equal(inflight.length, 4);
    assert.equal(c.snapshot(0).bands[0].flows.find((f) => f.fairnessId === "A")?.inflight, 2);
  });

  it("without holdback the flood fills the gate and a newcomer waits", () => {
    const c = new FlowController(settings(0));
    knowsB(c);
    for (let i = 0; i < 6; i++) c.enqueue(req(`a${i}`, "A"), 0);
    const inflight: string[] = [];
    drain(c, inflight);
    c.enqueue(req("b0", "B"), 0);
    drain(c, inflight);
    assert.deepEqual(inflight, ["A", "A", "A", "A", "A"]);
  });

  it("a band that has only ever seen one flow holds nothing back", () => {
    const c = new FlowController(settings(0.4));
    for (let i = 0; i < 10; i++) c.enqueue(req(`a${i}`, "A"), 0);
    const inflight: string[] = [];
    drain(c, inflight);
    assert.equal(inflight.length, 5);
    // Once B has been seen (and until it is forgotten), A's next dispatches stop at the holdback.
    c.enqueue(req("b0", "B"), 0);
    for (let k = 0; k < 3; k++) {
      c.completed("A", 0, 1);
      inflight.splice(inflight.indexOf("A"), 1);
    }
    drain(c, inflight);
    assert.deepEqual(inflight.sort(), ["A", "A", "B"]);
    c.completed("A", 0, 1);
    inflight.splice(inflight.indexOf("A"), 1);
    drain(c, inflight);
    assert.deepEqual(inflight.sort(), ["A", "A", "B"], "A held at 0.6 with B still known");
  });

  it("released (never served) frees the flow's slot as completion does", () => {
    const c = new FlowController(settings(0.4));
    knowsB(c);
    for (let i = 0; i < 4; i++) c.enqueue(req(`a${i}`, "A"), 0);
    const inflight: string[] = [];
    drain(c, inflight);
    assert.equal(inflight.length, 3);
    c.released("A", 0);
    inflight.pop();
    drain(c, inflight);
    assert.equal(inflight.length, 3);
    assert.equal(c.size, 0);
  });
});

describe("shipped flow scenarios", () => {
  it("load, and every router's config loads", async () => {
    const { loadScenario } = await import("../src/sim/fleet/scenario.ts");
    for (const f of ["flow-noisy-neighbour", "flow-priority-mix", "flow-slo-mixed-length"]) {
      const sc = loadScenario(`scenarios/${f}.yaml`);
      assert.equal(sc.workload.workload, "mix", f);
      for (const r of sc.routers) await createScheduler(r.configText, { seed: 1 });
    }
  });

  it("priority mix: sheddable requests get 429, critical ones are all served first", async () => {
    const { loadScenario } = await import("../src/sim/fleet/scenario.ts");
    const { simulate } = await import("../src/sim/fleet/simulate.ts");
    const sc = loadScenario("scenarios/flow-priority-mix.yaml");
    const res = await simulate(sc, { routers: ["vtc", "off"] });
    const [fc, off] = res.runs.map((r) => r.breakdown?.by_priority ?? []);
    const by = (gs: typeof fc, name: string) => gs.find((g) => g.group.startsWith(name));
    assert.ok((by(fc, "sheddable")?.rejected["429 rejected-saturated"] ?? 0) > 0);
    assert.deepEqual(by(fc, "critical")?.rejected, {});
    assert.equal(by(fc, "critical")?.completed, by(fc, "critical")?.requests);
    // With flow control critical requests go first: their TTFT p90 is below the no-flow-control run's.
    assert.ok((by(fc, "critical")?.ttft_p90_s ?? 1) < (by(off, "critical")?.ttft_p90_s ?? 0));
  });
});
