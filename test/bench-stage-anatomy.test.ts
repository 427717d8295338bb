/**
 * stage-anatomy's bookkeeping (src/bench/stage-anatomy.ts) on a hand-worked two-stage, two-replica
 * timeline: steps go to the stage that had started when they began, the running count is weighted
 * by step time, recomputed tokens are what was prefilled beyond each request's first admission, and
 * the stage's rate and share of its bound come from its last completion.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type AnatomyStageStep, stageAnatomy } from "../src/bench/stage-anatomy.ts";

const step = (
  start: number,
  end: number,
  running: number,
  prefillTokens = 0,
  preempted = 0,
): AnatomyStageStep => ({
  start,
  end,
  running,
  prefillTokens,
  preempted,
});

// Stage 0 starts at 0, stage 1 at 100. Replica 0 preempts in stage 1 and prefills 300 tokens more
// than its requests needed at first admission; replica 1 never preempts.
const STEPS = [
  [step(0, 1, 10, 500), step(1, 4, 40), step(100, 101, 20, 200), step(101, 103, 50, 400, 2)],
  [step(0, 2, 30, 100), step(100, 102, 10, 50)],
];
const rec = (stage: number, replica: number, promptTokens: number, cachedTokens: number, end: number) => ({
  stage,
  replica,
  promptTokens,
  cachedTokens,
  outputTokens: 100,
  end,
});
const RECORDS = [
  rec(0, 0, 600, 100, 4),
  rec(0, 1, 100, 0, 2),
  rec(1, 0, 1000, 700, 103),
  rec(1, 0, 1000, 1000, 102),
  rec(1, 1, 80, 30, 120),
];

describe("stageAnatomy", () => {
  const out = stageAnatomy([0, 100], STEPS, RECORDS, new Map([[1, 20]]));

  it("puts each step in the stage that had started when it began", () => {
    assert.deepEqual(
      out.map((s) => s.replicas.map((r) => r.steps)),
      [
        [2, 1],
        [2, 1],
      ],
    );
  });

  it("weights the running count by step duration", () => {
    // Replica 0, stage 0: 10 sequences for 1 s, 40 for 3 s → 130 / 4.
    assert.equal(out[0].replicas[0].meanRunning, 32.5);
    assert.equal(out[0].replicas[0].maxRunning, 40);
  });

  it("counts as recomputed only what was prefilled beyond each request's first admission", () => {
    // Stage 1, replica 0: prefilled 600, first admissions needed 300 + 0.
    assert.equal(out[1].replicas[0].firstAdmissionTokens, 300);
    assert.equal(out[1].replicas[0].recomputedTokens, 300);
    assert.equal(out[1].replicas[0].preemptions, 2);
    // Stage 0 prefilled exactly what its requests needed.
    assert.equal(out[0].recomputedTokens, 0);
    assert.equal(out[1].recomputedTokens, 300);
  });

  it("reads the stage's rate from its last completion and its share from the bound given", () => {
    // Stage 1 ends at 120 (replica 1's last completion), 300 output tokens → 15 tok/s of a 20 bound.
    assert.equal(out[1].windowS, 20);
    assert.equal(out[1].outputTokensPerS, 15);
    assert.equal(out[1].shareOfBound, 0.75);
    assert.deepEqual(
      out[1].replicas.map((r) => r.endS),
      [3, 20],
    );
    assert.equal(out[0].shareOfBound, null);
  });

  it("skips stages that never started", () => {
    const only = stageAnatomy([0, undefined], STEPS, RECORDS.slice(0, 2));
    assert.deepEqual(
      only.map((s) => s.stage),
      [0],
    );
    // Steps of the unstarted stage's time stay in the last started one.
    assert.equal(only[0].replicas[0].steps, 4);
  });
});
