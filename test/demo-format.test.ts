/**
 * The demo summary's latency verdict names the direction: a slower kvgate reads "worse", never "0.53x
 * better"; its CPU lines give each part's average busy cores and the phase's total against the machine;
 * a live figure is checked against the range of the prediction's draws of the send order.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import {
  cpuLines,
  type DemoPhase,
  demoSummary,
  latencyVerdict,
  offRange,
  relDiff,
} from "../src/bench/demo-format.ts";
import type { RunResult } from "../src/bench/results.ts";

test("latencyVerdict: lower kvgate latency is 'better' by rr/kv, higher is 'worse' by kv/rr", () => {
  assert.equal(latencyVerdict(1.0, 0.5), "2.00x better");
  assert.equal(latencyVerdict(0.6, 1.126), "1.88x worse");
  assert.equal(latencyVerdict(0.4, 0.4), "1.00x better");
  assert.equal(latencyVerdict(null, 0.4), "-");
  assert.equal(latencyVerdict(0.4, 0), "-");
});

test("latencyVerdict never reports a factor below 1", () => {
  fc.assert(
    fc.property(
      fc.double({ min: 1e-3, max: 1e3, noNaN: true }),
      fc.double({ min: 1e-3, max: 1e3, noNaN: true }),
      (rr, kv) => {
        const m = /^(\d+\.\d\d)x (better|worse)$/.exec(latencyVerdict(rr, kv));
        assert.ok(m, "a factor and a direction");
        assert.ok(Number(m[1]) >= 1 - 1e-9);
        assert.equal(m[2], rr >= kv ? "better" : "worse");
      },
    ),
    { seed: 9 },
  );
});

test("cpuLines: cores per part over the run's wall time; the round-robin phase has no gateway", () => {
  const phase = (router: DemoPhase["router"], cpu: DemoPhase["cpu"]) =>
    ({ router, run: {}, records: [], replicaLagMaxS: [], wallSeconds: 1, cpu }) as unknown as DemoPhase;
  const lines = cpuLines(
    [
      phase("round-robin", { wallS: 40, replicasS: 30, gatewayS: null, clientS: 10 }),
      phase("kvgate", { wallS: 50, replicasS: 40, gatewayS: 25, clientS: 20 }),
      phase("kvgate", undefined),
    ],
    2,
  );
  assert.equal(lines.length, 2, "a phase without a reading gets no line");
  assert.match(
    lines[0],
    /round-robin .*40\.0 wall s.*replicas 0\.75, no gateway, client 0\.25; 1\.00 of 2 cores/,
  );
  assert.match(lines[1], /kvgate .*replicas 0\.80, gateway 0\.50, client 0\.40; 1\.70 of 2 cores/);
});

test("cpuLines: side by side, each phase's own parts, then the load generator that drove both", () => {
  const phase = (router: DemoPhase["router"], cpu: DemoPhase["cpu"]) =>
    ({ router, run: {}, records: [], replicaLagMaxS: [], wallSeconds: 1, cpu }) as unknown as DemoPhase;
  const lines = cpuLines(
    [
      phase("round-robin", { wallS: 40, replicasS: 30, gatewayS: null, clientS: null }),
      phase("kvgate", { wallS: 50, replicasS: 40, gatewayS: 25, clientS: null }),
    ],
    2,
    { wallS: 50, cpuS: 5 },
  );
  assert.equal(lines.length, 3);
  assert.match(lines[0], /round-robin .*replicas 0\.75, no gateway; 0\.75 of 2 cores$/);
  assert.match(lines[1], /kvgate .*replicas 0\.80, gateway 0\.50; 1\.30 of 2 cores$/);
  // 30 + 40 + 25 + 5 CPU seconds over the 50 s both ran.
  assert.match(
    lines[2],
    /drove both phases at once: client 0\.10 over 50\.0 wall s; everything together 2\.00 of 2 cores/,
  );
});

test("offRange: 0 inside the draws' range, else the distance from its nearer end relative to that end", () => {
  assert.equal(offRange(0.2, [0.174, 0.227, 0.2]), 0);
  assert.equal(offRange(0.174, [0.174, 0.227]), 0, "the ends are inside");
  assert.ok(Math.abs(offRange(0.15, [0.2, 0.174, null])! - (0.15 - 0.174) / 0.174) < 1e-12);
  assert.ok(Math.abs(offRange(0.25, [0.2, 0.174])! - (0.25 - 0.2) / 0.2) < 1e-12);
  assert.equal(offRange(null, [0.2]), null);
  assert.equal(offRange(0.2, [null]), null);
  fc.assert(
    fc.property(
      fc.double({ min: 0.01, max: 100, noNaN: true }),
      fc.array(fc.double({ min: 0.01, max: 100, noNaN: true }), { minLength: 1, maxLength: 8 }),
      (live, sims) => {
        const d = offRange(live, sims)!;
        const lo = Math.min(...sims);
        const hi = Math.max(...sims);
        assert.equal(d === 0, live >= lo && live <= hi);
        assert.equal(d > 0, live > hi);
        // Never farther than from any one draw: a range is at least as close as its nearest member.
        for (const x of sims) assert.ok(Math.abs(d) <= Math.abs(relDiff(live, x)!) + 1e-12);
        if (sims.length === 1) assert.equal(d, relDiff(live, sims[0]));
      },
    ),
    { seed: 11 },
  );
});

test("demoSummary: a live figure inside the simulated draws' range agrees; outside it by more than 10% warns", () => {
  const run = (out: number, p90: number, hit: number) =>
    ({
      completed: 600,
      errors: 0,
      output_tokens_per_s: out,
      requests_per_s: 5,
      ttft_p50_s: p90 * 0.9,
      ttft_p90_s: p90,
      ttft_p99_s: p90 * 1.1,
      tpot_p50_s: 0.02,
      e2e_p50_s: 20,
      prefix_cache_hit_rate: hit,
      input_tokens: 1e6,
      window_s: 90,
    }) as unknown as RunResult;
  const phase = (router: DemoPhase["router"], r: RunResult): DemoPhase => ({
    router,
    run: r,
    records: [],
    replicaLagMaxS: [0.01],
    wallSeconds: 150,
  });
  const live = [phase("round-robin", run(5300, 0.4, 0.174)), phase("kvgate", run(6300, 0.103, 0.686))];
  const rrDraws = [run(5297, 0.396, 0.183), run(5340, 0.396, 0.202), run(5392, 0.395, 0.227)];
  const kvDraws = [run(6303, 0.097, 0.686), run(6310, 0.097, 0.686), run(6319, 0.098, 0.686)];
  const ranged = demoSummary(
    live,
    [
      { run: rrDraws[1], records: [], draws: rrDraws },
      { run: kvDraws[1], records: [], draws: kvDraws },
    ],
    { timeScale: 1 },
  );
  // Round-robin's 17.4% is 13.9% under the median draw's 20.2%, 4.9% under the lowest draw.
  assert.match(ranged, /simulated over 3 draws .*prefix-cache hit rate \(all\) 18\.3%–22\.7% \/ 68\.6%/);
  assert.match(
    ranged,
    /live vs simulated \(round-robin \/ kvgate\), how far outside the 3 draws' range: .*prefix-cache hit rate \(all\) -4\.9% \/ in range \(all within 10%\)/,
  );
  const single = demoSummary(
    live,
    [
      { run: rrDraws[1], records: [] },
      { run: kvDraws[1], records: [] },
    ],
    { timeScale: 1 },
  );
  assert.doesNotMatch(single, /draws/);
  assert.match(
    single,
    /live vs simulated \(round-robin \/ kvgate\): .*prefix-cache hit rate \(all\) -13\.9% \/ \+0\.0% \(WARNING: up to 14% apart\)/,
  );
  const far = demoSummary(
    [phase("round-robin", run(5300, 0.4, 0.15)), live[1]],
    [
      { run: rrDraws[1], records: [], draws: rrDraws },
      { run: kvDraws[1], records: [], draws: kvDraws },
    ],
    { timeScale: 1 },
  );
  assert.match(far, /prefix-cache hit rate \(all\) -18\.0% \/ in range \(WARNING: up to 18% apart\)/);
});
