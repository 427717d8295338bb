// The in-flight producer's view of requests still waiting for their first token: the oldest one's
// pick time per endpoint, and each endpoint's usual wait to start (slot-cap.ts's stall signal).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { IndexCache } from "../src/scheduler/candidate-index.ts";
import { Cycle } from "../src/scheduler/cycle.ts";
import { InflightLoadProducer, inflightParams } from "../src/scheduler/plugins/inflight/producer.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import type { RequestFacts, ScheduleResult } from "../src/scheduler/types.ts";

const pool = Array.from({ length: 6 }, (_, i) => endpoint(`10.2.0.${i}:8000`));

function pick(p: InflightLoadProducer, req: RequestFacts, target: (typeof pool)[number], now: number) {
  const cycle = new Cycle(req, [...pool], now, createRng(1), new IndexCache());
  p.produce(cycle);
  const result = { requestId: req.requestId, profiles: { default: { target } } } as unknown as ScheduleResult;
  p.preRequest(cycle, result, now);
}

describe("in-flight producer: requests waiting to start", () => {
  it("gives the pick time of each endpoint's oldest request without a first token", () => {
    const rng = createRng(7);
    const p = new InflightLoadProducer("i", inflightParams.parse({}));
    const open: { req: RequestFacts; target: string; at: number; started: boolean }[] = [];
    for (let step = 0; step < 4000; step++) {
      const now = step * 0.01;
      const req = completion(`r${step}`, "x".repeat(rng.int(300)));
      const target = pool[rng.int(pool.length)];
      pick(p, req, target, now);
      open.push({ req, target: target.id, at: now, started: false });
      // First tokens and ends out of order, some on another endpoint (a failover).
      while (open.length > 0 && rng.next() < 0.6) {
        const k = rng.int(open.length);
        const o = open[k];
        const served = rng.next() < 0.05 ? pool[rng.int(pool.length)].id : o.target;
        if (!o.started && rng.next() < 0.7) {
          p.onResponseStarted(o.req, served, now);
          o.started = true;
          o.target = served;
        } else {
          p.onResponseComplete(o.req, served);
          open.splice(k, 1);
        }
      }
      for (const e of pool) {
        const waiting = open.filter((o) => !o.started && o.target === e.id).map((o) => o.at);
        const want = waiting.length === 0 ? undefined : Math.min(...waiting);
        assert.equal(p.oldestWaitingSince(e.id), want, `step ${step}, ${e.id}`);
      }
    }
  });

  it("learns each endpoint's usual wait to start from its first tokens", () => {
    const p = new InflightLoadProducer("i", inflightParams.parse({}));
    const [a, b] = pool;
    assert.equal(p.usualWaitToStart(a.id), undefined, "nothing started yet");
    for (let k = 0; k < 20; k++) {
      const req = completion(`q${k}`, "hello?");
      pick(p, req, a, k);
      p.onResponseStarted(req, a.id, k + 0.05);
      p.onResponseComplete(req, a.id);
    }
    const usual = p.usualWaitToStart(a.id) as number;
    assert.ok(Math.abs(usual - 0.05) < 1e-9, `steady 50 ms starts: ${usual}`);
    assert.equal(p.usualWaitToStart(b.id), undefined, "another endpoint's starts are its own");
    // One slow start moves the average towards it, not to it: a stall stands out against it.
    const slow = completion("slow", "hello?");
    pick(p, slow, a, 30);
    p.onResponseStarted(slow, a.id, 31);
    const after = p.usualWaitToStart(a.id) as number;
    assert.ok(after > usual && after < 0.5, `after one 1 s start: ${after}`);
    p.retainEndpoints(new Set([b.id]));
    assert.equal(p.usualWaitToStart(a.id), undefined, "gone with its endpoint");
  });
});
