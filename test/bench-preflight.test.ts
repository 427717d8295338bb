// The pure decisions behind `kvgate bench`'s setup and exit code: URL checks, the fleet's clock
// from kvgate:sim_time_scale, the error-share verdict, why a run has no KV-usage sample, and
// where a run goes when its results file cannot take it.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { fleetStats, type ReplicaSnapshot } from "../src/bench/fleet-metrics.ts";
import type { RequestRecord } from "../src/bench/metrics.ts";
import { pickModel } from "../src/bench/model-list.ts";
import { judgeRun } from "../src/bench/outcome.ts";
import { BenchSetupError, checkBaseUrl, decideClock } from "../src/bench/preflight.ts";
import { type RunResult, resultsFile } from "../src/bench/results.ts";
import { besidePath, checkResultsTarget, saveRun } from "../src/bench/results-io.ts";

const snap = (url: string, over: Partial<ReplicaSnapshot> = {}): ReplicaSnapshot => ({
  url: `${url}/metrics`,
  ok: true,
  queries: 10,
  hits: 5,
  kvUsage: 0.25,
  ...over,
});

describe("checkBaseUrl", () => {
  test("a URL without a scheme is refused with the URL to use instead", () => {
    assert.throws(
      () => checkBaseUrl("--target", "localhost:8080"),
      (e: Error) =>
        e instanceof BenchSetupError &&
        e.message === "--target localhost:8080 has no scheme: use http://localhost:8080",
    );
    assert.throws(() => checkBaseUrl("--target", "10.0.0.5:8000/v1"), /use http:\/\/10\.0\.0\.5:8000\/v1$/);
    assert.throws(() => checkBaseUrl("--metrics-endpoints", "ftp://h:1"), /only http:\/\/ and https:\/\//);
    assert.equal(checkBaseUrl("--target", "http://localhost:8080/"), "http://localhost:8080");
  });
});

describe("pickModel", () => {
  test("the first listed model; otherwise what to pass", () => {
    assert.equal(pickModel("http://t", { ids: ["a", "b"] }), "a");
    assert.throws(
      () => pickModel("http://t", { ids: [] }),
      /^Error: http:\/\/t\/v1\/models lists no model: pass --model NAME$/,
    );
    assert.throws(
      () => pickModel("http://t", { status: 404 }),
      /answered HTTP 404 without a model list: is http:\/\/t an OpenAI-compatible server.*pass --model NAME/,
    );
  });
});

describe("decideClock", () => {
  test("simulated replicas set the clock without --time-scale", () => {
    const c = decideClock(undefined, [
      snap("http://a", { simTimeScale: 50 }),
      snap("http://b", { simTimeScale: 50 }),
    ]);
    assert.deepEqual([c.timeScale, c.simulated, c.source, c.warnings], [50, true, "replicas", []]);
  });

  test("real vLLM (no kvgate:sim_time_scale) is real time", () => {
    const c = decideClock(undefined, [snap("http://a")]);
    assert.deepEqual([c.timeScale, c.simulated, c.source], [1, false, "replicas"]);
  });

  test("an explicit --time-scale wins, and a disagreement is a warning that says what to do", () => {
    const c = decideClock(10, [snap("http://a", { simTimeScale: 50 })]);
    assert.equal(c.timeScale, 10);
    assert.equal(c.detected, 50);
    assert.equal(c.warnings.length, 1);
    assert.match(c.warnings[0], /--time-scale 10 given, but the replicas run at 50×.*drop --time-scale/);
    assert.deepEqual(decideClock(50, [snap("http://a", { simTimeScale: 50 })]).warnings, []);
  });

  test("different scales, or simulated mixed with real, are refused naming each replica", () => {
    assert.throws(
      () =>
        decideClock(undefined, [
          snap("http://a", { simTimeScale: 10 }),
          snap("http://b", { simTimeScale: 100 }),
        ]),
      /different time scales \(http:\/\/a 10×, http:\/\/b 100×\).*--time-scale N/,
    );
    assert.throws(
      () => decideClock(20, [snap("http://a", { simTimeScale: 20 }), snap("http://b")]),
      /mixes clocks: http:\/\/a is simulated at 20×, but http:\/\/b publishes no kvgate:sim_time_scale/,
    );
  });

  test("no answer: wall seconds, and a note naming --gateway-admin and --metrics-endpoints", () => {
    const c = decideClock(undefined, [{ url: "http://gw/metrics", ok: false, error: "HTTP 404" }]);
    assert.deepEqual([c.timeScale, c.simulated, c.source], [1, false, "default"]);
    assert.match(c.notes[0], /http:\/\/gw\/metrics \(HTTP 404\)/);
    assert.match(c.notes[0], /--gateway-admin/);
    assert.match(c.notes[0], /--metrics-endpoints/);
    // A 200 page without any vllm:* family is no answer either.
    const page = decideClock(undefined, [{ url: "http://x/metrics", ok: true }]);
    assert.equal(page.source, "default");
  });
});

const rec = (id: number, kind?: string): RequestRecord => ({
  id: `r${id}`,
  start: id,
  end: id + 1,
  chunkTimes: kind ? [] : [id + 0.5],
  chunkTokens: kind ? [] : [4],
  promptTokens: 10,
  completionTokens: kind ? 0 : 4,
  ...(kind ? { error: { kind, message: `boom ${kind}` } } : {}),
});

describe("judgeRun", () => {
  test("fails above the threshold, naming kinds, a sample message and the fix", () => {
    const records = [
      ...Array.from({ length: 18 }, (_, i) => rec(i)),
      rec(18, "http_429"),
      rec(19, "connect"),
    ];
    assert.equal(judgeRun(records, 0.1, ["http://t"]).failed, false, "2 of 20 is 10%, not above 0.1");
    const v = judgeRun(records, 0.05, ["http://t"]);
    assert.equal(v.failed, true);
    assert.equal(v.errors, 2);
    assert.match(v.message!, /^2 of 20 requests failed \(10%, above --max-error-rate 0\.05\)/);
    assert.match(v.message!, /http_429 × 1: boom http_429\n {4}→ .*lower --rate/);
    assert.match(
      v.message!,
      /connect × 1: boom connect\n {4}→ nothing accepted the connection at http:\/\/t/,
    );
  });

  test("requests the bench cut off itself do not count; nothing sent is a failure", () => {
    const cut = [rec(0), rec(1), rec(2, "cutoff"), rec(3, "cutoff")];
    assert.deepEqual(judgeRun(cut, 0, ["http://t"]), { failed: false, counted: 2, errors: 0 });
    assert.match(judgeRun([rec(0, "cutoff")], 0.05, []).message!, /cut off.*raise --max-duration/);
    assert.match(judgeRun([], 0.05, []).message!, /no request was sent/);
  });
});

describe("fleetStats KV-usage note", () => {
  const b = [snap("http://a")];
  test("a run shorter than the sampling interval says so and what to do", () => {
    const f = fleetStats(b, b, [], { wallSeconds: 0.04, intervalSeconds: 0.1 });
    assert.equal(f.samples, 0);
    assert.match(f.kv_usage_note!, /lasted 0\.04 wall s, less than the sampling interval \(0\.1 s\)/);
  });
  test("failed scrapes and a /metrics without the KV family are told apart", () => {
    const failed = fleetStats(b, b, [[{ url: "http://a/metrics", ok: false, error: "HTTP 404" }]]);
    assert.match(failed.kv_usage_note!, /every scrape during the run failed \(HTTP 404\)/);
    const noKv = fleetStats(b, b, [[snap("http://a", { kvUsage: undefined })]]);
    assert.match(noKv.kv_usage_note!, /no vllm:kv_cache_usage_perc/);
    const ok = fleetStats(b, b, [[snap("http://a")]]);
    assert.equal(ok.samples, 1);
    assert.equal(ok.kv_usage_note, undefined);
  });
});

describe("results files", () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-results-io-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const meta = { kvgateVersion: "t", created: "2026-01-01T00:00:00.000Z" };
  const run = { router: "x" } as unknown as RunResult;

  test("the pre-check refuses a file on the other clock, a non-results file and a directory", () => {
    const wall = join(dir, "wall.json");
    writeFileSync(wall, JSON.stringify(resultsFile([], { ...meta, simulated: false })));
    assert.throws(
      () => checkResultsTarget(wall, true, true),
      /wall\.json holds wall-clock-seconds runs and this run's target is simulated.*another --json file/,
    );
    checkResultsTarget(wall, true, false);
    checkResultsTarget(wall, false, true); // overwriting is allowed
    const junk = join(dir, "junk.json");
    writeFileSync(junk, "{}");
    assert.throws(() => checkResultsTarget(junk, true, true), /not a kvgate results file.*drop --append/);
    assert.throws(() => checkResultsTarget(dir, false, true), /is a directory; name a file/);
    assert.throws(
      () => checkResultsTarget(join(dir, "no", "r.json"), false, true),
      /does not exist; create it/,
    );
  });

  test("a write that fails after the run puts the run beside the file and says where", () => {
    const target = join(dir, "taken");
    mkdirSync(target);
    const now = new Date("2026-12-01T20:15:00.123Z");
    const saved = saveRun(run, target, { append: false, simulated: true, kvgateVersion: "t", now });
    assert.equal(saved.path, besidePath(target, now));
    assert.equal(saved.path, join(dir, "taken.2026-12-01T20-15-00-123Z.json"));
    assert.match(
      saved.problem!,
      /could not write .*taken .*the run was written to .*taken\.2026-12-01T20-15-00-123Z\.json/,
    );
    assert.equal(JSON.parse(readFileSync(saved.path, "utf8")).runs[0].router, "x");
  });

  test("appending to a file that changed clock during the run goes beside it, leaving it intact", () => {
    const path = join(dir, "changed.json");
    const text = JSON.stringify(resultsFile([], { ...meta, simulated: false }));
    writeFileSync(path, text);
    const saved = saveRun(run, path, { append: true, simulated: true, kvgateVersion: "t" });
    assert.notEqual(saved.path, path);
    assert.match(saved.problem!, /holds wall-clock-seconds runs, this one is simulated-seconds/);
    assert.equal(readFileSync(path, "utf8"), text);
    const beside = JSON.parse(readFileSync(saved.path, "utf8"));
    assert.deepEqual(
      [beside.simulated, beside.time_unit, beside.runs[0].router],
      [true, "simulated_seconds", "x"],
    );
  });
});
