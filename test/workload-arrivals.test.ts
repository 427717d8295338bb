// Arrival processes (Poisson rate, gamma burstiness, constant spacing, stages, closed loop) and
// the workload spec (presets, defaults, strict option checking).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DEMO_DEFAULTS, demoWorkloadSpec } from "../src/bench/demo.ts";
import {
  applyArrivals,
  arrivalTimes,
  interArrivalGaps,
  planArrivals,
  stageCount,
} from "../src/bench/workloads/arrivals.ts";
import { LLMD_73_STAGES } from "../src/bench/workloads/presets.ts";
import { streamRng } from "../src/bench/workloads/sampling.ts";
import { generateWorkload, parseWorkloadYaml, resolveWorkloadSpec } from "../src/bench/workloads/spec.ts";

const meanOf = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const cvOf = (xs: number[]) => {
  const m = meanOf(xs);
  return Math.sqrt(meanOf(xs.map((x) => (x - m) ** 2))) / m;
};

describe("rate processes", () => {
  test("Poisson: mean rate within 3% over 20,000 arrivals, CV of gaps ≈ 1", () => {
    const gaps = interArrivalGaps(streamRng(1, "t"), "poisson", 8, 20_000);
    const rate = 1 / meanOf(gaps);
    assert.ok(Math.abs(rate - 8) / 8 < 0.03, `rate ${rate}`);
    assert.ok(Math.abs(cvOf(gaps) - 1) < 0.05, `cv ${cvOf(gaps)}`);
  });

  test("gamma: CV of gaps = 1/sqrt(burstiness), mean rate kept", () => {
    for (const k of [0.25, 1, 4]) {
      const gaps = interArrivalGaps(streamRng(2, `g${k}`), "gamma", 5, 20_000, k);
      const cv = cvOf(gaps);
      assert.ok(Math.abs(cv - 1 / Math.sqrt(k)) / (1 / Math.sqrt(k)) < 0.06, `k=${k} cv=${cv}`);
      assert.ok(Math.abs(1 / meanOf(gaps) - 5) / 5 < 0.05);
    }
  });

  test("constant: exactly 1/rate apart from the start", () => {
    assert.deepEqual(arrivalTimes(streamRng(0, "c"), "constant", 4, 3, { start: 10 }), [10, 10.25, 10.5]);
  });

  test("fit rescales so the last of n arrivals lands at start + n/rate", () => {
    const t = arrivalTimes(streamRng(3, "f"), "poisson", 10, 50, { start: 2, fit: true });
    assert.ok(Math.abs(t[49] - 7) < 1e-9);
    assert.ok(t.every((x, i) => i === 0 || x >= t[i - 1]));
  });
});

describe("stages", () => {
  test("each stage gets floor(rate × duration) arrivals inside its window", () => {
    const plan = planArrivals(
      {
        type: "stages",
        stages: [
          { rate: 3, duration: 20 },
          { rate: 2.5, duration: 3 },
          { rate: 0.1, duration: 30 },
        ],
        interval: 5,
      },
      undefined,
      4,
    );
    assert.deepEqual(
      plan.stages.map((s) => [s.count, s.start]),
      [
        [60, 0],
        [7, 25],
        [3, 33],
      ],
    );
    for (const s of plan.stages) {
      const own = plan.slots.filter((x) => x.stage === s.index);
      assert.equal(own.length, s.count);
      assert.ok(own.every((x) => x.time > s.start && x.time <= s.start + s.duration + 1e-9));
    }
    assert.equal(stageCount(0.1, 30), 3);
  });

  test("llmd-73 preset: warm-up 750 then the profile's 16-stage ladder, barriered with 30 s pauses", () => {
    const w = generateWorkload({ preset: "llmd-73" });
    assert.deepEqual(
      w.stages.map((s) => s.rate),
      [15, 3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60],
    );
    assert.equal(w.stages[0].count, 750);
    assert.ok(w.stages[0].warmup && w.stages.slice(1).every((s) => !s.warmup));
    assert.equal(
      w.stages.reduce((a, s) => a + s.count, 0),
      w.requests.length,
    );
    assert.deepEqual(w.stageBarrier, { interval: 30 });
    assert.equal(LLMD_73_STAGES[4].duration, 38);
    const first = w.requests[0];
    assert.equal(first.kind, "completion");
    assert.equal(first.promptTokensApprox, 7200);
    assert.equal(first.maxTokens, 1000);
  });
});

describe("closed loop", () => {
  test("users chain their requests: the first starts on the ramp, the rest after the previous one", () => {
    const plan = planArrivals({ type: "closed", users: 3, thinkTime: 0.5, rampUp: 3 }, 7, 1);
    const units = Array.from({ length: 7 }, (_, i) => [
      { kind: "completion" as const, prompt: `p${i}`, promptTokensApprox: 1, maxTokens: 1 },
    ]);
    const reqs = applyArrivals(units, plan);
    assert.deepEqual(
      reqs.slice(0, 3).map((r) => [r.arrivalTime, r.after]),
      [
        [0, undefined],
        [1, undefined],
        [2, undefined],
      ],
    );
    assert.deepEqual(reqs[3].after, { id: "r0", delay: 0.5 });
    assert.deepEqual(reqs[6].after, { id: "r3", delay: 0.5 });
    assert.deepEqual(
      reqs.map((r) => r.turn),
      [1, 1, 1, 2, 2, 2, 3],
    );
  });

  test("warm-up: each user's first `warmup` requests are marked, the rest are not", () => {
    const plan = planArrivals({ type: "closed", users: 3, warmup: 2 }, 8, 1);
    const units = Array.from({ length: 8 }, (_, i) => [
      { kind: "completion" as const, prompt: `p${i}`, promptTokensApprox: 1, maxTokens: 1 },
    ]);
    const reqs = applyArrivals(units, plan);
    assert.deepEqual(
      reqs.map((r) => [r.turn, r.warmup === true]),
      [
        [1, true],
        [1, true],
        [1, true],
        [2, true],
        [2, true],
        [2, true],
        [3, false],
        [3, false],
      ],
    );
    const none = applyArrivals(units, planArrivals({ type: "closed", users: 3 }, 8, 1));
    assert.ok(none.every((r) => r.warmup === undefined));
    assert.throws(() => planArrivals({ type: "closed", users: 3, warmup: 1.5 }, 8, 1), /closed.warmup/);
    assert.throws(
      () => resolveWorkloadSpec({ preset: "tutorial", arrival: { type: "closed", users: 3, warmup: -1 } }),
      /spec\.arrival\.warmup: Too small: expected number to be >=0/,
    );
  });

  test("the demo's workload: the tutorial with each user's first (cold) question as warm-up", () => {
    const w = generateWorkload(demoWorkloadSpec(DEMO_DEFAULTS));
    const warm = w.requests.filter((r) => r.warmup);
    assert.equal(warm.length, DEMO_DEFAULTS.users);
    assert.ok(warm.every((r) => r.turn === 1 && !r.after));
    assert.equal(new Set(warm.map((r) => r.groupId)).size, DEMO_DEFAULTS.users);
  });

  test("tutorial preset: 150 users, user u always sends group u", () => {
    const w = generateWorkload({ preset: "tutorial" });
    assert.equal(w.requests.length, 750);
    const byId = new Map(w.requests.map((r) => [r.id, r]));
    for (const r of w.requests) {
      assert.equal(r.promptTokensApprox, 7000);
      if (r.after) assert.equal(byId.get(r.after.id)!.groupId, r.groupId);
    }
    assert.equal(w.requests.filter((r) => !r.after).length, 150);
  });
});

describe("workload spec", () => {
  test("defaults and preset merge; user options win; unknown options are rejected", () => {
    const s = resolveWorkloadSpec({ preset: "llmd-73", options: { numGroups: 10 } });
    assert.equal(s.workload, "shared-prefix");
    assert.equal(s.options["numGroups"], 10);
    assert.equal(s.options["systemPromptLen"], 6000);
    assert.equal(s.seed, 42);
    assert.throws(() => resolveWorkloadSpec({ workload: "random", options: { numGroups: 3 } }), /numGroups/);
    assert.throws(
      () => resolveWorkloadSpec({ workload: "random", arrival: { type: "poisson", rate: -1 } }),
      /spec\.arrival\.rate \(--rate\): Too small: expected number to be >0/,
    );
    assert.throws(() => resolveWorkloadSpec({ preset: "nope" }), /unknown preset/);
    assert.throws(() => resolveWorkloadSpec({}), /workload name/);
    assert.throws(
      () => generateWorkload({ workload: "random", arrival: { type: "poisson", rate: 1 } }),
      /numRequests/,
    );
  });

  test("an unknown key names the keys that are valid there", () => {
    assert.throws(
      () => resolveWorkloadSpec({ preset: "smoke", options: { foo: 1 } }),
      (e: Error) =>
        /shared-prefix options: unknown key "foo"/.test(e.message) &&
        /valid: numGroups, promptsPerGroup, systemPromptLen, questionLen, outputLen, api, order\)/.test(
          e.message,
        ),
    );
    assert.throws(
      () => resolveWorkloadSpec({ workload: "random", options: { numGroups: 3 } }),
      /random options: unknown key "numGroups" \(valid: inputLen, outputLen, api\)/,
    );
    assert.throws(
      () => parseWorkloadYaml("workload: random\narrival: {type: gamma, rate: 1, burstiness: 1, foo: 2}\n"),
      /workload file\.arrival: unknown key "foo" \(valid: type, rate, burstiness\)/,
    );
    assert.throws(
      () => resolveWorkloadSpec({ workload: "random", arrival: { type: "poisson", rate: 0 } }),
      /arrival\.rate \(--rate\)/,
    );
    assert.throws(
      () => resolveWorkloadSpec({ preset: "smoke", workload: "random" }),
      /not random: drop one of the two/,
    );
  });

  test("YAML spec files parse strictly", () => {
    const input = parseWorkloadYaml(
      "workload: multi-turn\nseed: 3\nnumRequests: 2\narrival: {type: gamma, rate: 4, burstiness: 0.5}\noptions:\n  turns: 2\n",
    );
    const w = generateWorkload(input);
    assert.equal(w.requests.length, 4);
    assert.equal(w.seed, 3);
    assert.throws(() => parseWorkloadYaml("workload: random\nsed: 3\n"), /sed|unrecognized/i);
  });

  test("changing the arrival process leaves the prompts as they were", () => {
    const a = generateWorkload({ preset: "smoke", arrival: { type: "poisson", rate: 1 } });
    const b = generateWorkload({ preset: "smoke", arrival: { type: "constant", rate: 9 } });
    assert.deepEqual(
      a.requests.map((r) => r.prompt),
      b.requests.map((r) => r.prompt),
    );
  });
});
