/**
 * The per-stage bound of barriered stages (stage-limits.ts): a stage whose requests arrive over
 * time cannot keep the fleet at full concurrency from its first second, and the bound says so;
 * stages whose windows overlap (no barrier) get none.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import fc from "fast-check";
import type { RequestSpec, StageInfo, Workload } from "../src/bench/workloads/types.ts";
import { computeLimits } from "../src/sim/fleet/limits.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import { type RelaxedJob, type RelaxedPriority, relaxedSchedule } from "../src/sim/fleet/relaxed-schedule.ts";
import type { FleetConfig } from "../src/sim/fleet/replica.ts";
import { parseScenario } from "../src/sim/fleet/scenario.ts";
import { simulate } from "../src/sim/fleet/simulate.ts";
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

/**
 * Two stages of `n` unique 80-word prompts each: stage 0 all at its start, stage 1 spread over `spread`
 * s; with `repeat`, stage 1 sends stage 0's prompts again.
 */
function workload(n: number, spread: number, barrier: boolean, repeat = false): Workload {
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
        prompt: Array.from({ length: 80 }, (_, k) => `w${repeat ? 0 : st.index}_${i}_${k}`).join(" "),
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
    // The same steps, except that the stage bound counts each request's first token as made by its
    // prefill step (no decode read), which the steady-state ceiling charges as a decode: above it,
    // by less than one token's step share in 200.
    assert.ok(burst.output_tokens_per_s > steady, `${burst.output_tokens_per_s} vs ${steady}`);
    assert.ok(
      burst.output_tokens_per_s < steady * (1 + 1 / 200),
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

  it("bounds a stage with its own uncached tokens: prompts computed in an earlier stage are not charged again", () => {
    const tok = new PromptTokenizer();
    const fresh = computeLimits(workload(64, 1, true), fleet, tok);
    const again = computeLimits(workload(64, 1, true, true), fleet, tok);
    const [f0, f1] = fresh.stages ?? [];
    const [, a1] = again.stages ?? [];
    // Fresh prompts: nothing of stage 1 was seen before, so it computes whole prompts.
    assert.ok(f1.uncached_prompt_tokens_mean > 80, `${f1.uncached_prompt_tokens_mean}`);
    // Repeated prompts: all but the last partial block come from stage 0 ("all repeats").
    assert.ok(a1.uncached_prompt_tokens_mean <= fleet.blockSize, `${a1.uncached_prompt_tokens_mean}`);
    // The run's mean (half the requests cold) would charge stage 1 for stage 0's prefills.
    assert.ok(again.regimes.repeat.uncached_prompt_tokens_mean > 2 * a1.uncached_prompt_tokens_mean);
    // Less prefill per step and more sequences per replica: the repeated stage's bound is higher.
    assert.ok(
      a1.output_tokens_per_s > f1.output_tokens_per_s,
      `${a1.output_tokens_per_s} vs ${f1.output_tokens_per_s}`,
    );
    assert.ok(a1.concurrency_per_replica >= f1.concurrency_per_replica);
    // Stage 0 is the same workload in both: the same bound.
    assert.equal(again.stages?.[0].output_tokens_per_s, f0.output_tokens_per_s);
  });

  it("gives no stage bound when stages are not barriered (their windows hold earlier stages' tails)", () => {
    const l = computeLimits(workload(64, 20, false), fleet, new PromptTokenizer());
    assert.equal(l.stages, undefined);
  });
});

/**
 * The stage bound is an upper bound: no router's achieved stage throughput exceeds it. A small
 * shared-prefix fleet pushed past its capacity in barriered stages, run through the real scheduler.
 */
const STAGED = `
name: stage-bound
seed: 5
fleet: { replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 24000, maxModelLen: 4096, maxNumSeqs: 48 }
routers:
  - { name: default, config: ../config/examples/default.yaml }
  - { name: precise, config: ../config/examples/precise-sim.yaml }
  - { name: round-robin, config: ../config/examples/round-robin.yaml }
workload:
  workload: shared-prefix
  options: { numGroups: 6, promptsPerGroup: 3, systemPromptLen: 1500, questionLen: 200, outputLen: 120 }
  arrival:
    type: stages
    process: poisson
    barrier: true
    interval: 1
    stages:
      - { rate: 6, duration: 3, warmup: true }
      - { rate: 20, duration: 3 }
      - { rate: 80, duration: 2 }
`;

describe("stage bounds against simulated runs", () => {
  it("no router's stage throughput exceeds its stage's bound", async () => {
    const res = await simulate(parseScenario(STAGED, resolve("scenarios/test-stage-bound.yaml")));
    const bounds = res.limits.stages ?? [];
    assert.ok(bounds.length >= 2, "barriered stages get bounds");
    let closest = 0;
    for (const run of res.runs)
      for (const st of run.stages) {
        if (st.warmup) continue;
        const b = bounds.find((x) => x.index === st.index);
        assert.ok(b !== undefined, `stage ${st.index} has a bound`);
        const got = st.output_tokens_per_s ?? 0;
        assert.ok(
          got <= b.output_tokens_per_s,
          `${run.router} stage ${st.index}: ${got} > ${b.output_tokens_per_s}`,
        );
        closest = Math.max(closest, got / b.output_tokens_per_s);
      }
    // Not vacuous: the best run gets within a factor of two of its stage's bound.
    assert.ok(closest > 0.5, `best share ${closest}`);
  });
});

type Placement = "round-robin" | "random" | "by-prompt";

/** The hand-built case below: every request placed round-robin and run youngest-first. */
function youngestFirst(f: FleetConfig, jobs: RelaxedJob[], freeTokens: number): number {
  return relaxedSchedule(f, jobs, { freeTokens }).outputTokensPerS;
}

describe("stage bounds against a schedule their relaxation allows", () => {
  it("count a request's first token as made by its prefill step, not a decode (fast-check's shrunk case)", () => {
    // Two 11-token prompts (no full block to cache) with 73-token answers, together on one replica:
    // 72 decode steps at contexts 12 … 83 after one prefill step. Charging all 73 tokens a decode at
    // the mean context put the bound above what this schedule reaches.
    const f: FleetConfig = { ...fleet, replicas: 1, numGpuBlocks: 61, maxNumSeqs: 2 };
    const text = Array.from({ length: 10 }, (_, k) => `q0_${k}`).join(" ");
    const req = (id: string, at: number, stage: number, maxTokens: number): RequestSpec => ({
      id,
      arrivalTime: at,
      kind: "completion",
      prompt: text,
      promptTokensApprox: 10,
      maxTokens,
      stage,
    });
    const stages: StageInfo[] = [
      { index: 0, rate: 1, duration: 1, start: 0, count: 1, warmup: true },
      { index: 1, rate: 2, duration: 0, start: 100, count: 2, warmup: false },
    ];
    const w: Workload = {
      name: "first-token",
      seed: 0,
      requests: [req("w", 0, 0, 8), req("a", 100, 1, 73), req("b", 100, 1, 73)],
      stages,
      stageBarrier: { interval: 0 },
    };
    const tok = new PromptTokenizer();
    const l = computeLimits(w, f, tok);
    const bound = l.stages?.find((s) => s.index === 1);
    assert.ok(bound !== undefined);
    const prompt = tok.completion(text).length;
    assert.ok(prompt < f.blockSize, `${prompt} tokens`);
    const job = { at: 0, prompt, uncached: prompt, output: 73 };
    const achieved = relaxedSchedule(f, [job, job], { freeTokens: l.kv_tokens_per_replica }).outputTokensPerS;
    assert.ok(
      achieved <= bound.output_tokens_per_s,
      `schedule ${achieved} > bound ${bound.output_tokens_per_s}`,
    );
    // Not vacuous: both requests run in every step, so this schedule is within 1% of the bound.
    assert.ok(
      achieved > 0.99 * bound.output_tokens_per_s,
      `schedule ${achieved} vs bound ${bound.output_tokens_per_s}`,
    );
  });

  it("are not beaten by free-preemption youngest-first on a stage that repeats an earlier one", () => {
    // 40 prompts computed in stage 0; stage 1 sends each 4 times at once: 80 requests per replica
    // with ~1 uncached token each, more than the KV beside the resident prompts can run at once.
    const n = 40;
    const kvFleet: FleetConfig = { ...fleet, numGpuBlocks: 1001, maxNumSeqs: 256 };
    const requests: RequestSpec[] = [];
    const stages: StageInfo[] = [
      { index: 0, rate: n, duration: 1, start: 0, count: n, warmup: false },
      { index: 1, rate: 4 * n, duration: 1, start: 100, count: 4 * n, warmup: false },
    ];
    const text = (i: number) => Array.from({ length: 400 }, (_, k) => `p${i}_${k}`).join(" ");
    for (let i = 0; i < n; i++)
      requests.push({
        id: `a${i}`,
        arrivalTime: 0,
        kind: "completion",
        prompt: text(i),
        promptTokensApprox: 801,
        maxTokens: 200,
        stage: 0,
      });
    for (let i = 0; i < 4 * n; i++)
      requests.push({
        id: `b${i}`,
        arrivalTime: 100 + i * 0.001,
        kind: "completion",
        prompt: text(i % n),
        promptTokensApprox: 801,
        maxTokens: 200,
        stage: 1,
      });
    const w: Workload = { name: "repeat", seed: 0, requests, stages, stageBarrier: { interval: 0 } };
    const tok = new PromptTokenizer();
    const l = computeLimits(w, kvFleet, tok);
    const bound = l.stages?.find((s) => s.index === 1);
    assert.ok(bound !== undefined);
    const repeat = l.regimes.repeat;
    const free = l.kv_tokens_per_replica - repeat.resident_tokens_per_replica;
    assert.ok(repeat.resident_fits && free > 0);
    const jobs = requests
      .filter((r) => r.stage === 1)
      .map((r) => {
        const prompt = tok.completion(r.prompt ?? "").length;
        const cached = Math.floor((prompt - 1) / kvFleet.blockSize) * kvFleet.blockSize;
        return { at: r.arrivalTime - 100, prompt, uncached: prompt - cached, output: r.maxTokens };
      });
    // KV-bound: the stage's requests per replica do not all fit beside the resident set at once.
    const perReplica = jobs.length / kvFleet.replicas;
    assert.ok(perReplica * (jobs[0].uncached + 200) > free, `${perReplica} requests vs ${free} free tokens`);
    const achieved = youngestFirst(kvFleet, jobs, free);
    assert.ok(
      achieved <= bound.output_tokens_per_s,
      `schedule ${achieved} > bound ${bound.output_tokens_per_s}`,
    );
    // And the bound is not far above it: the relaxation is close to what a schedule reaches.
    assert.ok(
      achieved > 0.8 * bound.output_tokens_per_s,
      `schedule ${achieved} vs bound ${bound.output_tokens_per_s}`,
    );
  });
});

/**
 * Property: on random barriered stages (prompts computed in a first stage, then reused by a second
 * whose requests arrive over a random spread, with random answer lengths), no schedule the
 * relaxation allows — any replica count, placement and run order, KV from tight to ample — finishes
 * the second stage faster than its bound says. Each schedule is run on the KV the relaxation leaves
 * every replica (the repeat regime's resident set spread evenly). Nor does the even share (the
 * engines themselves, even-share.ts) that the limits carry beside the bound.
 */
describe("stage bounds against schedules their relaxation allows (property)", () => {
  it("are never beaten, whatever the placement, run order, arrivals, answer lengths and KV", () => {
    const tok = new PromptTokenizer();
    const texts = new Map<string, number>();
    const tokens = (text: string) => {
      let n = texts.get(text);
      if (n === undefined) texts.set(text, (n = tok.completion(text).length));
      return n;
    };
    let closest = 0;
    let evenClosest = 0;
    let evenRuns = 0;
    fc.assert(
      fc.property(
        fc.record({
          replicas: fc.integer({ min: 1, max: 3 }),
          words: fc.array(fc.integer({ min: 1, max: 160 }), { minLength: 1, maxLength: 10 }),
          shared: fc.integer({ min: 0, max: 120 }),
          picks: fc.array(
            fc.tuple(fc.nat(), fc.integer({ min: 4, max: 90 }), fc.double({ min: 0, max: 1, noNaN: true })),
            {
              minLength: 2,
              maxLength: 36,
            },
          ),
          spread: fc.double({ min: 0, max: 4, noNaN: true }),
          blocks: fc.integer({ min: 60, max: 900 }),
          maxNumSeqs: fc.integer({ min: 2, max: 64 }),
          priority: fc.constantFrom<RelaxedPriority>("youngest", "oldest", "arrival", "ranked"),
          placement: fc.constantFrom<Placement>("round-robin", "random", "by-prompt"),
          salt: fc.nat(),
        }),
        (c) => {
          const f: FleetConfig = {
            ...fleet,
            replicas: c.replicas,
            numGpuBlocks: c.blocks + 1,
            maxNumSeqs: c.maxNumSeqs,
          };
          // A prefix shared by every prompt (a system prompt), then each prompt's own words.
          const text = (i: number) =>
            [
              ...Array.from({ length: c.shared }, (_, k) => `s${k}`),
              ...Array.from({ length: c.words[i] }, (_, k) => `q${i}_${k}`),
            ].join(" ");
          const requests: RequestSpec[] = [];
          const prompts = c.words.length;
          for (let i = 0; i < prompts; i++)
            requests.push({
              id: `w${i}`,
              arrivalTime: 0,
              kind: "completion",
              prompt: text(i),
              promptTokensApprox: c.shared + c.words[i],
              maxTokens: 8,
              stage: 0,
            });
          for (const [i, [p, out, at]] of c.picks.entries())
            requests.push({
              id: `r${i}`,
              arrivalTime: 100 + at * c.spread,
              kind: "completion",
              prompt: text(p % prompts),
              promptTokensApprox: c.shared + c.words[p % prompts],
              maxTokens: out,
              stage: 1,
            });
          const stages: StageInfo[] = [
            { index: 0, rate: prompts, duration: 1, start: 0, count: prompts, warmup: true },
            {
              index: 1,
              rate: c.picks.length / Math.max(c.spread, 1),
              duration: c.spread,
              start: 100,
              count: c.picks.length,
              warmup: false,
            },
          ];
          const w: Workload = { name: "prop", seed: 0, requests, stages, stageBarrier: { interval: 0 } };
          const l = computeLimits(w, f, tok);
          const bound = l.stages?.find((s) => s.index === 1);
          if (bound === undefined) return; // no regime fits the KV: nothing is claimed
          // The engines themselves, dealt evenly (even-share.ts), are one schedule of the relaxation.
          const even = bound.even_share_output_tokens_per_s;
          if (even !== undefined) {
            evenRuns++;
            evenClosest = Math.max(evenClosest, even / bound.output_tokens_per_s);
            assert.ok(
              even <= bound.output_tokens_per_s * (1 + 1e-9),
              `even share ${even} > bound ${bound.output_tokens_per_s}`,
            );
          }
          const free = l.kv_tokens_per_replica - l.regimes.repeat.resident_tokens_per_replica;
          // The relaxation's replica: the repeat regime's resident set beside each request's own blocks.
          const jobs = requests
            .filter((r) => r.stage === 1)
            .map((r) => {
              const prompt = tokens(r.prompt ?? "");
              const cached = Math.floor((prompt - 1) / f.blockSize) * f.blockSize;
              return { at: r.arrivalTime - 100, prompt, uncached: prompt - cached, output: r.maxTokens };
            });
          // A request that cannot run alone in the free KV has no schedule in the relaxation.
          const fits = jobs.every(
            (j) =>
              Math.ceil((j.prompt + j.output) / f.blockSize) * f.blockSize - (j.prompt - j.uncached) <= free,
          );
          if (!(free > 0) || !fits) return;
          const mix = (i: number) => ((i + 1) * 2654435761 + c.salt) % 1000003;
          const home =
            c.placement === "random"
              ? (i: number) => mix(i) % c.replicas
              : c.placement === "by-prompt"
                ? (i: number) => (c.picks[i][0] % prompts) % c.replicas
                : undefined;
          const achieved = relaxedSchedule(f, jobs, {
            freeTokens: free,
            priority: c.priority,
            home,
            rank: mix,
          }).outputTokensPerS;
          closest = Math.max(closest, achieved / bound.output_tokens_per_s);
          assert.ok(
            achieved <= bound.output_tokens_per_s * (1 + 1e-9),
            `schedule ${achieved} > bound ${bound.output_tokens_per_s}`,
          );
        },
      ),
      { numRuns: 300, seed: 9 },
    );
    // Not vacuous: some generated schedule comes close to its bound, and so do the engines.
    assert.ok(closest > 0.7, `closest ${closest}`);
    assert.ok(evenRuns > 100 && evenClosest > 0.7, `${evenRuns} even shares, closest ${evenClosest}`);
  });
});
