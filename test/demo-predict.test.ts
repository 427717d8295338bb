/**
 * The demo's prediction models the trip from the client to a replica: a closed-loop user's next
 * question, sent when its last answer token arrives, reaches the replica after the replica has begun
 * its next step and waits for that step to end, as it does live. Without a trip the simulator
 * admits it into that very step.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { DEMO_DEFAULTS, DEMO_MAX_MODEL_LEN, demoWorkloadSpec } from "../src/bench/demo.ts";
import { jitterSends, predict, predictInWorkers } from "../src/bench/demo-predict.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";

/** The prediction's fleet for a small demo: `replicas` of the demo's profile, each request a 2 ms trip. */
const smallFleet = (replicas: number) => ({
  replicas,
  profile: DEMO_DEFAULTS.profile,
  maxModelLen: DEMO_MAX_MODEL_LEN,
  scrapeIntervalS: 0.1,
  gatewayDelayS: 0.002,
});

test("a 2 ms trip costs a warm request most of a step, not 2 ms", async () => {
  const o = { ...DEMO_DEFAULTS, replicas: 2, users: 12, requests: 48, outputLen: 64, rampUpS: 0 };
  const spec = demoWorkloadSpec(o);
  const workload = generateWorkload(spec);
  const fleet = { replicas: 2, profile: o.profile, maxModelLen: DEMO_MAX_MODEL_LEN, scrapeIntervalS: 0.1 };
  const kvgate = async (gatewayDelayS: number) => {
    const runs = await predict(spec, workload, { ...fleet, gatewayDelayS });
    return runs.find((p) => p.router === "kvgate")!.run;
  };
  const direct = (await kvgate(0)).ttft_p50_s;
  const hop = (await kvgate(0.002)).ttft_p50_s;
  assert.ok(direct !== null && hop !== null && direct > 0);
  assert.ok(hop - direct > 0.01, `TTFT p50 ${direct} s → ${hop} s: the hop must cost a step wait`);
});

test("jitterSends: each send up to the jitter later, the same for a seed, the input untouched", () => {
  const o = { ...DEMO_DEFAULTS, replicas: 2, users: 6, requests: 24, outputLen: 16 };
  const workload = generateWorkload(demoWorkloadSpec(o));
  const before = structuredClone(workload.requests);
  const a = jitterSends(workload, 0.01, 42);
  assert.deepEqual(workload.requests, before, "the live run's workload is not changed");
  assert.deepEqual(jitterSends(workload, 0.01, 42), a);
  assert.notDeepEqual(jitterSends(workload, 0.01, 43).requests, a.requests);
  let closedLoop = 0;
  for (const [i, r] of a.requests.entries()) {
    const was = before[i];
    const late = r.arrivalTime - was.arrivalTime;
    assert.ok(late >= 0 && late < 0.01, `${r.id} moved by ${late} s`);
    if (was.after) {
      closedLoop++;
      assert.equal(r.after?.id, was.after.id);
      assert.ok(
        Math.abs(r.after!.delay - was.after.delay - late) < 1e-12,
        "the wait after the answer grows by as much",
      );
    } else assert.equal(r.after, undefined);
  }
  assert.equal(closedLoop, 18, "6 users' first questions have no predecessor");
  assert.equal(jitterSends(workload, 0, 42), workload);
  assert.throws(() => jitterSends(workload, -1, 42), /send jitter must be ≥ 0 s/);
});

test("sent at one instant in a fixed order, round-robin deals users back to their replicas; a few ms of jitter ends that", async () => {
  // 12 users on 4 replicas: without jitter user u's every question is the (12t + u)-th send, so it
  // lands on replica u mod 4 each turn and hits its own system prompt, which live timing never does.
  // All users start at once, so their answers end together, turn after turn.
  const o = { ...DEMO_DEFAULTS, replicas: 4, users: 12, requests: 60, outputLen: 32, rampUpS: 0 };
  const spec = demoWorkloadSpec(o);
  const workload = generateWorkload(spec);
  const fleet = smallFleet(4);
  const hits = async (sendJitterS: number) => {
    const runs = await predict(spec, workload, { ...fleet, sendJitterS });
    return runs.find((p) => p.router === "round-robin")!.run.prefix_cache_hit_rate ?? Number.NaN;
  };
  const exact = await hits(0);
  const jittered = await hits(0.01);
  assert.ok(exact > 0.6, `lockstep round-robin hit rate ${exact}`);
  assert.ok(jittered < exact - 0.2, `with 10 ms of jitter ${jittered} against ${exact}`);
});

test("users started over the ramp end their answers far more than a step apart on each replica; started at once, a step apart", async () => {
  // A next question that reaches its replica later than the gap to its neighbour's is prefilled with
  // it, and the two then end and ask together: the gap is the demo's margin against that.
  const gaps = async (rampUpS: number) => {
    const o = { ...DEMO_DEFAULTS, replicas: 4, users: 40, requests: 120, outputLen: 200, rampUpS };
    const spec = demoWorkloadSpec(o);
    const runs = await predict(spec, generateWorkload(spec), smallFleet(4));
    const ends = new Map<string, number[]>();
    for (const r of runs.find((p) => p.router === "kvgate")!.records)
      if (!r.warmup) ends.set(r.endpoint ?? "", [...(ends.get(r.endpoint ?? "") ?? []), r.end]);
    const out: number[] = [];
    for (const list of ends.values()) {
      list.sort((a, b) => a - b);
      for (let i = 1; i < list.length; i++) out.push(list[i] - list[i - 1]);
    }
    return out.sort((a, b) => a - b);
  };
  const median = (xs: number[]) => xs[Math.floor(xs.length / 2)];
  const atOnce = await gaps(0);
  const ramped = await gaps(DEMO_DEFAULTS.rampUpS);
  assert.ok(median(atOnce) < 0.05, `started at once: median gap ${median(atOnce)} s`);
  assert.ok(
    median(ramped) > 0.2 && median(ramped) > 10 * median(atOnce),
    `ramped: median gap ${median(ramped)} s against ${median(atOnce)} s`,
  );
});

test("each draw of the send jitter is its own dealing; the columns' run is the draw with the median output tokens/s", async () => {
  const o = { ...DEMO_DEFAULTS, replicas: 4, users: 24, requests: 96, outputLen: 32, rampUpS: 0 };
  const spec = demoWorkloadSpec(o);
  const workload = generateWorkload(spec);
  const fleet = { ...smallFleet(4), sendJitterS: 0.01 };
  const runs = await predict(spec, workload, { ...fleet, draws: 5 });
  const one = await predict(spec, workload, fleet);
  for (const p of runs) {
    assert.equal(p.draws.length, 5, p.router);
    const rates = p.draws.map((d) => d.output_tokens_per_s ?? 0).sort((a, b) => a - b);
    assert.equal(p.run.output_tokens_per_s, rates[2], `${p.router}: the median draw`);
    assert.ok(p.draws.includes(p.run));
    const single = one.find((x) => x.router === p.router)!;
    assert.equal(single.draws.length, 1);
    assert.deepEqual(
      p.draws[0].prefix_cache_hit_rate,
      single.run.prefix_cache_hit_rate,
      "draw 0 is the one-draw prediction",
    );
  }
  const rr = runs.find((p) => p.router === "round-robin")!;
  const hits = new Set(rr.draws.map((d) => d.prefix_cache_hit_rate));
  assert.ok(hits.size > 1, `round-robin's hit rate moves with the send order: ${[...hits].join(", ")}`);
  const exact = await predict(spec, workload, { ...smallFleet(4), draws: 5 });
  assert.ok(
    exact.every((p) => p.draws.length === 1),
    "without jitter every draw would be the same run",
  );
  await assert.rejects(
    predict(spec, workload, { ...fleet, draws: 0 }),
    /draws must be a whole number ≥ 1, got 0/,
  );
});

test("at the default ramp a replica's users send their cold first questions more than two cold prefills apart", async () => {
  // A warm-up prefill that runs late by a replica's lag queues the next user's behind it when the
  // two come less than a prefill apart, and the two then ask together from then on.
  const o = { ...DEMO_DEFAULTS, requests: 2 * DEMO_DEFAULTS.users, outputLen: 16 };
  const spec = demoWorkloadSpec(o);
  const runs = await predict(spec, generateWorkload(spec), smallFleet(DEMO_DEFAULTS.replicas));
  const firsts = runs.find((p) => p.router === "kvgate")!.records.filter((r) => r.warmup);
  assert.equal(firsts.length, DEMO_DEFAULTS.users);
  const ttft = firsts.map((r) => r.chunkTimes[0] - r.start).sort((a, b) => a - b);
  const prefill = ttft[Math.floor(ttft.length / 2)];
  const starts = new Map<string, number[]>();
  for (const r of firsts) starts.set(r.endpoint ?? "", [...(starts.get(r.endpoint ?? "") ?? []), r.start]);
  const gaps: number[] = [];
  for (const list of starts.values()) {
    list.sort((a, b) => a - b);
    for (let i = 1; i < list.length; i++) gaps.push(list[i] - list[i - 1]);
  }
  gaps.sort((a, b) => a - b);
  const median = gaps[Math.floor(gaps.length / 2)];
  assert.ok(prefill > 0.2, `a cold 7,000-token prefill takes ${prefill} s`);
  assert.ok(median > 2 * prefill, `median gap ${median} s against a cold prefill of ${prefill} s`);
});

test("predictInWorkers: each router in its own worker thread, the workload rebuilt from its spec, the same prediction as in this thread", async () => {
  const o = { ...DEMO_DEFAULTS, replicas: 2, users: 8, requests: 32, outputLen: 24 };
  const spec = demoWorkloadSpec(o);
  const fleet = { ...smallFleet(2), sendJitterS: 0.01, draws: 3 };
  const here = await predict(spec, generateWorkload(spec), fleet);
  const there = await predictInWorkers(spec, fleet);
  assert.deepEqual(
    there.map((p) => p.router),
    ["round-robin", "kvgate"],
  );
  for (const [i, p] of there.entries()) {
    assert.deepEqual(p.draws, here[i].draws, p.router);
    assert.deepEqual(p.run, here[i].run, p.router);
    assert.equal(p.records.length, here[i].records.length);
  }
  await assert.rejects(
    predictInWorkers(spec, { ...fleet, profile: "no-such-profile" }),
    /the (round-robin|kvgate) prediction failed: .*no-such-profile/,
  );
});
