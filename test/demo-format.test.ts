/**
 * The demo summary's latency verdict names the direction: a slower kvgate reads "worse", never "0.53x
 * better"; its CPU lines give each part's average busy cores and the phase's total against the machine.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { cpuLines, type DemoPhase, latencyVerdict } from "../src/bench/demo-format.ts";

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
