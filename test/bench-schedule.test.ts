// The arrival scheduler (pure, clock-free): open-loop times, `after` dependencies, barriered
// stages with their pause, and cascading over empty stages.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ArrivalScheduler } from "../src/bench/schedule.ts";
import type { RequestSpec, StageInfo, Workload } from "../src/bench/workloads/types.ts";

const req = (id: string, arrivalTime: number, extra: Partial<RequestSpec> = {}): RequestSpec => ({
  id,
  arrivalTime,
  kind: "completion",
  prompt: id,
  promptTokensApprox: 1,
  maxTokens: 1,
  ...extra,
});
const stage = (index: number, start: number, count: number): StageInfo => ({
  index,
  rate: 1,
  duration: 10,
  start,
  count,
  warmup: false,
});
const ids = (xs: Array<{ spec: RequestSpec }>) => xs.map((x) => x.spec.id);

test("open-loop requests come due at their arrival times, in order", () => {
  const w: Workload = { name: "t", seed: 0, requests: [req("b", 2), req("a", 1), req("c", 2)], stages: [] };
  const s = new ArrivalScheduler(w);
  assert.equal(s.nextTime(), 1);
  assert.deepEqual(ids(s.takeDue(0.5)), []);
  assert.deepEqual(ids(s.takeDue(2)), ["a", "b", "c"]);
  assert.equal(s.done, true);
  assert.equal(s.nextTime(), undefined);
});

test("an `after` request starts at its dependency's completion + delay", () => {
  const w: Workload = {
    name: "t",
    seed: 0,
    requests: [req("u1", 0), req("u2", 99, { after: { id: "u1", delay: 0.5 } })],
    stages: [],
  };
  const s = new ArrivalScheduler(w);
  assert.deepEqual(ids(s.takeDue(0)), ["u1"]);
  assert.equal(s.nextTime(), undefined, "nothing known until u1 completes");
  s.complete("u1", 3);
  assert.equal(s.nextTime(), 3.5);
  assert.deepEqual(
    s.takeDue(10).map((x) => x.time),
    [3.5],
  );
});

test("barriered stages open when the previous one drained, plus the interval, keeping offsets", () => {
  const w: Workload = {
    name: "t",
    seed: 0,
    requests: [
      req("a", 1, { stage: 0 }),
      req("b", 4, { stage: 0 }),
      req("c", 12, { stage: 1 }), // 2 s into stage 1 (nominal start 10)
      req("d", 25, { stage: 3 }), // stage 2 is empty
    ],
    stages: [stage(0, 0, 2), stage(1, 10, 1), stage(2, 20, 0), stage(3, 22, 1)],
    stageBarrier: { interval: 5 },
  };
  const s = new ArrivalScheduler(w);
  assert.equal(s.stageStart(0), 0);
  assert.deepEqual(ids(s.takeDue(100)), ["a", "b"], "stage 1 waits for stage 0 however late it is");
  s.complete("a", 30);
  assert.equal(s.nextTime(), undefined);
  s.complete("b", 40);
  assert.equal(s.stageStart(1), 45);
  assert.deepEqual(
    s.takeDue(100).map((x) => [x.spec.id, x.time]),
    [["c", 47]],
  );
  s.complete("c", 50);
  assert.equal(s.stageStart(2), 55, "the empty stage opens and closes at once");
  assert.equal(s.stageStart(3), 60);
  assert.deepEqual(
    s.takeDue(100).map((x) => [x.spec.id, x.time]),
    [["d", 63]],
  );
});

test("without a barrier, stages keep their nominal starts", () => {
  const w: Workload = {
    name: "t",
    seed: 0,
    requests: [req("a", 1, { stage: 0 }), req("c", 12, { stage: 1 })],
    stages: [stage(0, 0, 1), stage(1, 10, 1)],
  };
  const s = new ArrivalScheduler(w);
  assert.equal(s.stageStart(1), 10);
  assert.deepEqual(ids(s.takeDue(12)), ["a", "c"]);
});
