// End to end on loopback: the driver and `kvgate bench` against two simulated replicas with
// client-side round-robin, checking request counts, fleet figures and that the results JSON validates.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { runBench } from "../src/bench/driver.ts";
import { parseSlo } from "../src/bench/metrics.ts";
import { parseResultsFile, resultsFile } from "../src/bench/results.ts";
import { buildRun } from "../src/bench/run.ts";
import { generateWorkload, resolveWorkloadSpec } from "../src/bench/workloads/spec.ts";
import { runKvgate, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const SCALE = 100;

describe("bench against two simulated replicas", () => {
  let replicas: TestReplica[] = [];
  const dir = mkdtempSync(join(tmpdir(), "kvgate-bench-"));

  before(async () => {
    replicas = await Promise.all([
      startTestReplica({ timeScale: SCALE }),
      startTestReplica({ timeScale: SCALE }),
    ]);
  });
  after(async () => {
    await Promise.all(replicas.map((r) => r.close()));
    rmSync(dir, { recursive: true, force: true });
  });

  test("round-robin run: every request answered, fleet hit rate from /metrics, results validate", async () => {
    const spec = resolveWorkloadSpec({ preset: "smoke", numRequests: 24, seed: 3 });
    const workload = generateWorkload(spec);
    const urls = replicas.map((r) => r.url);
    const result = await runBench(workload, { targets: urls, timeScale: SCALE, metricsInterval: 0.02 });
    assert.equal(result.records.length, 24);
    assert.equal(result.notSent, 0);
    assert.deepEqual(
      result.records.filter((r) => r.error).map((r) => r.error),
      [],
    );
    for (const r of result.records) {
      assert.equal(r.completionTokens, 16, "ignore_eos: exactly max_tokens");
      assert.equal(
        Array.from(r.chunkTokens).reduce((a, k) => a + k, 0),
        16,
      );
    }
    const fleet = result.fleet!;
    assert.equal(fleet.endpoints.length, 2);
    assert.deepEqual(fleet.sim_time_scales, [SCALE]);
    assert.ok(
      fleet.prefix_cache_hit_rate !== null &&
        fleet.prefix_cache_hit_rate > 0 &&
        fleet.prefix_cache_hit_rate < 1,
    );
    assert.ok((fleet.prefix_cache_queries ?? 0) > 0);

    const run = buildRun(spec, workload, result, {
      router: "round-robin",
      target: { mode: "round-robin", urls },
      timeScale: SCALE,
      slo: parseSlo("ttft=5,tpot=1"),
    });
    assert.equal(run.requests, 24);
    assert.equal(run.completed, 24);
    assert.equal(run.output_tokens, 24 * 16);
    assert.equal(run.prefix_cache_hit_rate_source, "metrics");
    assert.ok(run.ttft_p50_s !== null && run.ttft_p50_s > 0);
    assert.ok((run.output_tokens_per_s ?? 0) > 0);
    const file = resultsFile([run], {
      kvgateVersion: "test",
      created: new Date(0).toISOString(),
      simulated: true,
    });
    const back = parseResultsFile(JSON.stringify(file));
    assert.equal(back.runs[0].requests, 24);
    assert.equal(back.time_unit, "simulated_seconds");
  });

  test("`kvgate bench` CLI: stages, summary on stdout, JSON appended run by run", async () => {
    const out = join(dir, "results.json");
    const urls = replicas.map((r) => r.url).join(",");
    const args = [
      "bench",
      "--round-robin",
      urls,
      "--preset",
      "smoke",
      "--stages",
      "2:5w,4:5",
      "--time-scale",
      String(SCALE),
      "--slo",
      "ttft=5",
      "--json",
      out,
      "--quiet",
    ];
    const first = await runKvgate(args, { timeoutMs: 60_000 });
    assert.equal(first.code, 0, first.stderr);
    assert.match(first.stdout, /router round-robin \| workload shared-prefix \(smoke\)/);
    assert.match(first.stdout, /stage/);
    const second = await runKvgate([...args, "--append", "--router", "rr-again"], { timeoutMs: 60_000 });
    assert.equal(second.code, 0, second.stderr);
    const file = parseResultsFile(readFileSync(out, "utf8"));
    assert.equal(file.simulated, true);
    assert.deepEqual(
      file.runs.map((r) => r.router),
      ["round-robin", "rr-again"],
    );
    for (const run of file.runs) {
      assert.equal(run.stages.length, 2);
      assert.equal(run.stages[0].warmup, true);
      assert.equal(run.stages[0].requests, 10);
      assert.equal(run.stages[1].requests, 20);
      assert.equal(run.requests, 20, "the warm-up stage is left out of the run figures");
      assert.equal(run.errors, 0);
      assert.equal(run.workload.seed, 42);
    }
  });

  test("`kvgate bench` rejects a missing target and unknown workload options with exit code 2", async () => {
    const noTarget = await runKvgate(["bench", "--preset", "smoke"]);
    assert.equal(noTarget.code, 2);
    assert.match(noTarget.stderr, /--target/);
    const badOpt = await runKvgate([
      "bench",
      "--preset",
      "smoke",
      "--target",
      "http://127.0.0.1:1",
      "--set",
      "nope=1",
    ]);
    assert.equal(badOpt.code, 2);
    assert.match(badOpt.stderr, /nope/);
  });
});
