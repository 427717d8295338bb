/**
 * The structures that let the fleet simulator run 512 replicas: token times as views of a replica's
 * step timeline, the long-text map, the limits' block set, and the tokenizer without decode memory.
 * Each must give exactly what the plain structure it replaces gives. And the 512-replica scenario
 * keeps the 73%-capacity run's shape.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { ABSENT, BlockSet, COMPUTED, REUSED } from "../src/sim/fleet/block-set.ts";
import { loadScenario } from "../src/sim/fleet/scenario.ts";
import { oneTokenChunks, StepTimeline } from "../src/sim/fleet/step-timeline.ts";
import { TextMap } from "../src/sim/fleet/text-map.ts";

describe("step timeline", () => {
  it("hands back the very token times, as a view when they are a run of steps", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 1e-6, max: 0.2, noNaN: true }), { minLength: 1, maxLength: 40000 }),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 2000 }), fc.boolean())),
        (gaps, runs) => {
          const tl = new StepTimeline();
          const ends: number[] = [];
          let t = 0;
          for (const g of gaps) {
            t += g;
            ends.push(t);
            tl.push(t);
          }
          for (const [at, len, gap] of runs) {
            const start = at % ends.length;
            const times = ends.slice(start, start + len);
            // A preempted request skips steps: its times are no run.
            if (gap && times.length > 2) times.splice(1, 1);
            const got = tl.tokenTimes(times);
            assert.deepEqual(Array.from(got), times);
          }
          assert.equal(tl.views + tl.copies, runs.length);
        },
      ),
      { numRuns: 30 },
    );
  });

  it("makes views for consecutive steps and copies across a skipped one", () => {
    const tl = new StepTimeline();
    for (let i = 1; i <= 100; i++) tl.push(i / 10);
    const run = [0.5, 0.6, 0.7, 0.8];
    const v = tl.tokenTimes(run);
    assert.equal(tl.views, 1);
    assert.equal(v.buffer.byteLength, 16384 * 8, "a view of the timeline's segment");
    tl.tokenTimes([0.5, 0.7]);
    assert.equal(tl.copies, 1);
  });

  it("one-token chunks are ones of the asked length", () => {
    for (const m of [0, 1, 1000, 5000]) {
      const a = oneTokenChunks(m);
      assert.equal(a.length, m);
      assert.ok(a.every((x) => x === 1));
    }
  });
});

describe("TextMap", () => {
  it("behaves as a Map, long same-length texts included", () => {
    const long = (s: string) => s.padEnd(20000, "x");
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.string({ maxLength: 6 }), fc.boolean(), fc.integer())),
        fc.array(fc.tuple(fc.string({ maxLength: 6 }), fc.boolean())),
        (puts, gets) => {
          const m = new TextMap<number>();
          const ref = new Map<string, number>();
          for (const [s, isLong, v] of puts) {
            const k = isLong ? long(s) : s;
            m.set(k, v);
            ref.set(k, v);
          }
          assert.equal(m.size, ref.size);
          for (const [s, isLong] of [...gets, ...puts.map(([s, l]) => [s, l] as const)]) {
            const k = isLong ? long(s) : s;
            assert.equal(m.get(k), ref.get(k));
          }
        },
      ),
    );
  });
});

describe("BlockSet", () => {
  it("tracks states as a Map would, across growth", () => {
    const key = fc.oneof(fc.integer({ min: 0, max: 5000 }), fc.maxSafeNat());
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.boolean(), key), { maxLength: 20000 }), (ops) => {
        const s = new BlockSet();
        const ref = new Map<number, number>();
        for (const [reuse, b] of ops) {
          if (reuse && ref.has(b)) {
            s.markReused(b);
            ref.set(b, REUSED);
          } else {
            s.add(b);
            if (!ref.has(b)) ref.set(b, COMPUTED);
          }
        }
        assert.equal(s.size, ref.size);
        for (const [, b] of ops) assert.equal(s.state(b), ref.get(b));
        assert.equal(s.state(2 ** 53 + 7), ABSENT);
      }),
      { numRuns: 50 },
    );
  });
});

describe("sim tokenizer without decode memory", () => {
  it("encodes the same ids", () => {
    const a = createSimTokenizer();
    const b = createSimTokenizer({ reverseMapSize: 0 });
    fc.assert(fc.property(fc.string({ maxLength: 200 }), (s) => assert.deepEqual(b.encode(s), a.encode(s))));
    assert.notEqual(b.decode(b.encode("hello world", false)), "hello world");
    assert.equal(a.decode(a.encode("hello world", false)), "hello world");
  });
});

describe("scenarios/scale-512.yaml", () => {
  it("is llm-d's 73%-capacity shape at 64x: groups, fleet and every stage's rate", () => {
    const sc = loadScenario("scenarios/scale-512.yaml");
    const base = loadScenario("scenarios/shared-prefix-73.yaml");
    assert.equal(sc.fleet.replicas, 64 * base.fleet.replicas);
    assert.equal(sc.fleet.numGpuBlocks, base.fleet.numGpuBlocks);
    assert.equal(sc.workload.options.numGroups, 64 * (base.workload.options.numGroups as number));
    for (const k of ["promptsPerGroup", "systemPromptLen", "questionLen", "outputLen"])
      assert.equal(sc.workload.options[k], base.workload.options[k], k);
    const rates = new Set(
      base.workload.arrival.type === "stages" ? base.workload.arrival.stages.map((s) => 64 * s.rate) : [],
    );
    assert.equal(sc.workload.arrival.type, "stages");
    if (sc.workload.arrival.type === "stages")
      for (const s of sc.workload.arrival.stages)
        assert.ok(rates.has(s.rate), `${s.rate} QPS is 64x a stage`);
    assert.ok(sc.routers.some((r) => r.name === "default"));
  });
});
