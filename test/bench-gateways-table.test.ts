/** bench:gateways' Markdown table: one row per run, the single gateway unlabelled, missing figures as "-". */
import assert from "node:assert/strict";
import { test } from "node:test";
import { formatTable, type GatewayRun } from "../src/bench/gateways/table.ts";

const run = (gateways: number, synced: boolean, hit: number | null): GatewayRun => ({
  gateways,
  synced,
  requests: 480,
  errors: 0,
  hit_rate: hit,
  hit_rate_source: hit === null ? null : "metrics",
  output_tokens_per_s: hit === null ? null : 1919.4,
  ttft_p90_s: 0.0244,
  replica_lag_max_s: 0.02,
  gateway_cpu_s: 3.14,
  bench_wall_s: 31.6,
  run_wall_s: 40,
  load_avg_1m: 2,
});

test("formatTable: a row per run with its sync mode, hit rate and throughput", () => {
  const rows = formatTable([run(1, false, 0.888), run(8, false, null), run(8, true, 0.5)]).split("\n");
  assert.equal(rows.length, 5);
  assert.equal(rows[2], "| 1 | - | 88.8% | 1919 | 0.024 | 0 | 0.02 | 3.1 / 32 |");
  assert.match(rows[3], /^\| 8 \| unsynced \| - \| - \|/);
  assert.match(rows[4], /^\| 8 \| synced \| 50\.0% \| 1919 \|/);
});
