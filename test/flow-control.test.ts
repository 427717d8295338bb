/**
 * The pure flow-control queue (src/flow/flow-control.ts) against hand-worked queues: each fairness
 * policy (global-strict, round-robin, VTC's served-token accounting and lift), each ordering policy
 * (FCFS, EDF, SLO-deadline), strict priority and saturation-gated dispatch, capacity and TTL outcomes
 * with llm-d's status and reason, disconnect removal; and, with fast-check, that no request is lost
 * or duplicated and that a lower band never goes while a higher one has a request.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  type BandTemplate,
  FlowController,
  type FlowControlSettings,
  type FlowRequest,
} from "../src/flow/flow-control.ts";
import { ceilings } from "../src/flow/policies.ts";

const FCFS_STRICT: BandTemplate = {
  maxRequests: 0,
  maxBytes: 0,
  fairness: { kind: "global-strict" },
  ordering: "fcfs",
};

function settings(
  band: Partial<BandTemplate> = {},
  over: Partial<FlowControlSettings> = {},
): FlowControlSettings {
  return {
    maxRequests: 0,
    maxBytes: 0,
    defaultRequestTTL: 60,
    noEndpointRequestTTL: 60,
    bands: [],
    defaultBand: { ...FCFS_STRICT, ...band },
    defaultNegativeBand: null,
    usageLimit: { kind: "static", threshold: 1 },
    flowGcAfter: 300,
    ...over,
  };
}

const t = 0;
function req(id: string, fairnessId: string, o: Partial<FlowRequest> = {}): FlowRequest {
  return { id, fairnessId, priority: 0, bytes: 100, receivedAt: t, promptTokens: 10, ...o };
}

function drain(c: FlowController, now = 1, saturation = 0): string[] {
  const out: string[] = [];
  for (let d = c.dispatch(now, saturation); d; d = c.dispatch(now, saturation)) out.push(d.request.id);
  return out;
}

function enqueueAll(c: FlowController, rs: FlowRequest[], now = 0): void {
  for (const r of rs) assert.equal(c.enqueue(r, now), null);
}

describe("fairness policies", () => {
  it("global-strict: one logical FCFS queue across flows", () => {
    const c = new FlowController(settings());
    enqueueAll(c, [req("a1", "A"), req("b1", "B"), req("a2", "A"), req("b2", "B")]);
    assert.deepEqual(drain(c), ["a1", "b1", "a2", "b2"]);
  });

  it("round-robin: flows take turns by fairness id, skipping empty ones", () => {
    const c = new FlowController(settings({ fairness: { kind: "round-robin" } }));
    enqueueAll(c, [
      req("a1", "A"),
      req("a2", "A"),
      req("a3", "A"),
      req("b1", "B"),
      req("c1", "C"),
      req("c2", "C"),
    ]);
    assert.deepEqual(drain(c), ["a1", "b1", "c1", "a2", "c2", "a3"]);
  });

  it("VTC: the least-served flow goes next; prompt tokens are charged at dispatch", () => {
    const c = new FlowController(
      settings({ fairness: { kind: "vtc", promptTokenWeight: 1, outputTokenWeight: 2 } }),
    );
    // A sends 100-token prompts, B 10-token ones. Counters: A 0→100 after a1; B 0→10→20→30.
    enqueueAll(c, [
      req("a1", "A", { promptTokens: 100 }),
      req("a2", "A", { promptTokens: 100 }),
      req("a3", "A", { promptTokens: 100 }),
      req("b1", "B"),
      req("b2", "B"),
      req("b3", "B"),
    ]);
    assert.deepEqual(drain(c), ["a1", "b1", "b2", "b3", "a2", "a3"]);
    const flows = c.snapshot(1).bands[0].flows;
    assert.deepEqual(
      flows.map((f) => [f.fairnessId, f.servedTokens, f.virtualCounter]),
      [
        ["A", 300, 300],
        ["B", 30, 30],
      ],
    );
  });

  it("VTC: output tokens reported at completion count twice (w_q = 2) and steer the next pick", () => {
    const c = new FlowController(
      settings({ fairness: { kind: "vtc", promptTokenWeight: 1, outputTokenWeight: 2 } }),
    );
    enqueueAll(c, [req("a1", "A"), req("b1", "B")]);
    assert.deepEqual(drain(c), ["a1", "b1"]); // both counters 10
    c.completed("A", 0, 50); // A: 10 + 2·50 = 110
    c.completed("B", 0, 5, -4); // B: 10 + 2·5 − 4 (usage said 6 prompt tokens, not 10) = 16
    enqueueAll(c, [req("b2", "B"), req("a2", "A"), req("a3", "A")], 1);
    // B returns to an idle band: lifted to its floor, the last charge (10), so stays 16; A is lifted
    // to at least the backlogged B's 16 (no effect: 110). B goes first, then A twice.
    assert.deepEqual(drain(c, 2), ["b2", "a2", "a3"]);
    const f = c.snapshot(2).bands[0].flows;
    assert.deepEqual(
      f.map((x) => [x.fairnessId, x.servedTokens, x.virtualCounter]),
      [
        ["A", 10 + 50 + 20, 130],
        ["B", 10 + 5 - 4 + 10, 26],
      ],
    );
  });

  it("VTC: a flow returning from idle is lifted to the least-served backlogged flow, so it banks no credit", () => {
    const c = new FlowController(
      settings({ fairness: { kind: "vtc", promptTokenWeight: 1, outputTokenWeight: 0 } }),
    );
    enqueueAll(c, [req("b1", "B")]);
    assert.deepEqual(drain(c), ["b1"]); // B = 10, then idle
    for (let i = 0; i < 40; i++) assert.equal(c.enqueue(req(`a${i}`, "A"), 1), null);
    for (let i = 0; i < 30; i++) c.dispatch(2, 0); // A = 10 (lifted to the idle band's floor) + 300
    assert.equal(c.snapshot(2).bands[0].flows.find((f) => f.fairnessId === "A")?.virtualCounter, 310);
    enqueueAll(c, [req("b2", "B"), req("b3", "B")], 3);
    // Without the lift B (10) would get the next 30 turns; lifted to 310 it alternates with A.
    assert.equal(c.snapshot(3).bands[0].flows.find((f) => f.fairnessId === "B")?.virtualCounter, 310);
    assert.deepEqual(drain(c, 4).slice(0, 4), ["a30", "b2", "a31", "b3"]);
  });
});

describe("ordering policies", () => {
  it("EDF: earliest enqueue + TTL first; requests without a TTL after, FCFS", () => {
    const c = new FlowController(settings({ ordering: "edf" }, { defaultRequestTTL: 0 }));
    enqueueAll(c, [
      req("r30", "A", { ttl: 30 }),
      req("none1", "A"),
      req("r10", "A", { ttl: 10 }),
      req("none2", "A"),
    ]);
    assert.equal(c.enqueue(req("r25late", "A", { ttl: 20 }), 5), null); // deadline 25
    assert.deepEqual(drain(c, 6), ["r10", "r25late", "r30", "none1", "none2"]);
  });

  it("SLO-deadline: earliest received + TTFT SLO first; requests without an SLO last", () => {
    const c = new FlowController(settings({ ordering: "slo-deadline" }));
    enqueueAll(c, [
      req("slo500", "A", { receivedAt: 0, sloTtftMs: 500 }),
      req("noslo", "A", { receivedAt: 0 }),
      req("slo100late", "A", { receivedAt: 0.1, sloTtftMs: 100 }), // deadline 0.2
      req("slo300", "A", { receivedAt: 0, sloTtftMs: 300 }),
    ]);
    assert.deepEqual(drain(c), ["slo100late", "slo300", "slo500", "noslo"]);
  });

  it("global-strict compares the ordering policy's heads across flows", () => {
    const c = new FlowController(settings({ ordering: "slo-deadline" }));
    enqueueAll(c, [
      req("a-late", "A", { sloTtftMs: 900 }),
      req("b-soon", "B", { sloTtftMs: 100 }),
      req("a-soon", "A", { sloTtftMs: 200 }),
    ]);
    assert.deepEqual(drain(c), ["b-soon", "a-soon", "a-late"]);
  });
});

describe("priority bands and saturation-gated dispatch", () => {
  it("strict priority: the highest non-empty band goes first, whatever arrived first", () => {
    const c = new FlowController(settings());
    enqueueAll(c, [req("low", "A", { priority: -1 }), req("std", "A"), req("crit", "A", { priority: 10 })]);
    assert.deepEqual(drain(c), ["crit", "std", "low"]);
  });

  it("nothing is dispatched while saturation ≥ the ceiling; it goes when the gate opens", () => {
    const c = new FlowController(settings());
    enqueueAll(c, [req("r1", "A"), req("r2", "A")]);
    assert.equal(c.dispatch(1, 1.0), null);
    assert.equal(c.dispatch(1, 3.5), null);
    assert.equal(c.size, 2);
    assert.equal(c.dispatch(2, 0.99)?.request.id, "r1");
    assert.equal(c.dispatch(2, 0.99)?.waited, 2);
  });

  it("priority-holdback: lower bands stop at lower saturation; a gated band blocks the ones below", () => {
    assert.deepEqual(
      ceilings({ kind: "priority-holdback", domain: "rank", minCeiling: 0.5, maxCeiling: 1 }, [10, 0, -1]),
      [1, 0.75, 0.5],
    );
    assert.deepEqual(
      ceilings(
        { kind: "priority-holdback", domain: "value", minCeiling: 0.2, maxCeiling: 1 },
        [10, 0, -10],
      ).map((x) => Math.round(x * 1e9) / 1e9),
      [1, 0.6, 0.2],
    );
    const c = new FlowController(
      settings(
        {},
        { usageLimit: { kind: "priority-holdback", domain: "rank", minCeiling: 0.5, maxCeiling: 1 } },
      ),
    );
    enqueueAll(c, [req("low", "A", { priority: -1 }), req("std", "A"), req("crit", "A", { priority: 10 })]);
    assert.deepEqual(drain(c, 1, 0.8), ["crit"]); // 0.8 ≥ 0.75: std waits, so low waits too
    assert.deepEqual(drain(c, 1, 0.6), ["std"]);
    assert.deepEqual(drain(c, 1, 0.49), ["low"]);
  });
});

describe("capacity, TTL and disconnect outcomes", () => {
  it("a full band rejects with 429 rejected-saturated (503 rejected-no-endpoints with an empty pool)", () => {
    const c = new FlowController(settings({}, { bands: [{ ...FCFS_STRICT, priority: -1, maxRequests: 2 }] }));
    enqueueAll(c, [req("s1", "A", { priority: -1 }), req("s2", "B", { priority: -1 })]);
    const r = c.enqueue(req("s3", "A", { priority: -1 }), 0);
    assert.equal(r?.status, 429);
    assert.equal(r?.reason, "rejected-saturated");
    assert.equal(r?.outcome, "RejectedCapacity");
    assert.match(r?.message ?? "", /priority band -1 maxRequests 2/);
    const e = c.enqueue(req("s4", "A", { priority: -1 }), 0, true);
    assert.deepEqual(
      [e?.status, e?.reason, e?.outcome],
      [503, "rejected-no-endpoints", "RejectedNoEndpoints"],
    );
    assert.equal(c.enqueue(req("other-band", "A"), 0), null); // band 0 is not full
    assert.equal(c.size, 3);
  });

  it("global and per-band byte limits; the global request limit spans bands", () => {
    const c = new FlowController(settings({ maxBytes: 250 }, { maxRequests: 3 }));
    enqueueAll(c, [req("a", "A", { bytes: 200 })]);
    assert.match(c.enqueue(req("b", "A", { bytes: 100 }), 0)?.message ?? "", /priority band 0 maxBytes 250/);
    enqueueAll(c, [req("c", "A", { bytes: 50 }), req("d", "A", { priority: 5 })]);
    const r = c.enqueue(req("e", "A", { priority: 7 }), 0);
    assert.match(r?.message ?? "", /global maxRequests 3/);
    assert.equal(r?.status, 429);
  });

  it("the default band is 5000 requests, as llm-d", () => {
    const c = new FlowController(settings());
    for (let i = 0; i < 5000; i++) assert.equal(c.enqueue(req(`r${i}`, "A", { bytes: 1 }), 0), null);
    assert.equal(c.enqueue(req("one-more", "A", { bytes: 1 }), 0)?.status, 429);
  });

  it("unconfigured negative priorities use defaultNegativePriorityBand", () => {
    const c = new FlowController(settings({}, { defaultNegativeBand: { ...FCFS_STRICT, maxRequests: 1 } }));
    enqueueAll(c, [req("n1", "A", { priority: -3 })]);
    assert.equal(c.enqueue(req("n2", "A", { priority: -3 }), 0)?.status, 429);
    assert.equal(c.enqueue(req("p1", "A", { priority: 3 }), 0), null);
  });

  it("TTL: a request queued for defaultRequestTTL leaves with 503 rejected-ttl-expired", () => {
    const c = new FlowController(settings({}, { defaultRequestTTL: 60, noEndpointRequestTTL: 5 }));
    assert.equal(c.enqueue(req("old", "A"), 0), null);
    assert.equal(c.enqueue(req("young", "A"), 30), null);
    assert.deepEqual(c.expire(59.9), []);
    const [e, ...rest] = c.expire(60);
    assert.equal(rest.length, 0);
    assert.equal(e.request.id, "old");
    assert.deepEqual(
      [e.rejection.status, e.rejection.reason, e.outcome],
      [503, "rejected-ttl-expired", "EvictedTTL"],
    );
    // With no endpoints the noEndpointRequestTTL applies and the reason says so.
    const [n] = c.expire(35, true);
    assert.deepEqual(
      [n.request.id, n.rejection.status, n.rejection.reason],
      ["young", 503, "rejected-no-endpoints"],
    );
    assert.equal(c.size, 0);
  });

  it("TTL 0 disables expiry", () => {
    const c = new FlowController(settings({}, { defaultRequestTTL: 0 }));
    enqueueAll(c, [req("r", "A")]);
    assert.deepEqual(c.expire(1e6), []);
  });

  it("a disconnect removes the request at once; it is never dispatched", () => {
    const c = new FlowController(settings({ fairness: { kind: "round-robin" } }));
    enqueueAll(c, [req("a1", "A"), req("b1", "B"), req("a2", "A")]);
    const left = c.remove("b1", 4);
    assert.deepEqual([left?.request.id, left?.outcome, left?.waited], ["b1", "EvictedContextCancelled", 4]);
    assert.equal(c.remove("b1", 5), null);
    assert.equal(c.has("b1"), false);
    assert.equal(c.snapshot(5).bands[0].flows.find((f) => f.fairnessId === "B")?.depth, 0);
    assert.deepEqual(drain(c), ["a1", "a2"]);
  });

  it("snapshot: depth, bytes and the age of the oldest request per band and flow", () => {
    const c = new FlowController(settings());
    assert.equal(c.enqueue(req("a1", "A", { bytes: 10 }), 1), null);
    assert.equal(c.enqueue(req("a2", "A", { bytes: 20 }), 4), null);
    assert.equal(c.enqueue(req("x", "X", { priority: 9, bytes: 5 }), 2), null);
    const s = c.snapshot(10);
    assert.deepEqual([s.queued, s.bytes], [3, 35]);
    assert.deepEqual(
      s.bands.map((b) => [
        b.priority,
        b.depth,
        b.flows.map((f) => [f.fairnessId, f.depth, f.bytes, f.oldestAgeSeconds]),
      ]),
      [
        [9, 1, [["X", 1, 5, 8]]],
        [0, 2, [["A", 2, 30, 9]]],
      ],
    );
  });
});

describe("invariants (fast-check)", () => {
  const op = fc.oneof(
    fc.record({
      k: fc.constant("enq" as const),
      flow: fc.constantFrom("A", "B", "C"),
      priority: fc.constantFrom(-1, 0, 5),
      bytes: fc.integer({ min: 1, max: 400 }),
      slo: fc.option(fc.integer({ min: 1, max: 5000 }), { nil: undefined }),
    }),
    fc.record({ k: fc.constant("disp" as const), sat: fc.double({ min: 0, max: 1.5, noNaN: true }) }),
    fc.record({ k: fc.constant("rm" as const), pick: fc.nat() }),
    fc.record({ k: fc.constant("tick" as const), dt: fc.double({ min: 0, max: 30, noNaN: true }) }),
    fc.record({ k: fc.constant("done" as const), flow: fc.constantFrom("A", "B", "C"), out: fc.nat(500) }),
  );
  const policy = fc.record({
    fairness: fc.constantFrom(
      { kind: "global-strict" as const },
      { kind: "round-robin" as const },
      { kind: "vtc" as const, promptTokenWeight: 1, outputTokenWeight: 2 },
    ),
    ordering: fc.constantFrom("fcfs" as const, "edf" as const, "slo-deadline" as const),
    maxRequests: fc.integer({ min: 1, max: 8 }),
  });

  it("every enqueued request leaves exactly once (dispatched, rejected, removed or expired); strict priority holds", () => {
    fc.assert(
      fc.property(policy, fc.array(op, { maxLength: 120 }), (pol, ops) => {
        const c = new FlowController(
          settings({ ...pol, maxBytes: 1000 }, { defaultRequestTTL: 45, maxRequests: 12 }),
        );
        const queued = new Map<string, number>(); // id → priority
        const left = new Set<string>();
        const leave = (id: string) => {
          assert.ok(queued.has(id), `${id} left but was not queued`);
          assert.ok(!left.has(id), `${id} left twice`);
          queued.delete(id);
          left.add(id);
        };
        let now = 0;
        let n = 0;
        for (const o of ops) {
          if (o.k === "enq") {
            const id = `r${n++}`;
            const r = c.enqueue(
              req(id, o.flow, { priority: o.priority, bytes: o.bytes, receivedAt: now, sloTtftMs: o.slo }),
              now,
            );
            if (r === null) queued.set(id, o.priority);
            else assert.ok(r.status === 429 && r.reason === "rejected-saturated");
          } else if (o.k === "disp") {
            const top = Math.max(...queued.values());
            const d = c.dispatch(now, o.sat);
            if (queued.size > 0 && o.sat < 1) assert.ok(d !== null, "work-conserving below the ceiling");
            if (o.sat >= 1) assert.equal(d, null);
            if (d) {
              assert.equal(d.request.priority, top, "a lower band went while a higher one had a request");
              leave(d.request.id);
            }
          } else if (o.k === "rm") {
            const ids = [...queued.keys()];
            if (ids.length === 0) continue;
            const id = ids[o.pick % ids.length];
            assert.equal(c.remove(id, now)?.request.id, id);
            leave(id);
          } else if (o.k === "tick") {
            now += o.dt;
            for (const e of c.expire(now)) leave(e.request.id);
          } else c.completed(o.flow, 0, o.out);
          assert.equal(c.size, queued.size);
        }
        for (const id of drain(c, now)) leave(id);
        assert.equal(queued.size, 0);
        assert.equal(c.size, 0);
      }),
      { seed: 14, numRuns: 300 },
    );
  });
});
