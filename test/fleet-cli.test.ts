/** `kvgate simulate`: a small scenario end to end through the CLI, and a usage error's exit code. */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, describe, it } from "node:test";
import { promisify } from "node:util";
import { percentile } from "../src/bench/latency-summary.ts";
import { parseRowsJsonl } from "../src/bench/request-rows.ts";
import { parseResultsFile } from "../src/bench/results.ts";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "kvgate-simulate-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const CLI = [resolve("bin/kvgate")];
const EXAMPLES = resolve("config/examples");

async function kvgate(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [...CLI, ...args], { timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return { code: err.code ?? -1, stdout: err.stdout ?? "", stderr: err.stderr ?? "" };
  }
}

/** A scenario file of four small replicas, one router (an example config) and a shared-prefix workload. */
function fourReplicas(name: string, router: { name: string; config: string }, workload: string): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    `name: ${name}
seed: 5
fleet: { replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 40000, maxModelLen: 8192 }
routers:
  - { name: ${router.name}, config: ${join(EXAMPLES, router.config)} }
workload:
  workload: shared-prefix
${workload}
`,
  );
  return file;
}

describe("kvgate simulate", () => {
  it("prints a section per router, the comparison and the limits, and writes the results JSON", async () => {
    const file = join(dir, "small.yaml");
    writeFileSync(
      file,
      `name: small
seed: 5
fleet: { replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 40000, maxModelLen: 8192 }
routers:
  - { name: rr, config: ${join(EXAMPLES, "round-robin.yaml")} }
  - { name: aware, config: ${join(EXAMPLES, "estimated.yaml")} }
  - { name: unused, config: ${join(EXAMPLES, "random.yaml")} }
workload:
  workload: shared-prefix
  numRequests: 200
  arrival: { type: stages, stages: [{ rate: 10, duration: 3, warmup: true }, { rate: 20, duration: 4 }], barrier: true, interval: 1 }
  options: { numGroups: 4, promptsPerGroup: 2, systemPromptLen: 300, questionLen: 30, outputLen: 20 }
`,
    );
    const out = join(dir, "small.json");
    const rowsFile = join(dir, "small.jsonl");
    const r = await kvgate([
      "simulate",
      file,
      "--routers",
      "rr,aware",
      "--quick",
      "--json",
      out,
      "--records",
      rowsFile,
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /== router rr/);
    assert.match(r.stdout, /== router aware/);
    assert.doesNotMatch(r.stdout, /== router unused/);
    assert.match(r.stdout, /1 \(warm-up\)|0 \(warm-up\)/);
    assert.match(r.stdout, /== comparison/);
    assert.match(r.stdout, /group prefix/);
    const res = parseResultsFile(readFileSync(out, "utf8"));
    assert.equal(res.simulated, true);
    assert.equal(res.time_unit, "simulated_seconds");
    assert.deepEqual(
      res.runs.map((x) => x.router),
      ["rr", "aware"],
    );
    assert.equal((res.scenario as { quick: boolean }).quick, true);
    for (const x of res.runs) assert.equal(x.stages.length, 2);
    // --records: a row per request of each router, whose TTFTs give the results' percentiles.
    const rows = parseRowsJsonl(readFileSync(rowsFile, "utf8"), rowsFile);
    for (const x of res.runs) {
      const mine = rows.filter((w) => w.router === x.router);
      assert.equal(mine.length, x.requests + (x.stages[0].requests ?? 0), `${x.router}: warm-up rows too`);
      assert.ok(mine.every((w) => w.endpoint !== undefined && w.stage !== undefined));
      const warm = mine.filter((w) => w.warmup === true).map((w) => w.ttft_s as number);
      assert.equal(warm.length, x.stages[0].requests);
      assert.equal(percentile(Float64Array.from(warm).sort(), 90), x.stages[0].ttft_p90_s);
    }
  });

  it("--router-seed redraws the routers' random choices over the same traffic", async () => {
    const file = fourReplicas(
      "draws",
      { name: "random", config: "random.yaml" },
      `  numRequests: 120
  arrival: { type: stages, stages: [{ rate: 10, duration: 2, warmup: true }, { rate: 30, duration: 3 }], barrier: true, interval: 1 }
  options: { numGroups: 6, promptsPerGroup: 2, systemPromptLen: 600, questionLen: 30, outputLen: 40 }`,
    );
    let runs = 0;
    const sim = async (extra: string[]) => {
      const out = join(dir, `draws-${++runs}.json`);
      const r = await kvgate(["simulate", file, "--jobs", "1", "--json", out, ...extra]);
      assert.equal(r.code, 0, r.stderr);
      return { res: parseResultsFile(readFileSync(out, "utf8")), stderr: r.stderr };
    };
    const rowsFile = join(dir, "draws.jsonl");
    const own = await sim(["--records", rowsFile]);
    // The rows of a run in this thread (--jobs 1) give its TTFT percentiles, the run's and a stage's.
    const rows = parseRowsJsonl(readFileSync(rowsFile, "utf8"), rowsFile);
    const measured = rows.filter((w) => !w.warmup).map((w) => w.ttft_s as number);
    assert.equal(measured.length, own.res.runs[0].requests);
    assert.equal(percentile(Float64Array.from(measured).sort(), 99), own.res.runs[0].ttft_p99_s);
    const stage1 = rows.filter((w) => w.stage === 1).map((w) => w.ttft_s as number);
    assert.equal(percentile(Float64Array.from(stage1).sort(), 90), own.res.runs[0].stages[1].ttft_p90_s);
    const same = await sim(["--router-seed", "5"]);
    const other = await sim(["--router-seed", "6"]);
    const figures = (x: typeof own) => x.res.runs[0].stages;
    const limits = (x: typeof own) => (x.res as unknown as { limits: unknown }).limits;
    assert.deepEqual(figures(same), figures(own), "the scenario's own seed as router seed changes nothing");
    assert.deepEqual(limits(other), limits(own), "the workload is the same");
    assert.notDeepEqual(figures(other), figures(own), "another router seed places the requests otherwise");
    assert.match(other.stderr, /seed 5, router seed 6/);
    assert.equal((other.res.scenario as { router_seed?: number }).router_seed, 6);
    assert.equal((own.res.scenario as { router_seed?: number }).router_seed, undefined);
  });

  it("--scale runs the shape on a fleet f times the size, and refuses a factor that splits a replica", async () => {
    const file = fourReplicas(
      "scaled",
      { name: "rr", config: "round-robin.yaml" },
      `  arrival: { type: stages, stages: [{ rate: 8, duration: 2, warmup: true }, { rate: 20, duration: 3 }] }
  options: { numGroups: 6, promptsPerGroup: 2, systemPromptLen: 300, questionLen: 30, outputLen: 20 }`,
    );
    const out = join(dir, "scaled.json");
    const r = await kvgate(["simulate", file, "--scale", "0.5", "--jobs", "2", "--json", out]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /scenario scaled: 2 × llama-3\.1-8b-h100.*\(scale ×0\.5\)/);
    const res = parseResultsFile(readFileSync(out, "utf8"));
    const sc = res.scenario as { scale?: number; fleet: { replicas: number } };
    assert.deepEqual([sc.scale, sc.fleet.replicas], [0.5, 2]);
    assert.equal(res.runs[0].requests, 30, "half of the 60 requests of the 20 QPS stage");
    const bad = await kvgate(["simulate", file, "--scale", "0.3"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--scale 0\.3 gives 1\.2 replicas in pool 1 \(4\); pick a factor/);
  });

  it("exits 2 with a message naming the field for a bad scenario", async () => {
    const file = join(dir, "bad.yaml");
    writeFileSync(file, "name: bad\nseed: 1\nfleet: { replicas: 2, profile: llama-3.1-8b-h100, gpus: 4 }\n");
    const r = await kvgate(["simulate", file]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /fleet\.gpus: unknown field/);
  });

  it("exits 2 naming the policies when --routers names none of an autoscaling scenario's", async () => {
    const r = await kvgate(["simulate", resolve("scenarios/autoscale-ramp.yaml"), "--routers", "default"]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /unknown policy "default".*kvgate, wva, dynamo, kpa, hpa-gpu/);
  });

  it("exits 2 saying what to do when --records is asked of an autoscaling scenario", async () => {
    const r = await kvgate([
      "simulate",
      resolve("scenarios/autoscale-ramp.yaml"),
      "--records",
      join(dir, "x.jsonl"),
    ]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--records is not supported for autoscaling scenarios.*drop the flag/);
  });
});
