/**
 * The demo's prediction models the trip from the client to a replica: a closed-loop user's next
 * question, sent when its last answer token arrives, reaches the replica after the replica has begun
 * its next step and waits for that step to end, as it does live. Without a trip the simulator
 * admits it into that very step.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { DEMO_DEFAULTS, DEMO_MAX_MODEL_LEN, demoWorkloadSpec } from "../src/bench/demo.ts";
import { predict } from "../src/bench/demo-predict.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";

test("a 2 ms trip costs a warm request most of a step, not 2 ms", async () => {
  const o = { ...DEMO_DEFAULTS, replicas: 2, users: 12, requests: 48, outputLen: 64 };
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
