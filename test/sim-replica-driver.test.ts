/**
 * The replica driver: outputs are delivered no earlier than their step's endTime on the scaled clock,
 * steps run back to back in simulated time, falling behind is measured as lag without stretching the
 * modelled timeline, and cancellation frees the request. A fake wall clock makes "behind" exact.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Engine } from "../src/engine/engine.ts";
import type { RequestRecord, StepResult } from "../src/engine/types.ts";
import { type DriverOutput, ReplicaDriver } from "../src/sim/replica-driver.ts";
import { engineConfig } from "./helpers/engine-fixtures.ts";

const tick = () => new Promise((r) => setTimeout(r, 1));

function setup(timeScale = 100) {
  const clock = { ms: 0 };
  const steps: StepResult[] = [];
  const finished: RequestRecord[] = [];
  const engine = new Engine(engineConfig({ numGpuBlocks: 400, maxModelLen: 4096 }));
  const driver = new ReplicaDriver(engine, {
    timeScale,
    wallMs: () => clock.ms,
    onStep: (s) => steps.push(s),
    onFinish: (r) => finished.push(r),
  });
  return { clock, steps, finished, engine, driver };
}

function collect(driver: ReplicaDriver) {
  const outs: { out: DriverOutput; deliveredAt: number }[] = [];
  let error: Error | null = null;
  const sink = {
    onOutput: (out: DriverOutput) => outs.push({ out, deliveredAt: driver.simNow() }),
    onError: (e: Error) => (error = e),
  };
  return { outs, sink, error: () => error };
}

const prompt = (n: number, base = 1) => Array.from({ length: n }, (_, i) => base + i);

test("delivers each step no earlier than its endTime, steps back to back", async (t) => {
  const { clock, steps, driver } = setup();
  t.after(() => driver.close());
  const a = collect(driver);
  const b = collect(driver);
  driver.submit({ id: "a", promptTokenIds: prompt(300), maxTokens: 6, ignoreEos: true }, a.sink);
  driver.submit({ id: "b", promptTokenIds: prompt(50, 1000), maxTokens: 4, ignoreEos: true }, b.sink);
  // Advance the fake wall clock in small increments (0.02 ms wall = 2 ms simulated at 100×).
  for (let i = 0; i < 20_000 && (a.outs.at(-1)?.out.finishReason ?? null) === null; i++) {
    clock.ms += 0.02;
    await tick();
  }
  for (let i = 0; i < 2000 && (b.outs.at(-1)?.out.finishReason ?? null) === null; i++) {
    clock.ms += 0.02;
    await tick();
  }
  assert.equal(
    a.outs.reduce((n, o) => n + o.out.newTokenIds.length, 0),
    6,
  );
  assert.equal(
    b.outs.reduce((n, o) => n + o.out.newTokenIds.length, 0),
    4,
  );
  for (const o of [...a.outs, ...b.outs]) assert.ok(o.deliveredAt >= o.out.time, "delivered before due");
  // While busy, each step starts where the previous one ended.
  for (let i = 1; i < steps.length; i++) assert.equal(steps[i]!.startTime, steps[i - 1]!.endTime);
  assert.equal(a.outs.at(-1)!.out.finishReason, "length");
  assert.ok(a.outs.at(-1)!.out.record, "the finishing output carries the record");
  assert.equal(driver.inFlight, 0);
});

test("falling behind is measured as lag and does not stretch the modelled timeline", async (t) => {
  const { clock, driver, finished } = setup();
  t.after(() => driver.close());
  const a = collect(driver);
  driver.submit({ id: "a", promptTokenIds: prompt(100), maxTokens: 20, ignoreEos: true }, a.sink);
  await tick(); // first step computed at t = 0
  clock.ms += 1000; // the process "stalls" for 1 s of wall time = 100 simulated seconds
  for (let i = 0; i < 200 && !a.outs.at(-1)?.out.record; i++) await tick();
  const rec = a.outs.at(-1)!.out.record!;
  assert.equal(rec.outputTokenIds.length, 20);
  // The engine's timeline is as modelled: 20 tokens take well under a simulated second, not 100 s.
  assert.ok(rec.finishTime! - rec.arrivalTime < 5, `modelled e2e ${rec.finishTime! - rec.arrivalTime}`);
  assert.ok(driver.lag.max > 90 && driver.lag.max <= 100, `lag.max ${driver.lag.max}`);
  assert.equal(driver.lag.current, 0, "idle again: no current lag");
  assert.equal(finished.length, 1);
  // Delivered late, never early.
  for (const o of a.outs) assert.ok(o.deliveredAt >= o.out.time);
});

test("an arrival while idle starts a step at its arrival time", async (t) => {
  const { clock, steps, driver } = setup();
  t.after(() => driver.close());
  clock.ms = 50; // simulated 5 s
  const a = collect(driver);
  driver.submit({ id: "a", promptTokenIds: prompt(20), maxTokens: 1, ignoreEos: true }, a.sink);
  for (let i = 0; i < 500 && a.outs.length === 0; i++) {
    clock.ms += 0.05;
    await tick();
  }
  assert.equal(steps[0]!.startTime, 5);
  assert.equal(a.outs[0]!.out.record!.arrivalTime, 5);
});

test("cancel aborts the request, frees its blocks and stops its outputs", async (t) => {
  const { clock, driver, engine, finished } = setup();
  t.after(() => driver.close());
  const a = collect(driver);
  const h = driver.submit({ id: "a", promptTokenIds: prompt(200), maxTokens: 1000, ignoreEos: true }, a.sink);
  for (let i = 0; i < 500 && a.outs.length < 3; i++) {
    clock.ms += 0.1;
    await tick();
  }
  assert.ok(engine.stats().kvCacheUsage > 0);
  h.cancel();
  h.cancel(); // idempotent
  const delivered = a.outs.length;
  for (let i = 0; i < 20; i++) {
    clock.ms += 1;
    await tick();
  }
  assert.equal(a.outs.length, delivered, "no outputs after cancel");
  const s = engine.stats();
  assert.equal(s.numRequestsRunning, 0);
  assert.equal(s.requestSuccess.abort, 1);
  assert.equal(s.numFreeBlocks, 399, "every block is free again (cached ones are evictable)");
  assert.equal(finished.at(-1)!.finishReason, "abort");
  assert.equal(driver.inFlight, 0);
});

test("a delayed admission holds the request back in simulated time", async (t) => {
  const { clock, driver } = setup();
  t.after(() => driver.close());
  const a = collect(driver);
  driver.submit({ id: "a", promptTokenIds: prompt(20), maxTokens: 1, ignoreEos: true }, a.sink, { delay: 2 });
  for (let i = 0; i < 2000 && a.outs.length === 0; i++) {
    clock.ms += 0.5;
    await tick();
  }
  const rec = a.outs[0]!.out.record!;
  assert.ok(rec.arrivalTime >= 2, `arrival ${rec.arrivalTime}`);
});
