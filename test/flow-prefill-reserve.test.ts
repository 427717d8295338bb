/**
 * vtc-fairness-policy's prefill reserve against hand-worked cases: the pure bookkeeping of pending
 * long prefills (src/flow/prefill-reserve.ts: unplaced requests count against the free endpoints,
 * placement, first token, idempotent end), the controller's gate (src/flow/flow-control.ts: a flow
 * with a long prefill pending starts another only while more than prefillReserve endpoints are free
 * of long prefills; a flow with none pending, a short prompt, a band that knows one flow, or a
 * caller that gives no endpoints is never held; held, another flow of the band goes and lower bands
 * wait), its config parameters, and with fast-check that a flow's second long prefill never leaves
 * fewer than prefillReserve endpoints free and that nothing stays queued once every prefill ended.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { FlowController, type FlowControlSettings, type FlowRequest } from "../src/flow/flow-control.ts";
import { PrefillTracker } from "../src/flow/prefill-reserve.ts";

const LONG = 2400;
const SHORT = 48;

function settings(prefillReserve: number, longPrefillTokens = 1024, bands = false): FlowControlSettings {
  const vtc = {
    maxRequests: 0,
    maxBytes: 0,
    fairness: {
      kind: "vtc" as const,
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      prefillReserve,
      longPrefillTokens,
    },
    ordering: "fcfs" as const,
  };
  return {
    maxRequests: 0,
    maxBytes: 0,
    defaultRequestTTL: 60,
    noEndpointRequestTTL: 60,
    bands: bands
      ? [
          { ...vtc, priority: 0 },
          { ...vtc, priority: -1, fairness: { kind: "global-strict" } },
        ]
      : [],
    defaultBand: vtc,
    defaultNegativeBand: null,
    usageLimit: { kind: "static", threshold: 1 },
    flowGcAfter: 300,
  };
}

function req(id: string, fairnessId: string, promptTokens: number, priority = 0): FlowRequest {
  return { id, fairnessId, priority, bytes: 10, receivedAt: 0, promptTokens };
}

/** B sent one short request that was served: the band knows two flows. */
function knowsB(c: FlowController): void {
  assert.equal(c.enqueue(req("b-early", "B", SHORT), 0), null);
  assert.equal(c.dispatch(0, 0, ["e1", "e2"])?.request.id, "b-early");
  c.prefillEnded("b-early");
  c.completed("B", 0, 1);
}

const EPS2 = ["e1", "e2"];
const next = (c: FlowController, eps: readonly string[] = EPS2) => c.dispatch(0, 0, eps)?.request.id ?? null;

describe("PrefillTracker", () => {
  it("an unplaced long request takes a free endpoint until it is placed; ends are idempotent", () => {
    const t = new PrefillTracker();
    const flow = { fairnessId: "A", priority: 0 };
    assert.equal(t.free(["e1", "e2", "e3"]), 3);
    t.dispatched("a1", flow);
    assert.equal(t.free(["e1", "e2", "e3"]), 2, "unplaced: it may still take any free one");
    assert.equal(t.placed("a1", "e1"), true);
    assert.equal(t.free(["e1", "e2", "e3"]), 2);
    t.dispatched("a2", flow);
    t.placed("a2", "e1");
    assert.equal(t.free(["e1", "e2", "e3"]), 2, "two on one endpoint still leave two free");
    assert.equal(t.free(["e2", "e3"]), 2, "an endpoint no longer ready does not count");
    assert.deepEqual(t.ended("a1"), flow);
    assert.equal(t.ended("a1"), undefined, "a second end is a no-op");
    assert.equal(t.free(["e1", "e2", "e3"]), 2, "e1 still has a2");
    t.placed("a2", "e2");
    assert.equal(t.free(["e1", "e2", "e3"]), 2, "re-placing moves it (e1 free, e2 not)");
    assert.equal(t.free(["e1"]), 1);
    t.ended("a2");
    assert.equal(t.size, 0);
    assert.equal(t.free(["e1", "e2", "e3"]), 3);
    assert.equal(t.placed("zz", "e1"), false, "not a pending long prefill");
  });

  it("never reports fewer than 0 free", () => {
    const t = new PrefillTracker();
    for (let i = 0; i < 3; i++) t.dispatched(`a${i}`, { fairnessId: "A", priority: 0 });
    assert.equal(t.free(["e1", "e2"]), 0);
  });
});

describe("prefill reserve (vtc-fairness-policy prefillReserve)", () => {
  it("two endpoints, reserve 1: the flood prefills one long prompt at a time; B's short ones go at once", () => {
    const c = new FlowController(settings(1));
    knowsB(c);
    for (let i = 0; i < 3; i++) c.enqueue(req(`a${i}`, "A", LONG), 0);
    // A has no long prefill pending: its first goes anywhere.
    assert.equal(next(c), "a0");
    // Unplaced, a0 may take either endpoint: 1 free ≤ reserve, A's second is held, the cycle stops.
    assert.equal(next(c), null);
    c.placed("a0", "e1");
    assert.equal(next(c), null, "e2 is the reserve");
    c.enqueue(req("b0", "B", SHORT), 0);
    assert.equal(next(c), "b0", "B has none pending: it goes (to the free replica)");
    c.placed("b0", "e2");
    assert.equal(next(c), null);
    // a0's first token: A has none pending again, its next goes.
    assert.equal(c.prefillEnded("a0"), true);
    assert.equal(c.prefillEnded("a0"), false, "once");
    assert.equal(next(c), "a1");
    assert.equal(next(c), null);
    assert.equal(c.snapshot(0).bands[0].flows.find((f) => f.fairnessId === "A")?.longPrefillsPending, 1);
  });

  it("N endpoints, reserve r: a flood prefills on at most N − r of them at once", () => {
    const c = new FlowController(settings(1));
    knowsB(c);
    const eps = ["e1", "e2", "e3", "e4"];
    for (let i = 0; i < 6; i++) c.enqueue(req(`a${i}`, "A", LONG), 0);
    const out: string[] = [];
    for (let id = next(c, eps); id; id = next(c, eps)) {
      out.push(id);
      c.placed(id, eps[out.length - 1]);
    }
    // 4 free → a0; 3 free > 1 → a1; 2 free > 1 → a2; 1 free → held.
    assert.deepEqual(out, ["a0", "a1", "a2"]);
    const r2 = new FlowController(settings(2));
    knowsB(r2);
    for (let i = 0; i < 6; i++) r2.enqueue(req(`a${i}`, "A", LONG), 0);
    const out2: string[] = [];
    for (let id = next(r2, eps); id; id = next(r2, eps)) {
      out2.push(id);
      r2.placed(id, eps[out2.length - 1]);
    }
    assert.deepEqual(out2, ["a0", "a1"]);
  });

  it("an under-served flow's own long prefill may take the reserve (each flow gets one)", () => {
    const c = new FlowController(settings(1));
    knowsB(c);
    c.enqueue(req("a0", "A", LONG), 0);
    c.enqueue(req("a1", "A", LONG), 0);
    assert.equal(next(c), "a0");
    c.placed("a0", "e1");
    c.enqueue(req("b0", "B", LONG), 0);
    c.enqueue(req("b1", "B", LONG), 0);
    assert.equal(next(c), "b0", "B had no long prefill pending");
    c.placed("b0", "e2");
    assert.equal(next(c), null, "both now have one pending and nothing is free");
    c.prefillEnded("b0");
    // e2 free again; A (one pending) needs more than 1 free; B has none pending.
    assert.equal(next(c), "b1");
  });

  it("short prompts are never held; longPrefillTokens is the boundary", () => {
    const c = new FlowController(settings(1, 1000));
    knowsB(c);
    c.enqueue(req("a0", "A", LONG), 0);
    c.enqueue(req("a1", "A", 999), 0);
    c.enqueue(req("a2", "A", 1000), 0);
    assert.equal(next(c), "a0");
    c.placed("a0", "e1");
    assert.equal(next(c), "a1", "999 tokens is not a long prefill");
    c.placed("a1", "e2");
    assert.equal(next(c), null, "1,000 tokens is");
    assert.equal(c.pendingPrefills, 1, "only a0 is tracked");
  });

  it("a band that knows one flow, a caller without endpoints, or reserve 0 holds nothing", () => {
    const alone = new FlowController(settings(1));
    for (let i = 0; i < 3; i++) alone.enqueue(req(`a${i}`, "A", LONG), 0);
    assert.deepEqual([next(alone), next(alone), next(alone)], ["a0", "a1", "a2"]);

    const blind = new FlowController(settings(1));
    knowsB(blind);
    for (let i = 0; i < 3; i++) blind.enqueue(req(`a${i}`, "A", LONG), 0);
    const ids = [0, 1, 2].map(() => blind.dispatch(0, 0)?.request.id);
    assert.deepEqual(ids, ["a0", "a1", "a2"]);

    const off = new FlowController(settings(0));
    knowsB(off);
    for (let i = 0; i < 3; i++) off.enqueue(req(`a${i}`, "A", LONG), 0);
    assert.deepEqual([next(off), next(off), next(off)], ["a0", "a1", "a2"]);
    assert.equal(off.pendingPrefills, 0, "nothing tracked without a reserve");
  });

  it("held, the band stops the cycle: a lower band does not overtake", () => {
    const c = new FlowController(settings(1, 1024, true));
    knowsB(c);
    c.enqueue(req("a0", "A", LONG), 0);
    c.enqueue(req("a1", "A", LONG), 0);
    c.enqueue(req("low", "L", SHORT, -1), 0);
    assert.equal(next(c), "a0");
    c.placed("a0", "e1");
    assert.equal(next(c), null);
    c.prefillEnded("a0");
    assert.equal(next(c), "a1");
  });

  it("a flow with a long prefill pending is not forgotten by gc", () => {
    const c = new FlowController({ ...settings(1), flowGcAfter: 1 });
    knowsB(c);
    c.enqueue(req("a0", "A", LONG), 0);
    assert.equal(next(c), "a0");
    c.completed("A", 0, 1); // a response that ended without prefillEnded (caller bug) …
    c.gc(10);
    assert.equal(c.snapshot(10).bands[0].flows.find((f) => f.fairnessId === "A")?.longPrefillsPending, 1);
    c.prefillEnded("a0");
    c.gc(10);
    assert.equal(
      c.snapshot(10).bands[0].flows.find((f) => f.fairnessId === "A"),
      undefined,
    );
  });
});

describe("prefill reserve, invariants (fast-check)", () => {
  const op = fc.oneof(
    fc.record({ k: fc.constant("enq" as const), flow: fc.nat(2), long: fc.boolean() }),
    fc.record({ k: fc.constant("dispatch" as const) }),
    fc.record({ k: fc.constant("place" as const), pick: fc.nat(50), ep: fc.nat(3) }),
    fc.record({ k: fc.constant("end" as const), pick: fc.nat(50) }),
  );

  it("a flow's second long prefill never leaves ≤ r free; once every prefill ends, all goes", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 3 }),
        fc.integer({ min: 1, max: 2 }),
        fc.array(op, { maxLength: 80 }),
        (n, r, ops) => {
          const eps = ["e0", "e1", "e2", "e3"].slice(0, n + 1);
          const c = new FlowController(settings(r));
          knowsB(c);
          // The test's own model: pending long prefills, id → [flow, endpoint | null].
          const model = new Map<string, [string, string | null]>();
          const freeOf = () => {
            const busy = new Set<string>();
            let unplaced = 0;
            for (const [, ep] of model.values())
              if (ep === null) unplaced++;
              else busy.add(ep);
            return Math.max(0, eps.filter((e) => !busy.has(e)).length - unplaced);
          };
          const dispatched: string[] = [];
          // The flows the band knows (nothing is forgotten here): the reserve needs two.
          const seen = new Set(["B"]);
          let seq = 0;
          const take = () => {
            const free = freeOf();
            const d = c.dispatch(0, 0, eps);
            if (d === null) return false;
            const { id, fairnessId, promptTokens } = d.request;
            if (promptTokens >= 1024) {
              const mine = [...model.values()].filter(([f]) => f === fairnessId).length;
              if (mine > 0 && seen.size > 1)
                assert.ok(free > r, `${id}: a second long prefill of ${fairnessId} with ${free} free`);
              model.set(id, [fairnessId, null]);
            }
            dispatched.push(id);
            return true;
          };
          for (const o of ops) {
            if (o.k === "enq") {
              seen.add(["A", "B", "C"][o.flow]);
              c.enqueue(req(`q${seq++}`, ["A", "B", "C"][o.flow], o.long ? LONG : SHORT), 0);
            } else if (o.k === "dispatch") take();
            else if (dispatched.length > 0) {
              const id = dispatched[o.pick % dispatched.length];
              if (o.k === "place") {
                const m = model.get(id);
                if (m && m[1] === null) {
                  c.placed(id, eps[o.ep % eps.length]);
                  m[1] = eps[o.ep % eps.length];
                }
              } else {
                c.prefillEnded(id);
                model.delete(id);
              }
            }
          }
          // Liveness: end every pending prefill as it is dispatched; the queue drains.
          const endAll = () => {
            for (const id of [...model.keys()]) {
              c.prefillEnded(id);
              model.delete(id);
            }
          };
          for (let guard = 0; c.size > 0 && guard < 1000; guard++) {
            while (take());
            endAll();
          }
          endAll();
          assert.equal(c.size, 0);
          assert.equal(c.pendingPrefills, 0);
        },
      ),
      { seed: 14, numRuns: 300 },
    );
  });
});

describe("config", () => {
  const doc = (params: string) => `featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: vtc-fairness-policy
  parameters: ${params}
schedulingProfiles: [{ name: default, plugins: [{ pluginRef: queue-scorer }, { pluginRef: max-score-picker }] }]
flowControl:
  priorityBands:
  - { priority: 0, fairnessPolicyRef: vtc-fairness-policy }
`;
  it("prefillReserve and longPrefillTokens reach the band; 0 (the default) is off", async () => {
    const { createScheduler } = await import("../src/scheduler/scheduler.ts");
    const on = await createScheduler(doc("{ prefillReserve: 1, longPrefillTokens: 2000 }"), { seed: 1 });
    assert.deepEqual(on.config.flowControl?.bands[0].fairness, {
      kind: "vtc",
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      prefillReserve: 1,
      longPrefillTokens: 2000,
    });
    const off = await createScheduler(doc("{ holdback: 0.2 }"), { seed: 1 });
    assert.deepEqual(off.config.flowControl?.bands[0].fairness, {
      kind: "vtc",
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      holdback: 0.2,
    });
    await assert.rejects(createScheduler(doc("{ prefillReserve: 0.5 }"), { seed: 1 }), /prefillReserve/);
    await assert.rejects(createScheduler(doc("{ longPrefillTokens: 0 }"), { seed: 1 }), /longPrefillTokens/);
  });
});
