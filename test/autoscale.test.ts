/**
 * The autoscaling policies (src/autoscale) on hand-worked cases: kvgate's recommender sizes a pool
 * from the profile's throughput (a linear toy profile whose capacity is worked out by hand), answers
 * a spike within one interval and does not flap under noise around a threshold; each baseline's
 * formula against its published rule (WVA's saturation analyzer, Dynamo's SLA planner, Knative's
 * KPA, the HPA's ratio with tolerance and scale-down stabilisation).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { dynamoDecode, dynamoPrefill } from "../src/autoscale/baselines/dynamo.ts";
import { HpaGpuPolicy, hpaDesired } from "../src/autoscale/baselines/hpa.ts";
import { kpaDesired } from "../src/autoscale/baselines/kpa.ts";
import { wvaStep } from "../src/autoscale/baselines/wva.ts";
import { aggregatedCapacity, steadyState } from "../src/autoscale/capacity.ts";
import { type PoolSpec, Recommender } from "../src/autoscale/recommender.ts";
import type { PoolSample, Sample } from "../src/autoscale/types.ts";
import type { Profile } from "../src/engine/profile.ts";
import { rng as seededRng } from "./helpers/rng.ts";

/**
 * A profile whose step is linear: T = 0.01 + 1e-4·B + 1e-6·P for B decodes at context 1,050 and P
 * prefill tokens (2 KV bytes per token read at 2.1e7 B/s, 1,000 GEMM parameters at 2e9 FLOP/s,
 * attention switched off). With I = 1,000 uncached prompt tokens and O = 100 output tokens the
 * steady state is B = λ·O·T and P = λ·T·I, so T = 0.01 / (1 − λ·(1e-4·100 + 1e-6·1000)) =
 * 0.01 / (1 − 0.011·λ); the ITL objective 50 ms binds at 1 − 0.011·λ = 0.2, λ = 72.73 req/s.
 */
const weights = 1001 / 2.1e7;
const TOY: Profile = {
  name: "toy-linear",
  description: "",
  model: {
    name: "toy",
    numLayers: 1,
    hiddenSize: 1,
    numHeads: 1,
    numKvHeads: 1,
    headDim: 1,
    intermediateSize: 1,
    vocabSize: 1,
    paramsNonEmbedding: 1000,
    dtypeBytes: 1,
  },
  hardware: { gpu: "toy", tensorParallel: 1, memBandwidth: 2.1e7, peakFlops: 2e9, memGiB: 1 },
  efficiency: { weights: 1, kv: 1, prefillMfu: 1, attentionMfu: 1e12, tpOverhead: 0 },
  stepOverhead: 0.01 - weights,
  perRequestOverhead: 0,
  kvCapacityTokens: 1e6,
  defaults: { maxNumSeqs: 1024, maxNumBatchedTokens: 8192, maxModelLen: 4096 },
  sources: [],
};
const LIMITS = { maxNumSeqs: 1024, maxNumBatchedTokens: 8192, kvTokens: 1e6 };
const LOAD = { inputTokens: 1000, outputTokens: 100, hitRate: 0 };
const SLO = { ttft: 1, itl: 0.05, attainment: 0.95 };
const POOL: PoolSpec = {
  name: "p",
  role: "aggregated",
  profile: TOY,
  limits: LIMITS,
  bounds: { min: 1, max: 20 },
};
const HAND_CAPACITY = 0.8 / 0.011; // λ where T = 50 ms

function sample(now: number, rate: number, target: number, period = 2): Sample {
  const arrivals = Math.round(rate * period);
  return {
    now,
    period,
    traffic: {
      arrivals,
      inputTokens: arrivals * 1000,
      completions: arrivals,
      outputTokens: arrivals * 100,
      completedInputTokens: arrivals * 1000,
      cachedTokens: 0,
      ttfts: new Array(arrivals).fill(0.1),
      tpots: new Array(arrivals).fill(0.02),
    },
    pools: [poolState(target)],
  };
}
function poolState(target: number): PoolSample {
  return {
    name: "p",
    role: "aggregated",
    ready: target,
    starting: 0,
    target,
    replicas: Array.from({ length: target }, () => ({ kvUsage: 0.3, waiting: 0, running: 10, busy: 0.9 })),
  };
}

describe("capacity model", () => {
  test("the toy profile's step follows the hand-worked fixed point T = 0.01 / (1 − 0.011·λ)", () => {
    for (const lambda of [10, 40, 70]) {
      const s = steadyState(TOY, LIMITS, LOAD, lambda);
      const t = 0.01 / (1 - 0.011 * lambda);
      assert.ok(Math.abs(s.step - t) / t < 0.02, `λ=${lambda}: step ${s.step} vs ${t}`);
      assert.ok(Math.abs(s.batch - lambda * 100 * s.step) < 1e-6);
    }
  });
  test("capacity is where the step reaches the ITL objective: λ = 0.8 / 0.011 = 72.7 req/s", () => {
    const cap = aggregatedCapacity(TOY, LIMITS, LOAD, SLO);
    assert.ok(Math.abs(cap - HAND_CAPACITY) / HAND_CAPACITY < 0.01, `capacity ${cap}`);
  });
  test("a prefix-cached share of the prompt raises capacity (less prefill per request)", () => {
    const cold = aggregatedCapacity(TOY, LIMITS, LOAD, SLO);
    const warm = aggregatedCapacity(TOY, LIMITS, { ...LOAD, hitRate: 0.9 }, SLO);
    // 1 − λ(0.01 + 1e-6·100) = 0.2 → λ = 79.2 req/s.
    assert.ok(warm > cold && Math.abs(warm - 0.8 / 0.0101) / (0.8 / 0.0101) < 0.01, `warm ${warm}`);
  });
});

describe("kvgate recommender", () => {
  test("steady load: 200 req/s at 80% of 72.7 req/s per replica → ⌈200 / 58.2⌉ = 4 replicas", () => {
    const r = new Recommender({ pools: [POOL], slo: SLO, startupDelay: 120 });
    for (let t = 2; t <= 300; t += 2) r.observe(sample(t, 200, 1));
    const [d] = r.decide(300, [poolState(1)]);
    assert.equal(d.desired, Math.ceil(200 / (0.8 * HAND_CAPACITY)));
    assert.equal(d.desired, 4);
    assert.match(d.reason, /^up: /);
  });

  test("a spike is answered in the first decision after it: 50 → 300 req/s", () => {
    const r = new Recommender({ pools: [POOL], slo: SLO, startupDelay: 120 });
    for (let t = 2; t <= 600; t += 2) r.observe(sample(t, 50, 1));
    assert.equal(r.decide(600, [poolState(1)])[0].desired, 1);
    for (let t = 602; t <= 615; t += 2) r.observe(sample(t, 300, 1));
    const [d] = r.decide(615, [poolState(1)]);
    // The 30 s window holds 7 samples of 300 and 8 of 50: (7·600 + 8·100) / 30 = 166.7 req/s. The
    // 300 s least-squares line (t = 316…614: 143 samples of 50, 7 of 300) projects 125.1 req/s to
    // 615 + 120 + 15 s, below the 30 s rate, so the rate decides:
    // ⌈166.7 / (0.8 · 72.7)⌉ = ⌈2.86⌉ = 3, at once (no cooldown) from 1.
    assert.equal(d.desired, Math.ceil((7 * 600 + 8 * 100) / 30 / (0.8 * HAND_CAPACITY)));
    assert.equal(d.desired, 3);
    assert.match(d.reason, /^up: /);
  });

  test("no flapping: an hour of ±5% noise around one replica's capacity changes the count at most once", () => {
    const rng = seededRng(3);
    const r = new Recommender({ pools: [POOL], slo: SLO, startupDelay: 120 });
    let target = 1;
    let changes = 0;
    const threshold = 0.8 * HAND_CAPACITY;
    for (let t = 2; t <= 3600; t += 2) {
      r.observe(sample(t, threshold * (0.95 + 0.1 * rng()), target));
      if (t % 16 === 0) {
        const [d] = r.decide(t, [poolState(target)]);
        if (d.desired !== target) {
          changes++;
          target = d.desired;
        }
      }
    }
    assert.ok(changes <= 1, `${changes} changes`);
  });

  test("scale-down waits for the load to fit fewer replicas with 10% to spare for 180 s", () => {
    const r = new Recommender({ pools: [POOL], slo: SLO, startupDelay: 120 });
    for (let t = 2; t <= 600; t += 2) r.observe(sample(t, 20, 4));
    const first = r.decide(600, [poolState(4)])[0];
    assert.equal(first.desired, 4);
    assert.match(first.reason, /^hold: 1 would do/);
    for (let t = 602; t <= 780; t += 2) r.observe(sample(t, 20, 4));
    assert.equal(r.decide(780, [poolState(4)])[0].desired, 1);
  });
});

describe("baselines against their published rules", () => {
  test("WVA: +1 when the average spare KV < 0.10 or spare queue < 3, not while a replica is pending", () => {
    const sat = [
      { kv: 0.85, queue: 0 },
      { kv: 0.72, queue: 2 },
    ];
    // Only the second is non-saturated: spare kv 0.08 < 0.10.
    assert.equal(wvaStep(sat, 0).delta, 1);
    assert.equal(wvaStep(sat, 1).delta, 0);
    const fine = [
      { kv: 0.75, queue: 1 },
      { kv: 0.5, queue: 0 },
    ];
    // Spare kv (0.05 + 0.30)/2 = 0.175, queue (4 + 5)/2 = 4.5; spread over one: kv 1.25 → no scale-down.
    assert.equal(wvaStep(fine, 0).delta, 0);
  });
  test("WVA: −1 when the load spread over N − 1 replicas still leaves the spare triggers", () => {
    const idle = [0, 1, 2].map(() => ({ kv: 0.1, queue: 0 }));
    assert.equal(wvaStep(idle, 0).delta, -1);
    const busyish = [0, 1, 2].map(() => ({ kv: 0.5, queue: 0 }));
    // Over 2: kv 0.75 → spare 0.05 < 0.10.
    assert.equal(wvaStep(busyish, 0).delta, 0);
    assert.equal(wvaStep([{ kv: 0.01, queue: 0 }], 0).delta, 0, "never below one");
  });

  test("Dynamo: prefill ⌈rps·ISL·(1−hit)·min(1, c_p) / tok/s⌉, decode ⌈rps·OSL / tok/s⌉, at least 1", () => {
    assert.equal(dynamoPrefill(20, 3000, 0.5, 0.8, 10000), 3); // 2.4
    assert.equal(dynamoPrefill(20, 3000, 0.5, 1.7, 10000), 3); // c_p capped at 1: 3.0
    assert.equal(dynamoPrefill(0.1, 3000, 0, 1, 1e6), 1);
    assert.equal(dynamoDecode(10, 150, 1000), 2); // 1.5
    assert.equal(dynamoDecode(10, 150, 0), Number.POSITIVE_INFINITY);
  });

  test("KPA: ⌈concurrency / 70⌉; panic at 2× ready, never down while panicking, out after 60 s", () => {
    const st = { since: null, high: 0 };
    assert.deepEqual(kpaDesired(140, 140, 2, 0, st), { desired: 2, panicking: false });
    // 300 / 70 / 2 = 2.14 ≥ 2: panic; max(⌈100/70⌉, ⌈300/70⌉) = 5.
    assert.deepEqual(kpaDesired(100, 300, 2, 10, st), { desired: 5, panicking: true });
    assert.deepEqual(kpaDesired(10, 10, 5, 40, st), { desired: 5, panicking: true });
    // 60 s after the last crossing: stable rule, floored at ready / 2 (max-scale-down-rate 2).
    assert.deepEqual(kpaDesired(10, 10, 5, 71, st), { desired: 2, panicking: false });
  });

  test("HPA: ⌈current × metric / target⌉ outside the 10% tolerance", () => {
    assert.equal(hpaDesired(4, 0.9, 0.8), 5); // ratio 1.125
    assert.equal(hpaDesired(4, 0.85, 0.8), 4); // 1.0625: within tolerance
    assert.equal(hpaDesired(4, 0.75, 0.8), 4); // 0.9375
    assert.equal(hpaDesired(4, 0.2, 0.8), 1);
  });
  test("HPA: scale-down waits out the 300 s stabilisation window", () => {
    const hpa = new HpaGpuPolicy(new Map([["p", { min: 1, max: 10 }]]));
    const at = (now: number, busy: number, target: number): Sample => ({
      ...sample(now, 1, target, 15),
      pools: [{ ...poolState(target), replicas: poolState(target).replicas.map((x) => ({ ...x, busy })) }],
    });
    hpa.observe(at(15, 0.8, 4));
    assert.equal(hpa.decide(15, [poolState(4)])[0].desired, 4);
    for (let t = 30; t <= 300; t += 15) {
      hpa.observe(at(t, 0.2, 4));
      assert.equal(hpa.decide(t, [poolState(4)])[0].desired, 4, `t=${t}`);
    }
    hpa.observe(at(315, 0.2, 4));
    assert.equal(hpa.decide(315, [poolState(4)])[0].desired, 1);
  });
});
