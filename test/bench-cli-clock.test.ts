// `kvgate bench` reads the fleet's clock itself: against simulated replicas it reports simulated
// seconds at their kvgate:sim_time_scale without --time-scale, an explicit --time-scale wins with
// a warning, replicas on different clocks are refused before a request is sent, and through a
// gateway the clock comes from the replicas its admin API lists (--gateway-admin).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { parseResultsFile } from "../src/bench/results.ts";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { waitFor } from "./helpers/gateway-fakes.ts";
import { runKvgate, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
const bench = (args: string[]) => runKvgate(["bench", "--quiet", ...args], { timeoutMs: 90_000 });

describe("bench detects the simulated clock", () => {
  let fast: TestReplica;
  let slow: TestReplica;
  let gw: GatewayHandle;
  const dir = mkdtempSync(join(tmpdir(), "kvgate-bench-clock-"));
  const results = (name: string) => parseResultsFile(readFileSync(join(dir, name), "utf8"));

  before(async () => {
    [fast, slow] = await Promise.all([
      startTestReplica({ timeScale: 40, servedModelName: "m" }),
      startTestReplica({ timeScale: 20, servedModelName: "m" }),
    ]);
    gw = await startGateway({ endpoints: `127.0.0.1:${slow.port}`, scrapeIntervalMs: 25, log: () => {} });
    await waitFor(
      () => gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
      "the gateway scraped its replica",
    );
  });
  after(async () => {
    await gw?.close();
    await Promise.all([fast?.close(), slow?.close()]);
    rmSync(dir, { recursive: true, force: true });
  });

  test("replica at 40×, no --time-scale: simulated seconds at 40×, KV usage sampled", async () => {
    const r = await bench(["--target", fast.url, "--preset", "smoke", "--json", join(dir, "fast.json")]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /\| time scale 40\n/);
    assert.match(r.stdout, / s\(sim\)\n/);
    const file = results("fast.json");
    assert.equal(file.simulated, true);
    assert.equal(file.time_unit, "simulated_seconds");
    const run = file.runs[0];
    assert.equal(run.time_scale, 40);
    assert.deepEqual(run.fleet?.sim_time_scales, [40]);
    // 40 requests at 5/s is 8 simulated s, 0.2 wall s at 40×: a 1-wall-second sampler took none.
    assert.ok((run.fleet?.samples ?? 0) >= 1, JSON.stringify(run.fleet));
    assert.equal(run.fleet?.kv_usage_note, undefined);
  });

  test("an explicit --time-scale wins, with a warning naming both scales", async () => {
    const r = await bench([
      ...["--target", fast.url, "--preset", "smoke", "--num-requests", "4", "--time-scale", "20"],
      ...["--json", join(dir, "explicit.json")],
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /warning: --time-scale 20 given, but the replicas run at 40×.*drop --time-scale/);
    assert.equal(results("explicit.json").runs[0].time_scale, 20);
  });

  test("round-robin over replicas at 40× and 20× is refused before any request", async () => {
    const before = [served(fast), served(slow)];
    const r = await bench(["--round-robin", `${fast.url},${slow.url}`, "--preset", "smoke"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /different time scales \(.*:\d+ 40×, .*:\d+ 20×\).*--time-scale N/);
    assert.deepEqual([served(fast), served(slow)], before);
  });

  test("through a gateway: --gateway-admin and --metrics-endpoints find the replicas' clock", async () => {
    const common = ["--target", gw.url, "--preset", "smoke", "--num-requests", "6"];
    const viaAdmin = await bench([...common, "--gateway-admin", gw.adminUrl, "--json", join(dir, "gw.json")]);
    assert.equal(viaAdmin.code, 0, viaAdmin.stderr);
    const run = results("gw.json").runs[0];
    assert.equal(run.time_scale, 20);
    assert.deepEqual(
      run.fleet?.endpoints.map((e) => e.url),
      [`http://127.0.0.1:${slow.port}/metrics`],
    );
    assert.equal(run.prefix_cache_hit_rate_source, "metrics");

    const viaMetrics = await bench([
      ...common,
      "--metrics-endpoints",
      slow.url,
      "--json",
      join(dir, "me.json"),
    ]);
    assert.equal(viaMetrics.code, 0, viaMetrics.stderr);
    assert.equal(results("me.json").runs[0].time_scale, 20);
  });

  test("through a gateway with neither flag: wall seconds, and a note that says what to pass", async () => {
    const r = await bench([
      "--target",
      gw.url,
      "--preset",
      "smoke",
      "--num-requests",
      "2",
      "--json",
      join(dir, "plain.json"),
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /note: no vLLM \/metrics answered \(.*\/metrics \(HTTP 404\)\).*--gateway-admin/);
    assert.equal(results("plain.json").time_unit, "seconds");
  });

  test("--gateway-admin pointed at the public port says which port it wants", async () => {
    const r = await bench(["--target", gw.url, "--gateway-admin", gw.url, "--preset", "smoke"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /answered HTTP 404 without an endpoint list: --gateway-admin takes the admin API/);
  });
});
