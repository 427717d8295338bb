/** The demo summary's latency verdict names the direction: a slower kvgate reads "worse", never "0.53x better". */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { latencyVerdict } from "../src/bench/demo-format.ts";

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
