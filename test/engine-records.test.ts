/**
 * A request's record (output ids and token times, kept in per-request buffers and copied out) tells
 * the same story as the step outputs streamed it: under KV pressure with preemptions, natural stops
 * and mid-flight copies (requestRecord, abort).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import type { RequestRecord } from "../src/engine/types.ts";
import { Engine, engineConfig, tokens } from "./helpers/engine-fixtures.ts";

interface Streamed {
  ids: number[];
  times: number[];
}

describe("engine request records", () => {
  it("final and mid-flight records equal what the steps streamed, across preemptions", () => {
    let preempted = 0;
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2 ** 31 - 1 }),
        fc.array(
          fc.record({
            prompt: fc.integer({ min: 1, max: 400 }),
            base: fc.integer({ min: 0, max: 3 }),
            maxTokens: fc.integer({ min: 1, max: 120 }),
            ignoreEos: fc.boolean(),
            abortAfter: fc.option(fc.integer({ min: 1, max: 40 }), { nil: undefined }),
          }),
          { minLength: 1, maxLength: 12 },
        ),
        (seed, reqs) => {
          // Few blocks, so long requests preempt each other and recompute.
          const e = new Engine(
            engineConfig({ seed, numGpuBlocks: 48, maxModelLen: 640, maxNumBatchedTokens: 256 }),
          );
          const streamed = new Map<string, Streamed>();
          reqs.forEach((q, k) => {
            const id = `r${k}`;
            e.addRequest(
              {
                id,
                promptTokenIds: tokens(q.prompt, q.base * 1000),
                maxTokens: q.maxTokens,
                ignoreEos: q.ignoreEos,
              },
              0,
            );
            streamed.set(id, { ids: [], times: [] });
          });
          const finals = new Map<string, RequestRecord>();
          let now = 0;
          let steps = 0;
          while (e.hasUnfinishedRequests()) {
            const r = e.step(now);
            assert.ok(r.numScheduledRequests > 0, "the engine stalled");
            for (const o of r.outputs) {
              const s = streamed.get(o.requestId) as Streamed;
              s.ids.push(...o.newTokenIds);
              s.times.push(r.endTime);
              if (o.record !== undefined) finals.set(o.requestId, o.record);
            }
            now = r.endTime;
            steps++;
            reqs.forEach((q, k) => {
              const id = `r${k}`;
              const live = e.requestRecord(id);
              if (live === null) return;
              const s = streamed.get(id) as Streamed;
              assert.deepEqual(live.outputTokenIds, s.ids, `${id} mid-flight ids`);
              assert.deepEqual(live.tokenTimes, s.times, `${id} mid-flight times`);
              if (q.abortAfter === steps) {
                const rec = e.abort(id, now) as RequestRecord;
                assert.deepEqual(rec.outputTokenIds, s.ids, `${id} aborted ids`);
                assert.deepEqual(rec.tokenTimes, s.times, `${id} aborted times`);
                finals.set(id, rec);
              }
            });
          }
          preempted += e.stats().numPreemptions;
          for (const [id, s] of streamed) {
            const rec = finals.get(id) as RequestRecord;
            assert.deepEqual(rec.outputTokenIds, s.ids, `${id} final ids`);
            assert.deepEqual(rec.tokenTimes, s.times, `${id} final times`);
            assert.equal(rec.firstTokenTime, s.times[0] ?? null);
          }
          return true;
        },
      ),
      { seed: 9, numRuns: 60 },
    );
    assert.ok(preempted > 0, "the runs preempted nothing: the property never saw a recompute");
  });
});
