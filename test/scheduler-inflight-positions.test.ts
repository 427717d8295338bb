// The in-flight producer's counters by candidate position agree with its counters by id, through
// picks, failovers, responses, pool changes and re-ordered candidate lists.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { IndexCache } from "../src/scheduler/candidate-index.ts";
import { Cycle } from "../src/scheduler/cycle.ts";
import type { InFlightInfo } from "../src/scheduler/plugins/data.ts";
import { inflightKey } from "../src/scheduler/plugins/data.ts";
import { InflightLoadProducer, inflightParams } from "../src/scheduler/plugins/inflight/producer.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState, RequestFacts, ScheduleResult } from "../src/scheduler/types.ts";

describe("in-flight counters by position", () => {
  it("match the counters by id after every event", () => {
    const rng = createRng(21);
    const p = new InflightLoadProducer("i", inflightParams.parse({}));
    const cache = new IndexCache();
    const pool = Array.from({ length: 30 }, (_, i) => endpoint(`10.1.0.${i}:8000`));
    let list: EndpointState[] = [...pool];
    const open: { req: RequestFacts; target: string }[] = [];
    for (let step = 0; step < 3000; step++) {
      const r = rng.next();
      if (r < 0.05) list = pool.filter(() => rng.next() < 0.8);
      else if (r < 0.08) list = [...list].reverse();
      else if (r < 0.1) {
        const keep = new Set(list.map((e) => e.id));
        p.retainEndpoints(keep);
        for (let k = open.length - 1; k >= 0; k--) if (!keep.has(open[k].target)) open.splice(k, 1);
      }
      if (list.length === 0) list = [...pool];
      const req = completion(`r${step}`, "x".repeat(rng.int(4000)));
      const cycle = new Cycle(req, [...list], 0, rng, cache);
      p.produce(cycle);
      const info = cycle.get(inflightKey("i")) as InFlightInfo;
      const at = info.byPosition?.();
      assert.ok(at);
      cycle.candidates.forEach((e, i) => {
        assert.equal(at.requests[i], info.requests(e.id), `step ${step} requests ${e.id}`);
        assert.equal(at.tokens[i], info.tokens(e.id), `step ${step} tokens ${e.id}`);
        assert.equal(at.context?.[i], info.contextTokens?.(e.id), `step ${step} context ${e.id}`);
      });
      assert.equal(at.requests.length, cycle.candidates.length);
      const target = cycle.candidates[rng.int(cycle.candidates.length)];
      const result = {
        requestId: req.requestId,
        profiles: { default: { target } },
      } as unknown as ScheduleResult;
      p.preRequest(cycle, result, step);
      open.push({ req, target: target.id });
      while (open.length > 0 && rng.next() < 0.45) {
        const o = open.splice(rng.int(open.length), 1)[0];
        const served = rng.next() < 0.1 ? pool[rng.int(pool.length)].id : o.target;
        if (rng.next() < 0.7) p.onResponseStarted(o.req, served, step + 0.5);
        p.onResponseComplete(o.req, served);
      }
    }
    // Context is released at each request's end: an endpoint with no open request holds none.
    const held = new Set(open.map((o) => o.target));
    for (const e of pool) if (!held.has(e.id)) assert.equal(p.contextTokens(e.id), 0, e.id);
  });
});
