/**
 * The even share of a barriered stage (even-share.ts): the fleet's own engines with the stage dealt
 * out evenly and every reusable block a hit. How it deals, what a cached part costs, that the engines'
 * own admission (prompt fits, answer not reserved) is what runs, and where the limits carry it.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import type { RequestSpec, StageInfo, Workload } from "../src/bench/workloads/types.ts";
import { type EvenShareJob, evenShare } from "../src/sim/fleet/even-share.ts";
import { computeLimits } from "../src/sim/fleet/limits.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import type { FleetConfig } from "../src/sim/fleet/replica.ts";
import { loadScenario } from "../src/sim/fleet/scenario.ts";
import { simulate } from "../src/sim/fleet/simulate.ts";
import { loadProfile } from "../src/sim/profiles.ts";

const profile = loadProfile("llama-3.1-8b-h100");
const fleet: FleetConfig = {
  replicas: 1,
  profile,
  model: profile.model.name,
  blockSize: 16,
  numGpuBlocks: 1001,
  maxNumSeqs: 64,
  maxNumBatchedTokens: 8192,
  maxModelLen: 4096,
  labels: {},
  blockHashAlgo: "fast64",
  enableKvCacheEvents: false,
};

const job = (at: number, output: number, prompt = 1601, cached = 1600): EvenShareJob => ({
  at,
  prompt,
  cached,
  output,
});

describe("the even share of a stage", () => {
  it("deals the stage in arrival order, one replica after another, and ends with the latest share", () => {
    // Five requests over two replicas: indices 0, 2 and 4 on the first, 1 and 3 (longer answers) on
    // the second, which ends the stage although the last arrival is on the first.
    const jobs = [job(0, 40), job(0.1, 300), job(0.2, 60), job(0.3, 250), job(0.4, 80)];
    const got = evenShare({ ...fleet, replicas: 2 }, jobs, 4096);
    const first = evenShare(fleet, [jobs[0], jobs[2], jobs[4]], 4096);
    const second = evenShare(fleet, [jobs[1], jobs[3]], 4096);
    assert.ok(got !== null && first !== null && second !== null);
    assert.deepEqual(
      got.shares.map((s) => s.requests),
      [3, 2],
    );
    assert.deepEqual(
      got.shares.map((s) => s.end),
      [first.end, second.end],
    );
    assert.ok(second.end > first.end, `${second.end} vs ${first.end}`);
    assert.equal(got.end, second.end);
  });

  it("serves a cached part from one shared chain: it costs the request's KV nothing", () => {
    // 1,024 tokens of KV: each request holds its last prompt token and 100 answer tokens (7 blocks),
    // so eight run side by side without a preemption.
    const eight = evenShare(
      fleet,
      Array.from({ length: 8 }, () => job(0, 100)),
      1024,
    );
    assert.ok(eight !== null);
    assert.equal(eight.shares[0].preemptions, 0);
    // Uncached, the same prompt and answer (1,712 tokens) cannot run alone in that KV: no figure.
    assert.equal(evenShare(fleet, [job(0, 100, 1601, 0)], 1024), null);
  });

  it("admits as vLLM does, so a burst that outgrows the KV preempts", () => {
    // Twelve such requests: every prompt fits (one block each), their answers (84 blocks) do not.
    const twelve = evenShare(
      fleet,
      Array.from({ length: 12 }, () => job(0, 100)),
      1024,
    );
    const eight = evenShare(
      fleet,
      Array.from({ length: 8 }, () => job(0, 100)),
      1024,
    );
    assert.ok(twelve !== null && eight !== null);
    assert.ok(twelve.shares[0].preemptions > 0, `${twelve.shares[0].preemptions}`);
    assert.ok(twelve.end > eight.end);
  });

  it("prefills what is not cached: two cold prompts take longer than two cached ones", () => {
    const cold = evenShare(fleet, [job(0, 4, 3000, 0), job(0, 4, 3000, 0)], 12_000);
    const warm = evenShare(fleet, [job(0, 4, 3000, 2992), job(0, 4, 3000, 2992)], 12_000);
    assert.ok(cold !== null && warm !== null);
    // Each cold prompt has its own blocks: the second does not hit the first's.
    const one = evenShare(fleet, [job(0, 4, 3000, 0)], 12_000);
    assert.ok(one !== null);
    assert.ok(cold.end > warm.end * 2, `${cold.end} vs ${warm.end}`);
    assert.ok(cold.end > one.end * 1.5, `${cold.end} vs ${one.end}`);
  });
});

/** Two stages of the same `n` prompts: a warm-up that computes them, then a stage that sends them again. */
function repeated(n: number): Workload {
  const requests: RequestSpec[] = [];
  const stages: StageInfo[] = [
    { index: 0, rate: n, duration: 1, start: 0, count: n, warmup: true },
    { index: 1, rate: n / 4, duration: 4, start: 100, count: n, warmup: false },
  ];
  for (const st of stages)
    for (let i = 0; i < n; i++)
      requests.push({
        id: `s${st.index}r${i}`,
        arrivalTime: st.start + (st.index === 0 ? 0 : (i * 4) / n),
        kind: "completion",
        prompt: Array.from({ length: 200 }, (_, k) => `w${i}_${k}`).join(" "),
        promptTokensApprox: 201,
        maxTokens: 120,
        stage: st.index,
      });
  return { name: "repeated", seed: 0, requests, stages, stageBarrier: { interval: 0 } };
}

describe("the limits' stage bounds carry the even share", () => {
  it("for a barriered stage, below its bound, under the regime the bound was read in", () => {
    const l = computeLimits(repeated(48), { ...fleet, replicas: 2 }, new PromptTokenizer());
    const st = l.stages?.find((s) => s.index === 1);
    assert.ok(st?.even_share_output_tokens_per_s !== undefined && st.even_share_end_s !== undefined);
    assert.equal(st.regime, "repeat");
    assert.ok(st.even_share_output_tokens_per_s < st.output_tokens_per_s);
    assert.ok(st.even_share_end_s > st.earliest_end_s);
    assert.equal(st.even_share_output_tokens_per_s, st.output_tokens / st.even_share_end_s);
  });

  it("not for one side of a P/D fleet, whose engines do not run whole requests", () => {
    const pd = { ...fleet, replicas: 2, labels: { "llm-d.ai/role": "prefill" } };
    const st = computeLimits(repeated(48), pd, new PromptTokenizer()).stages?.find((s) => s.index === 1);
    assert.ok(st !== undefined);
    assert.equal(st.even_share_output_tokens_per_s, undefined);
  });
});

describe("the even share against the fleet simulator", () => {
  it("is what round-robin routing gets, stage for stage, when no prompt is reused", async () => {
    // Unique prompts: the even share's deal is round-robin's and nothing is cached either way.
    const file = fileURLToPath(new URL("../scenarios/no-sharing-overload.yaml", import.meta.url));
    const res = await simulate(loadScenario(file), { routers: ["round-robin"] });
    const stages = res.limits.stages ?? [];
    assert.equal(stages.length, 5, "every measured stage is bounded");
    for (const b of stages) {
      const got = res.runs[0].stages.find((s) => s.index === b.index)?.output_tokens_per_s;
      const even = b.even_share_output_tokens_per_s;
      assert.ok(got != null && even !== undefined);
      assert.ok(Math.abs(got / even - 1) < 1e-9, `stage ${b.index}: ${got} against ${even}`);
    }
  });
});
