// Conformance over every scorer and picker: scores in [0,1] on random states, pickers pick only
// candidates (max-score a maximum, round-robin in id order), same seed → same picks.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { builtinRegistry } from "../src/scheduler/registry.ts";
import type { Rng } from "../src/scheduler/rng.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { chat, cycleFor, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState, Picker, Scorer } from "../src/scheduler/types.ts";
import { isScorer } from "../src/scheduler/types.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

const registry = builtinRegistry();
const kinds = (k: string) =>
  registry
    .specs()
    .filter((s) => s.kind === k)
    .map((s) => s.type);

function randomEndpoints(rng: Rng): EndpointState[] {
  const n = 1 + rng.int(12);
  return Array.from({ length: n }, (_, i) =>
    endpoint(
      `10.0.0.${i}:8000`,
      rng.next() < 0.15
        ? null
        : {
            waitingQueueSize: rng.int(300),
            runningRequestsSize: rng.int(64),
            kvCacheUsagePercent: rng.next(),
            cacheBlockSize: rng.next() < 0.5 ? 16 : undefined,
            cacheNumBlocks: rng.next() < 0.5 ? 1 + rng.int(5000) : undefined,
            updateTime: 0,
          },
      rng.next() < 0.5 ? { "llm-d.ai/role": rng.next() < 0.5 ? "decode" : "prefill" } : {},
    ),
  );
}

const prefixes = ["alpha ".repeat(90), "beta ".repeat(130), "gamma ".repeat(40), ""];

describe("scorer conformance", () => {
  for (const type of kinds("scorer")) {
    it(`${type}: scores are finite and in [0, 1] on random endpoint states`, async () => {
      const { scheduler } = await createScheduler(
        `plugins:\n- type: ${type}\n${type.startsWith("session") ? "  parameters: { strategy: session_id }\n" : ""}`,
        { seed: 7, hasher: h },
      );
      const scorer = [...scheduler.plugins.values()].find((p) => p.typedName.type === type);
      assert.ok(scorer && isScorer(scorer));
      const rng = createRng(11);
      for (let k = 0; k < 150; k++) {
        const eps = randomEndpoints(rng);
        const req = chat(`r${k}`, prefixes[rng.int(prefixes.length)], `q${rng.int(5)}`, {
          sessionId: `s${rng.int(4)}`,
          sessionToken: eps[rng.int(eps.length)].id,
          maxTokens: rng.int(100),
        });
        const res = scheduler.schedule(req, eps, k);
        const scores: ArrayLike<number> = (scorer as Scorer).score(res.cycle, eps);
        assert.equal(scores.length, eps.length);
        for (const s of Array.from(scores) as number[])
          assert.ok(Number.isFinite(s) && s >= 0 && s <= 1, `${type} gave ${s}`);
        scheduler.onPicked(req, res, k);
        if (rng.next() < 0.5 && res.target) scheduler.onResponseStarted(req, res.target.id, k);
        if (rng.next() < 0.6 && res.target) scheduler.onResponseComplete(req, res.target.id, k);
      }
    });
  }
});

describe("picker conformance", () => {
  const pickerOf = (type: string, params: Record<string, unknown> = {}) =>
    registry.get(type)?.factory("p", registry.get(type)?.params.parse(params) as Record<string, unknown>, {
      hasher: null,
      plugin: () => undefined,
    }) as Picker;

  for (const type of kinds("picker")) {
    for (const maxNumOfEndpoints of type === "round-robin-picker" ? [undefined] : [1, 3]) {
      it(`${type}${maxNumOfEndpoints ? ` (maxNumOfEndpoints ${maxNumOfEndpoints})` : ""}: picks distinct candidates only`, () => {
        const picker = pickerOf(type, maxNumOfEndpoints ? { maxNumOfEndpoints } : {});
        const rng = createRng(5);
        for (let k = 0; k < 300; k++) {
          const eps = randomEndpoints(rng);
          const scores = Float64Array.from(eps, () =>
            rng.next() < 0.3 ? 0 : Math.round(rng.next() * 4) / 4,
          );
          const picks = picker.pick(cycleFor(chat("r", "", ""), eps, 0, k), eps, scores);
          assert.ok(picks.length >= 1 && picks.length <= (maxNumOfEndpoints ?? 1));
          assert.equal(new Set(picks).size, picks.length);
          for (const i of picks) assert.ok(Number.isInteger(i) && i >= 0 && i < eps.length);
          if (type === "max-score-picker") {
            assert.equal(scores[picks[0]], Math.max(...scores));
            for (let j = 1; j < picks.length; j++) assert.ok(scores[picks[j - 1]] >= scores[picks[j]]);
          }
        }
      });
    }
  }

  it("max-score-picker breaks ties uniformly at random", () => {
    const picker = pickerOf("max-score-picker");
    const eps = ["a:1", "b:1", "c:1", "d:1"].map((id) => endpoint(id));
    const counts = [0, 0, 0, 0];
    const cyc = cycleFor(chat("r", "", ""), eps, 0, 9);
    for (let k = 0; k < 4000; k++) counts[picker.pick(cyc, eps, Float64Array.from([1, 1, 1, 0.5]))[0]]++;
    assert.equal(counts[3], 0);
    for (const c of counts.slice(0, 3)) assert.ok(c > 1100 && c < 1570, `tie counts ${counts}`);
  });

  it("max-score-picker: a maximum after lower ties, shared or not, is picked uniformly", () => {
    const picker = pickerOf("max-score-picker");
    const eps = ["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"].map((id) => endpoint(id));
    const cyc = cycleFor(chat("r", "", ""), eps, 0, 5);
    const counts = [0, 0, 0, 0, 0, 0];
    for (let k = 0; k < 6000; k++)
      counts[picker.pick(cyc, eps, Float64Array.from([0.5, 0.5, 1, 0.5, 1, 1]))[0]]++;
    assert.deepEqual(counts.slice(0, 2), [0, 0]);
    assert.equal(counts[3], 0);
    for (const i of [2, 4, 5]) assert.ok(Math.abs(counts[i] - 2000) < 200, `index ${i}: ${counts[i]}`);
    assert.equal(picker.pick(cyc, eps, Float64Array.from([0.5, 0.5, 0.7, 0.5, 0.1, 0.2]))[0], 2);
  });

  it("weighted-random-picker picks in proportion to score", () => {
    const picker = pickerOf("weighted-random-picker");
    const eps = ["a:1", "b:1", "c:1"].map((id) => endpoint(id));
    const counts = [0, 0, 0];
    const cyc = cycleFor(chat("r", "", ""), eps, 0, 4);
    for (let k = 0; k < 6000; k++) counts[picker.pick(cyc, eps, Float64Array.from([3, 1, 0]))[0]]++;
    assert.equal(counts[2], 0);
    assert.ok(counts[0] > 4200 && counts[0] < 4800, `weighted counts ${counts}`);
  });

  it("round-robin-picker cycles in endpoint-id order regardless of scores and input order", () => {
    const picker = pickerOf("round-robin-picker");
    const eps = ["c:1", "a:1", "b:1"].map((id) => endpoint(id));
    const cyc = cycleFor(chat("r", "", ""), eps);
    const seen = Array.from(
      { length: 7 },
      () => eps[picker.pick(cyc, eps, Float64Array.from([9, 0, 0]))[0]].id,
    );
    assert.deepEqual(seen, ["a:1", "b:1", "c:1", "a:1", "b:1", "c:1", "a:1"]);
    const fewer = [eps[0], eps[1]]; // b:1 left: after a:1 comes c:1
    assert.equal(fewer[picker.pick(cyc, fewer, Float64Array.from([0, 0]))[0]].id, "c:1");
  });
});

describe("determinism", () => {
  const run = async (seed: number, config: string) => {
    const { scheduler } = await createScheduler(config, { seed, hasher: h });
    const rng = createRng(3);
    const eps = randomEndpoints(createRng(99)).concat(
      randomEndpoints(createRng(98)).map((e) => ({ ...e, id: `x${e.id}` })),
    );
    const picks: string[] = [];
    for (let k = 0; k < 200; k++) {
      const req = chat(`r${k}`, prefixes[rng.int(prefixes.length)], `q${rng.int(50)}`);
      const res = scheduler.schedule(req, eps, k);
      picks.push(res.target?.id ?? "-");
      scheduler.onPicked(req, res, k);
      if (rng.next() < 0.7 && res.target) scheduler.onResponseComplete(req, res.target.id, k);
    }
    return picks;
  };
  for (const name of ["default", "random", "least-request"]) {
    it(`${name}: the same seed gives the same picks`, async () => {
      const { readFileSync } = await import("node:fs");
      const cfg = readFileSync(`config/examples/${name}.yaml`, "utf8");
      assert.deepEqual(await run(42, cfg), await run(42, cfg));
    });
  }
  it("a different seed changes random picks", async () => {
    const cfg = "plugins:\n- type: random-picker\n";
    assert.notDeepEqual(await run(1, cfg), await run(2, cfg));
  });
});
