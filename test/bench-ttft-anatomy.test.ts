/**
 * ttft-anatomy's arithmetic (src/bench/ttft-anatomy.ts) on a hand-worked two-replica timeline: the
 * rest of the step in progress, the steps to the first token, pending long prefills per replica,
 * the gateway-to-replica delay, and the summary counts.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type AnatomyRequest, anatomy } from "../src/bench/ttft-anatomy.ts";

// Replica 0 prefills a long prompt in [0, 10), then decodes; replica 1 only decodes.
const STEPS = [
  [
    { start: 0, end: 10, prefillTokens: 2000 },
    { start: 10, end: 17, prefillTokens: 0 },
    { start: 17, end: 25, prefillTokens: 48 },
  ],
  [
    { start: 0, end: 7, prefillTokens: 0 },
    { start: 7, end: 14, prefillTokens: 48 },
  ],
];
const req = (
  id: string,
  arrivedAt: number,
  replica: number | null,
  firstTokenAt: number | null,
  promptTokens = 48,
) =>
  ({
    id,
    arrivedAt,
    pickedAt: replica === null ? null : arrivedAt,
    firstTokenAt,
    replica,
    promptTokens,
  }) as AnatomyRequest;
const L = req("long", 0, 0, 10, 2000);
const X = req("x", 5, 0, 25);
const Y = req("y", 3, 1, 14);
const NEVER = req("never", 4, null, null);

describe("anatomy", () => {
  it("splits each TTFT into the rest of the step in progress and the steps after it", () => {
    const { rows, summary } = anatomy([X, Y, NEVER], [L, X, Y, NEVER], STEPS, 1024);
    assert.deepEqual(
      rows.map((r) => [
        r.id,
        r.ttft,
        r.remainder,
        r.inProgressPrefill,
        r.steps,
        r.ownStep,
        r.longPendingReplicas,
      ]),
      [
        // x reached replica 0 during the long prefill (5 ms of it left), then two steps.
        ["x", 20, 5, 2000, 2, 8, 1],
        // y reached replica 1 mid-decode (4 ms left) and got its token in the next step.
        ["y", 11, 4, 0, 1, 7, 1],
      ],
    );
    assert.deepEqual(summary, {
      requests: 2,
      ttftP50: 11,
      ttftP90: 20,
      remainderP50: 4,
      remainderP90: 5,
      ownStepP50: 7,
      behindLongPrefill: 1,
      allReplicasLongPending: 0,
      firstStepAfter: 1,
    });
  });

  it("counts the delay to the replica, and a long prefill whose first token came back is no longer pending", () => {
    const late = req("late", 12, 1, 14);
    const { rows } = anatomy([late, Y], [L, late, Y], STEPS, 1024, 1);
    // late reaches replica 1 at 13: 1 ms of [7, 14) left, no step after it; L's token came at 10.
    assert.deepEqual(
      rows.map((r) => [r.id, r.remainder, r.steps, r.longPendingReplicas]),
      [
        ["late", 1, 0, 0],
        ["y", 3, 1, 1],
      ],
    );
    // With the threshold above L's prompt nothing is long.
    assert.equal(anatomy([X], [L, X], STEPS, 4096).rows[0].longPendingReplicas, 0);
  });
});
