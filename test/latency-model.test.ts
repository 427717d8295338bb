/** The online latency model: RLS converges, the predictor learns a known relation, and it stays silent below minSamples. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import type { LatencyFeatures } from "../src/scheduler/latency/predictor.ts";
import { LatencyPredictor } from "../src/scheduler/latency/predictor.ts";
import { Rls } from "../src/scheduler/latency/rls.ts";
import { createRng } from "../src/scheduler/rng.ts";

function features(rng: { next(): number }, podType = ""): LatencyFeatures {
  return {
    kvCachePercentage: rng.next() * 0.9,
    inputTokenLength: Math.floor(50 + rng.next() * 8000),
    numRequestWaiting: rng.next() < 0.3 ? Math.floor(rng.next() * 6) : 0,
    numRequestRunning: Math.floor(rng.next() * 40),
    numTokensGenerated: 1,
    prefixCacheScore: rng.next() < 0.5 ? rng.next() : 0,
    prefillTokensInFlight: Math.floor(rng.next() * 30000),
    decodeTokensInFlight: Math.floor(rng.next() * 200000),
    podType,
  };
}

/** A known relation: TTFT = 15 ms + uncached prefill at 20k tok/s + queued tokens ahead at 20k tok/s. */
function trueTtft(f: LatencyFeatures): number {
  const uncached = (1 - f.prefixCacheScore) * f.inputTokenLength;
  return 15 + (uncached + f.prefillTokensInFlight) / 20;
}

/** TPOT = 6 ms + 0.1 ms per running sequence + 0.01 ms per 1k context tokens. */
function trueTpot(f: LatencyFeatures): number {
  return 6 + 0.1 * f.numRequestRunning + f.decodeTokensInFlight / 100_000;
}

describe("Rls", () => {
  it("converges to the weights of a noiseless linear relation", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: -5, max: 5, noNaN: true }), { minLength: 3, maxLength: 3 }),
        fc.integer({ min: 1, max: 1000 }),
        (w, seed) => {
          const rng = createRng(seed);
          const m = new Rls(3, 1, 1e-3);
          for (let i = 0; i < 200; i++) {
            const x = [1, rng.next() * 4 - 2, rng.next() * 10];
            m.update(x, w[0] * x[0] + w[1] * x[1] + w[2] * x[2]);
          }
          for (let k = 0; k < 3; k++)
            assert.ok(Math.abs(m.w[k] - w[k]) < 1e-3, `w${k}: ${m.w[k]} vs ${w[k]}`);
        },
      ),
      { numRuns: 50 },
    );
  });

  it("follows a relation that changes, with forgetting", () => {
    const m = new Rls(2, 0.99);
    const rng = createRng(3);
    for (let i = 0; i < 500; i++) {
      const x = [1, rng.next()];
      m.update(x, 10 + 5 * x[1]);
    }
    for (let i = 0; i < 500; i++) {
      const x = [1, rng.next()];
      m.update(x, 20 + 5 * x[1]);
    }
    assert.ok(Math.abs(m.w[0] - 20) < 0.1, `intercept ${m.w[0]} should have moved to 20`);
  });

  it("ignores non-finite observations", () => {
    const m = new Rls(2);
    m.update([1, Number.NaN], 3);
    m.update([1, 2], Number.POSITIVE_INFINITY);
    assert.equal(m.samples, 0);
    assert.deepEqual([...m.w], [0, 0]);
  });
});

describe("LatencyPredictor", () => {
  it("predicts nothing below minSamples, and predicts from the minSamples-th observation on", () => {
    const p = new LatencyPredictor({ minSamples: 100 });
    const rng = createRng(1);
    for (let i = 0; i < 99; i++) {
      const f = features(rng);
      p.observeTtft(f, trueTtft(f));
    }
    const probe = features(rng);
    assert.equal(p.predict(probe).ttftMs, undefined);
    assert.equal(p.samples("").ttft, 99);
    const f = features(rng);
    p.observeTtft(f, trueTtft(f));
    // trueTtft is linear in the TTFT basis (15 + 50·eff + 50·ahead, in thousands of tokens) and the
    // data noiseless, so 100 samples pin the 11 weights; only the weak ridge prior remains.
    const pred = p.predict(probe).ttftMs;
    assert.ok(
      pred !== undefined && Math.abs(pred - trueTtft(probe)) / trueTtft(probe) < 0.01,
      `predicted ${pred} ms, true ${trueTtft(probe)} ms`,
    );
    assert.equal(p.predict(probe).tpotMs, undefined, "TPOT has its own count");
  });

  it("keeps one model per pod role: a role with no samples predicts nothing", () => {
    const p = new LatencyPredictor({ minSamples: 10 });
    const rng = createRng(2);
    for (let i = 0; i < 50; i++) {
      const f = features(rng, "decode");
      p.observeTtft(f, trueTtft(f));
    }
    const probe = features(rng, "decode");
    const pred = p.predict(probe).ttftMs;
    // Noiseless and linear in the basis, as above: 50 samples fit the 11 weights.
    assert.ok(
      pred !== undefined && Math.abs(pred - trueTtft(probe)) / trueTtft(probe) < 0.01,
      `predicted ${pred} ms, true ${trueTtft(probe)} ms`,
    );
    assert.equal(p.predict(features(rng, "prefill")).ttftMs, undefined);
  });

  for (const mode of ["relative", "linear"] as const) {
    it(`learns a known TTFT and TPOT relation online (${mode}): held-out MAPE under 10% with 5% noise`, () => {
      const p = new LatencyPredictor({ minSamples: 100, mode, tpotMode: mode });
      const rng = createRng(42);
      const noise = () => 1 + (rng.next() - 0.5) * 0.1; // ±5%
      for (let i = 0; i < 3000; i++) {
        const f = features(rng);
        p.observeTtft(f, trueTtft(f) * noise());
        p.observeTpot(f, trueTpot(f) * noise());
      }
      let ttftErr = 0;
      let tpotErr = 0;
      const n = 500;
      for (let i = 0; i < n; i++) {
        const f = features(rng);
        const pr = p.predict(f);
        ttftErr += Math.abs((pr.ttftMs as number) - trueTtft(f)) / trueTtft(f);
        tpotErr += Math.abs((pr.tpotMs as number) - trueTpot(f)) / trueTpot(f);
      }
      assert.ok(ttftErr / n < 0.1, `TTFT MAPE ${((100 * ttftErr) / n).toFixed(1)}%`);
      assert.ok(tpotErr / n < 0.1, `TPOT MAPE ${((100 * tpotErr) / n).toFixed(1)}%`);
    });
  }

  it("orders endpoints as the relation does: more work ahead predicts a later first token", () => {
    const p = new LatencyPredictor({ minSamples: 100, mode: "linear" });
    const rng = createRng(5);
    for (let i = 0; i < 2000; i++) {
      const f = features(rng);
      p.observeTtft(f, trueTtft(f));
    }
    const base = features(rng);
    const idle = p.predict({ ...base, prefillTokensInFlight: 0 }).ttftMs as number;
    const busy = p.predict({ ...base, prefillTokensInFlight: 20000 }).ttftMs as number;
    assert.ok(
      busy - idle > 900 && busy - idle < 1100,
      `20k tokens ahead at 20k tok/s ≈ +1000 ms, got ${busy - idle}`,
    );
  });
});
