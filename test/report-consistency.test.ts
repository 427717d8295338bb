/**
 * The report never contradicts itself: runs built by the bench's own aggregation (buildRun) from
 * seeded per-request records show the same req/s, output tok/s and TTFT p90 in the summary, the
 * load table and the latency table, in HTML and Markdown, and the demo's text summary shows the
 * summary's numbers. A closed-loop run has no "offered" rate; a single measured stage after a
 * warm-up is the run's own figures, not the stage window's. The TTFT bars carry their values and
 * switch to a log axis when one bar would be invisible beside another.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { demoSummary } from "../src/bench/demo-format.ts";
import type { RequestRecord } from "../src/bench/metrics.ts";
import { fixed, ms } from "../src/bench/report/figures.ts";
import { parseInput, renderReport } from "../src/bench/report/report.ts";
import { type RunResult, resultsFile } from "../src/bench/results.ts";
import { buildRun } from "../src/bench/run.ts";
import {
  generateWorkload,
  resolveWorkloadSpec,
  type WorkloadSpecInput,
} from "../src/bench/workloads/spec.ts";
import type { Workload } from "../src/bench/workloads/types.ts";

/** A small seeded generator (mulberry32). */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * One record per workload request: sends spread over time (closed-loop requests after their
 * dependency), a TTFT scaled by `ttftScale`, then `maxTokens` tokens one chunk each.
 */
function records(w: Workload, seed: number, ttftScale: number, stageStarts: number[] = []): RequestRecord[] {
  const r = rng(seed);
  const end = new Map<string, number>();
  return w.requests.map((q) => {
    const stage = q.stage;
    // Open-loop sends keep their offset into the stage, from the stage's actual start.
    const shift = stage === undefined ? 0 : (stageStarts[stage] ?? 0) - (w.stages[stage]?.start ?? 0);
    const start = q.after !== undefined ? (end.get(q.after.id) ?? 0) + q.after.delay : q.arrivalTime + shift;
    const ttft = ttftScale * (0.05 + r() * 0.5);
    const chunkTimes: number[] = [];
    const chunkTokens: number[] = [];
    let t = start + ttft;
    for (let i = 0; i < q.maxTokens; i++) {
      chunkTimes.push(t);
      chunkTokens.push(1);
      t += 0.01 + r() * 0.02;
    }
    const e = chunkTimes[chunkTimes.length - 1];
    end.set(q.id, e);
    return {
      id: q.id,
      ...(stage !== undefined ? { stage, warmup: w.stages[stage]?.warmup ?? false } : {}),
      start,
      end: e,
      chunkTimes,
      chunkTokens,
      promptTokens: q.promptTokensApprox,
      completionTokens: q.maxTokens,
      cachedTokens: Math.floor(q.promptTokensApprox * r()),
    };
  });
}

function runOf(input: WorkloadSpecInput, router: string, seed: number, ttftScale = 1) {
  const spec = resolveWorkloadSpec(input);
  const workload = generateWorkload(spec);
  // Stage k starts 5 s after stage k-1's nominal end (a barrier that waited).
  const stageStarts = workload.stages.map((s) => s.start + 5 * s.index);
  const recs = records(workload, seed, ttftScale, stageStarts);
  const run = buildRun(
    spec,
    workload,
    { records: recs, notSent: 0, stageStarts: workload.stages.length ? stageStarts : [], started: "" },
    { router, timeScale: 1 },
  );
  return { run, records: recs, workload };
}

const CLOSED: WorkloadSpecInput = {
  preset: "tutorial",
  seed: 3,
  numRequests: 60,
  options: { numGroups: 12, outputLen: 20 },
  arrival: { type: "closed", users: 12, thinkTime: 0 },
};

const WARMUP_THEN_ONE: WorkloadSpecInput = {
  workload: "shared-prefix",
  seed: 5,
  options: { numGroups: 6, promptsPerGroup: 5, systemPromptLen: 200, questionLen: 50, outputLen: 16 },
  arrival: {
    type: "stages",
    process: "poisson",
    barrier: true,
    stages: [
      { rate: 20, duration: 1, warmup: true },
      { rate: 20, duration: 2 },
    ],
  },
};

/** The Markdown table rows that follow the heading line `heading` (header first, no rule). */
function mdTable(md: string, heading: string): string[][] {
  const lines = md.split("\n");
  let i = lines.indexOf(heading);
  assert.ok(i >= 0, `no heading ${heading}`);
  while (!lines[i].startsWith("|")) i++;
  const rows: string[][] = [];
  for (; lines[i]?.startsWith("|"); i++)
    rows.push(
      lines[i]
        .slice(2, -2)
        .split(/(?<!\\) \| /)
        .map((c) => c.trim()),
    );
  return rows.filter((r) => !r.every((c) => /^-+:?$/.test(c)));
}

/** Column `name` of `rows` (header row first) as router → cell. */
function column(rows: string[][], name: string): Map<string, string> {
  const k = rows[0].indexOf(name);
  assert.ok(k > 0, `no column ${name} in ${rows[0].join(", ")}`);
  return new Map(rows.slice(1).map((r) => [r[0].replace(/\\/g, ""), r[k]]));
}

function report(runs: RunResult[]) {
  const file = resultsFile(runs, { kvgateVersion: "test", created: "2026-01-01T00:00:00Z", simulated: true });
  return renderReport([parseInput("demo.json", JSON.stringify(file))], { madeBy: "kvgate demo" });
}

test("each figure has one value in every table: summary, load points, latency percentiles", () => {
  const runs = [
    runOf(CLOSED, "round-robin", 1, 10).run,
    runOf(CLOSED, "kvgate", 2).run,
    runOf(WARMUP_THEN_ONE, "staged", 3).run,
  ];
  const { markdown } = report(runs);
  const summary = mdTable(markdown, "### demo.json");
  const load = mdTable(markdown, "## Throughput and TTFT p90 by offered load");
  const latency = mdTable(markdown, "## Latency percentiles");
  for (const r of runs) {
    const name = r.router;
    // The numbers are the run's own, formatted once.
    assert.equal(column(summary, "req/s").get(name), fixed(r.requests_per_s, 2));
    assert.equal(column(summary, "output tok/s").get(name), fixed(r.output_tokens_per_s, 0));
    for (const [col, tables] of [
      ["req/s", [summary, load]],
      ["output tok/s", [summary, load]],
      ["TTFT p90 (ms)", [summary, load, latency]],
    ] as const) {
      const values = tables.map((t) => column(t, col).get(name));
      assert.equal(new Set(values).size, 1, `${name} ${col}: ${values.join(" vs ")}`);
    }
  }
});

test("a single measured stage after a warm-up shows the run's figures, whose window differs from the stage's", () => {
  const { run } = runOf(WARMUP_THEN_ONE, "staged", 3);
  const measured = run.stages.filter((s) => !s.warmup);
  assert.equal(measured.length, 1);
  // The stage window starts at the stage start, the run's at its first send: the two figures differ,
  // which is exactly the contradiction the report must not show.
  assert.notEqual(fixed(measured[0].requests_per_s, 2), fixed(run.requests_per_s, 2));
  const load = mdTable(report([run]).markdown, "## Throughput and TTFT p90 by offered load");
  assert.deepEqual(load[1], [
    "staged",
    "all",
    "20.00",
    fixed(run.requests_per_s, 2),
    fixed(run.output_tokens_per_s, 0),
    ms(run.ttft_p90_s),
  ]);
});

test("a closed-loop run offers no rate: its load row and chart note say closed loop, not an offered QPS", () => {
  const { run } = runOf(CLOSED, "kvgate", 2);
  const { markdown, html } = report([run]);
  const load = mdTable(markdown, "## Throughput and TTFT p90 by offered load");
  assert.deepEqual(load[0], ["run", "stage", "offered req/s", "req/s", "output tok/s", "TTFT p90 (ms)"]);
  assert.equal(load[1][2], "closed loop, 12 users");
  assert.equal(load[1][3], fixed(run.requests_per_s, 2));
  assert.match(html, /offered load: kvgate: closed loop, 12 users\./);
  assert.doesNotMatch(
    html,
    new RegExp(`offered QPS[^<]*${fixed(run.requests_per_s, 2).replace(".", "\\.")}`),
  );
});

test("the TTFT bars carry their values, on a log axis when one is 20 times another", () => {
  const slow = runOf(CLOSED, "round-robin", 1, 100).run;
  const fast = runOf(CLOSED, "kvgate", 2).run;
  assert.ok((slow.ttft_p90_s ?? 0) > 20 * (fast.ttft_p90_s ?? Number.POSITIVE_INFINITY));
  const { html } = report([slow, fast]);
  const ttft = html.split("<figure>").find((f) => f.includes("TTFT p90 per run"));
  assert.ok(ttft);
  assert.match(ttft, /log scale/);
  for (const r of [slow, fast])
    assert.ok(ttft.includes(`>${+(r.ttft_p90_s ?? 0).toPrecision(3)} s<`), r.router);
  const near = report([runOf(CLOSED, "a", 1).run, runOf(CLOSED, "b", 2).run]).html;
  const linear = near.split("<figure>").find((f) => f.includes("TTFT p90 per run"));
  assert.ok(linear);
  assert.doesNotMatch(linear, /log scale/);
});

test("the footer names the results file the page was made from, and what made it", () => {
  const { html } = report([runOf(CLOSED, "kvgate", 2).run]);
  assert.match(html, /Made by kvgate demo \S+ from 1 results file \(demo\.json\)\./);
});

test("the demo's text summary prints the report's numbers", () => {
  const rr = runOf(CLOSED, "round-robin", 1, 10);
  const kv = runOf(CLOSED, "kvgate", 2);
  const phases = [
    { router: "round-robin" as const, ...rr, replicaLagMaxS: [0.01], wallSeconds: 1 },
    { router: "kvgate" as const, ...kv, replicaLagMaxS: [0.02], wallSeconds: 1 },
  ];
  const text = demoSummary(phases, [], { timeScale: 2 });
  const summary = mdTable(report([rr.run, kv.run]).markdown, "### demo.json");
  const row = (name: string) => {
    const line = text.split("\n").find((l) => l.startsWith(name));
    assert.ok(line, name);
    return line
      .slice(name.length)
      .trim()
      .split(/\s{2,}/);
  };
  assert.deepEqual(row("output tokens/s"), [
    column(summary, "output tok/s").get("round-robin"),
    column(summary, "output tok/s").get("kvgate"),
  ]);
  assert.deepEqual(row("req/s"), [
    column(summary, "req/s").get("round-robin"),
    column(summary, "req/s").get("kvgate"),
  ]);
  const p90 = row("TTFT p90 (s)").map((s) => ms(Number(s)));
  assert.deepEqual(p90, [
    column(summary, "TTFT p90 (ms)").get("round-robin"),
    column(summary, "TTFT p90 (ms)").get("kvgate"),
  ]);
  assert.doesNotMatch(text, /WARNING/);
});
