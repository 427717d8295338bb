// kvgate simulate's comparison sections: saturated stages as a share of the ceiling, and the one-line
// verdict per router (rank against the best on throughput and TTFT, and the fleet figures behind it).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { formatSaturatedStages, formatVerdicts, stageCeiling } from "../src/sim/fleet/format.ts";
import type { Limits, RegimeLimit } from "../src/sim/fleet/limits.ts";
import type { SimResults, SimRun } from "../src/sim/fleet/simulate.ts";

const regime = (out: number) => ({ output_tokens_per_s: out }) as RegimeLimit;
const limits = {
  output_tokens_mean: 100,
  regimes: { zero: regime(500), group: regime(1000), repeat: regime(800) },
} as Limits;

function run(router: string, o: Partial<Record<string, unknown>>, stages: [number, number, number][] = []) {
  return {
    router,
    output_tokens_per_s: 900,
    ttft_p90_s: 0.1,
    ttft_p99_s: 0.2,
    prefix_cache_hit_rate: 0.5,
    fleet: { preemptions: 0, kv_usage_min: 0.2, kv_usage_max: 0.3 },
    stages: stages.map(([index, rate, out]) => ({
      index,
      rate,
      output_tokens_per_s: out,
      warmup: index === 0,
    })),
    ...o,
  } as unknown as SimRun;
}

const results = (runs: SimRun[]) => ({ limits, runs }) as unknown as SimResults;

describe("simulate's comparison", () => {
  it("calls a stage saturated when its offered output reaches the fleet's ceiling", () => {
    // Ceiling = the best regime, 1,000 out tok/s; 100 output tokens per request.
    assert.deepEqual(stageCeiling(limits, 5), { ceiling: 500, saturated: false });
    assert.deepEqual(stageCeiling(limits, 10), { ceiling: 1000, saturated: true });
  });

  it("lists only saturated, non-warm-up stages, each router's share of the ceiling", () => {
    const stages: [number, number, number][] = [
      [0, 20, 950],
      [1, 5, 480],
      [2, 12, 900],
    ];
    const text = formatSaturatedStages(
      results([
        run("a", {}, stages),
        run(
          "b",
          {},
          stages.map(([i, r, o]) => [i, r, o / 2]),
        ),
      ]),
    );
    const rows = text.split("\n").filter((l) => /^\d/.test(l));
    assert.equal(rows.length, 1, text);
    assert.match(rows[0], /^2\s+12\s+90\.0%\s+45\.0%$/);
    assert.equal(formatSaturatedStages(results([run("a", {}, [[1, 5, 480]])])), "");
  });

  it("reads a barriered stage against its own bound when that is below the fleet's ceiling", () => {
    const staged = {
      ...limits,
      stages: [{ index: 2, output_tokens_per_s: 800 }],
    } as unknown as Limits;
    const text = formatSaturatedStages({
      limits: staged,
      runs: [run("a", {}, [[2, 12, 720]])],
    } as unknown as SimResults);
    const rows = text.split("\n").filter((l) => /^\d/.test(l));
    // 720 of the stage's 800 (not of the fleet's 1,000), with the bound in its own column.
    assert.match(rows[0], /^2\s+12\s+800\s+90\.0%$/);
  });

  it("puts each router's share of the stage's even share beside its share of the bound", () => {
    const staged = {
      ...limits,
      stages: [{ index: 2, output_tokens_per_s: 800, even_share_output_tokens_per_s: 750 }],
    } as unknown as Limits;
    const text = formatSaturatedStages({
      limits: staged,
      runs: [run("a", {}, [[2, 12, 720]]), run("b", {}, [[2, 12, 600]])],
    } as unknown as SimResults);
    const rows = text.split("\n").filter((l) => /^\d/.test(l));
    // 720 of the bound's 800 and of the engines' 750 with the stage dealt evenly; 600 of each.
    assert.match(rows[0], /^2\s+12\s+800\s+750\s+90\.0% · 96\.0%\s+75\.0% · 80\.0%$/);
    assert.match(text, /even share/);
  });

  it("ranks each router against the best one, and says what the fleet did", () => {
    const text = formatVerdicts(
      results([
        run("kvgate", {
          output_tokens_per_s: 1000,
          ttft_p90_s: 0.1,
          ttft_p99_s: 0.5,
          prefix_cache_hit_rate: 0.9,
        }),
        run("rr", {
          output_tokens_per_s: 800,
          ttft_p90_s: 0.3,
          ttft_p99_s: 0.25,
          prefix_cache_hit_rate: 0.2,
          fleet: { preemptions: 40, kv_usage_min: 0.1, kv_usage_max: 0.6 },
        }),
      ]),
    );
    const [head, kv, rr] = text.split("\n");
    assert.equal(head, "verdict:");
    assert.equal(
      kv,
      "kvgate: out tok/s 1,000 (best); TTFT p90 0.100 s (best); TTFT p99 0.500 s (#2, 2.0× vs rr) — hit rate 90.0%, 0 preemptions, KV spread 10.0 pts",
    );
    assert.equal(
      rr,
      "rr: out tok/s 800 (#2, -20.0% vs kvgate); TTFT p90 0.300 s (#2, 3.0× vs kvgate); TTFT p99 0.250 s (best) — hit rate 20.0% (best 90.0%), 40 preemptions (fewest 0), KV spread 50.0 pts",
    );
  });
});
