// `kvgate bench`'s exit codes and what its errors tell the user: setup problems exit 2 before a
// request is sent and name the fix; a run where more than --max-error-rate of requests failed
// exits 1 (its results still written); an --append that could not succeed is refused up front.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { parseResultsFile, resultsFile } from "../src/bench/results.ts";
import { runKvgate, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
const received = (r: TestReplica) => r.server.engine.stats().prefixCacheQueries + served(r);
const bench = (args: string[]) => runKvgate(["bench", "--quiet", ...args], { timeoutMs: 90_000 });

describe("bench errors and exit codes", () => {
  let replica: TestReplica;
  /** Every smoke prompt (~250 tokens) is longer than its 64-token context: each request gets 400. */
  let tiny: TestReplica;
  const dir = mkdtempSync(join(tmpdir(), "kvgate-bench-errors-"));

  before(async () => {
    [replica, tiny] = await Promise.all([
      startTestReplica({ servedModelName: "m" }),
      startTestReplica({ servedModelName: "m", maxModelLen: 64 }),
    ]);
  });
  after(async () => {
    await Promise.all([replica?.close(), tiny?.close()]);
    rmSync(dir, { recursive: true, force: true });
  });

  test("a mix without streams is told to give them in a workload file", async () => {
    const r = await bench(["--target", `http://127.0.0.1:${replica.port}`, "--workload", "mix"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(
      r.stderr,
      /mix options\.streams: a mix is a list of streams, which a workload file gives \(kvgate bench --workload-file/,
    );
  });

  test("a target without a scheme is told to add http://, not to pass a model name", async () => {
    const host = `localhost:${replica.port}`;
    const r = await bench(["--target", host, "--preset", "smoke"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`--target ${host} has no scheme: use http://${host}\\n`));
    assert.doesNotMatch(r.stderr, /model/);
  });

  test("an unreachable target, an unknown model and an unknown --set key exit 2 with the fix", async () => {
    const down = await bench(["--target", "http://127.0.0.1:1", "--preset", "smoke"]);
    assert.equal(down.code, 2, down.stderr);
    assert.match(
      down.stderr,
      /cannot reach http:\/\/127\.0\.0\.1:1 .*is the server running, and is the URL right\?/,
    );

    const before = received(replica);
    const model = await bench(["--target", replica.url, "--preset", "smoke", "--model", "nope"]);
    assert.equal(model.code, 2, model.stderr);
    assert.match(model.stderr, /--model nope: http:\/\/127\.0\.0\.1:\d+ serves m; pass one of those/);
    assert.equal(received(replica), before, "no request was sent");

    const set = await bench(["--target", replica.url, "--preset", "smoke", "--set", "foo=1"]);
    assert.equal(set.code, 2, set.stderr);
    assert.match(
      set.stderr,
      /unknown key "foo" \(valid: numGroups, promptsPerGroup, systemPromptLen, questionLen, outputLen, api, order\)/,
    );
  });

  test("workload files that are missing are named with the flag to fix", async () => {
    const noTrace = await bench(["--workload", "trace", "--dry-run"]);
    assert.equal(noTrace.code, 2);
    assert.match(noTrace.stderr, /the trace workload needs --trace FILE\.jsonl/);
    const missing = await bench(["--trace", join(dir, "absent.jsonl"), "--dry-run"]);
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /--trace .*absent\.jsonl: no such file; check the path/);
  });

  test("every request failing exits 1 naming the error and the fix; the results are still written", async () => {
    const out = join(dir, "failed.json");
    const args = ["--target", tiny.url, "--preset", "smoke", "--num-requests", "6", "--json", out];
    const r = await bench(args);
    assert.equal(r.code, 1, r.stderr);
    assert.match(
      r.stderr,
      /6 of 6 requests failed \(100%, above --max-error-rate 0\.05\):\n {2}http_400 × 6: .*context length/,
    );
    assert.match(r.stderr, /→ the target rejected the request/);
    const file = parseResultsFile(readFileSync(out, "utf8"));
    assert.equal(file.runs[0].errors, 6);
    assert.equal(served(tiny), 0);

    const tolerated = await bench([...args, "--max-error-rate", "1"]);
    assert.equal(tolerated.code, 0, tolerated.stderr);
  });

  test("--append to a wall-clock file from a simulated target is refused before any request", async () => {
    const out = join(dir, "wall.json");
    const text = `${JSON.stringify(resultsFile([], { kvgateVersion: "t", created: "2026-01-01", simulated: false }))}\n`;
    writeFileSync(out, text);
    const before = received(replica);
    const r = await bench(["--target", replica.url, "--preset", "smoke", "--json", out, "--append"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(
      r.stderr,
      /wall\.json holds wall-clock-seconds runs and this run's target is simulated.*another --json file/,
    );
    assert.equal(received(replica), before, "no request was sent");
    assert.equal(readFileSync(out, "utf8"), text);

    const noJson = await bench(["--target", replica.url, "--preset", "smoke", "--append"]);
    assert.equal(noJson.code, 2);
    assert.match(noJson.stderr, /--append needs --json FILE/);
  });
});
