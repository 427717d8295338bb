/**
 * The per-stage bound of barriered stages (stage-limits.ts): a stage whose requests arrive over
 * time cannot keep the fleet at full concurrency from its first second, and the bound says so;
 * stages whose windows overlap (no barrier) get none.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { RequestSpec, StageInfo, Workload } from "../src/bench/workloads/types.ts";
import { computeLimits } from "../src/sim/fleet/limits.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import type { FleetConfig } from "../src/sim/fleet/replica.ts";
import { mixedStep } from "../src/sim/fleet/stage-limits.ts";
import { loadProfile } from "../src/sim/profiles.ts";

const profile = loadProfile("llama-3.1-8b-h100");
const fleet: FleetConfig = {
  replicas: 2,
  profile,
  model: profile.model.name,
  blockSize: 16,
  numGpuBlocks: 1001,
  maxNumSeqs: 8,
  maxNumBatchedTokens: 8192,
  maxModelLen: 4096,
  labels: {},
  blockHashAlgo: "fast64",
  enableKvCacheEvents: false,
};

/** Two stages of `n` unique 80-word prompts each: stage 0 all at its start, stage 1 spread over `spread` s. */
function workload(n: number, spread: number, barrier: boolean): Workload {
  const requests: RequestSpec[] = [];
  const stages: StageInfo[] = [
    { index: 0, rate: n, duration: 1, start: 0, count: n, warmup: false },
    { index: 1, rate: n / spread, duration: spread, start: 100, count: n, warmup: false },
  ];
  for (const st of stages)
    for (let i = 0; i < n; i++)
      requests.push({
        id: `s${st.index}r${i}`,
        arrivalTime: st.start + (st.index === 0 ? 0 : (i * spread) / n),
        kind: "completion",
        prompt: Array.from({ length: 80 }, (_, k) => `w${st.index}_${i}_${k}`).join(" "),
        promptTokensApprox: 81,
        maxTokens: 200,
        stage: st.index,
      });
  return { name: "hand", seed: 0, requests, stages, ...(barrier ? { stageBarrier: { interval: 0 } } : {}) };
}

describe("per-stage bounds of barriered stages", () => {
  it("equal the steady-state ceiling when the whole stage arrives at once, and fall when arrivals ramp", () => {
    // 64 requests: 2 replicas × 8 sequences are full from the first step.
    const l = computeLimits(workload(64, 20, true), fleet, new PromptTokenizer());
    const [burst, ramp] = l.stages ?? [];
    const best = l.regimes.zero;
    assert.equal(best.mixed_concurrency_per_replica, 8);
    const steady = best.mixed_output_tokens_per_s;
    assert.ok(
      Math.abs(burst.output_tokens_per_s - steady) / steady < 1e-9,
      `${burst.output_tokens_per_s} vs ${steady}`,
    );
    // Spread over 20 s the fleet starts with one sequence: the same work cannot finish as soon.
    assert.ok(ramp.earliest_end_s > ramp.last_arrival_s);
    assert.ok(ramp.output_tokens_per_s < burst.output_tokens_per_s * 0.9);
    assert.equal(ramp.output_tokens, 64 * 200);
  });

  it("never ends a stage before its last request could have decoded its answer", () => {
    // 4 requests spread over 20 s: the last arrives at 15 s and needs 200 steps.
    const l = computeLimits(workload(4, 20, true), fleet, new PromptTokenizer());
    const st = l.stages?.[1];
    assert.ok(st !== undefined);
    assert.ok(st.earliest_end_s > 15 + 200 * 0.004, `${st.earliest_end_s}`);
    // A single sequence per replica emits at most 1/T(1) tokens/s: the bound is far below the steady one.
    const one = mixedStep({ ...fleet, replicas: 1 }, 1, 81, 81, 200);
    assert.ok(st.output_tokens_per_s <= 2 * one.output + 1e-9);
  });

  it("gives no stage bound when stages are not barriered (their windows hold earlier stages' tails)", () => {
    const l = computeLimits(workload(64, 20, false), fleet, new PromptTokenizer());
    assert.equal(l.stages, undefined);
  });
});
