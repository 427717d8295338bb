/**
 * The one-command demo (`npm start` = `kvgate demo`): 8 simulated replicas as separate processes, the
 * tutorial workload's shape (150 users, each with a 6,000-token system prompt, 1,000-token questions,
 * KV pressure across the fleet) time-scaled and shortened to run in about two minutes on 2 cores,
 * first through client-side round-robin, then through kvgate, printed side by side. Each phase gets
 * fresh replicas so neither inherits the other's cache. Every child process is stopped on the way
 * out, also on Ctrl-C.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parsePromText, sumOf } from "../datalayer/prom-text.ts";
import { type Child, spawnKvgate, stopAll } from "../sim/launcher.ts";
import { runBench } from "./driver.ts";
import { formatProgress, table } from "./format.ts";
import { renderReport } from "./report/report.ts";
import { type ResultsFile, type RunResult, resultsFile } from "./results.ts";
import { buildRun } from "./run.ts";
import { KVGATE_VERSION } from "./version.ts";
import { generateWorkload, resolveWorkloadSpec, type WorkloadSpecInput } from "./workloads/spec.ts";

export interface DemoOptions {
  replicas: number;
  /** Simulated seconds per wall second of every replica. */
  timeScale: number;
  /** Measured requests per phase, after the warm-up. */
  requests: number;
  /** Warm-up requests per phase (not measured); the measured stage starts once they drain. */
  warmup: number;
  /** Offered load, requests per simulated second (Poisson). */
  rate: number;
  outputLen: number;
  /** KV blocks per replica (16 tokens each). */
  blocksPerReplica: number;
  profile: string;
  seed: number;
  json?: string;
  /** Where the HTML report goes. */
  report: string;
  log: (line: string) => void;
  signal?: AbortSignal;
}

export const DEMO_DEFAULTS: Omit<DemoOptions, "log"> = {
  replicas: 8,
  timeScale: 1,
  requests: 1200,
  warmup: 300,
  rate: 50,
  outputLen: 64,
  blocksPerReplica: 19208,
  profile: "qwen3-32b-tp2-h100",
  seed: 42,
  report: "results/demo-report.html",
};

export interface DemoPhase {
  router: string;
  run: RunResult;
  /** Max simulated seconds each replica's delivery ran behind its modelled timeline. */
  replicaLagMaxS: number[];
}

function workloadSpec(o: Omit<DemoOptions, "log">): WorkloadSpecInput {
  return {
    workload: "shared-prefix",
    seed: o.seed,
    options: {
      numGroups: 150,
      promptsPerGroup: 5,
      systemPromptLen: 6000,
      questionLen: 1000,
      outputLen: o.outputLen,
      api: "completion",
      order: "permuted",
    },
    // A warm-up stage (excluded from the figures, as llm-d's runs have), then the measured stage once
    // the warm-up has drained, so both routers are measured on warm caches and empty queues.
    arrival: {
      type: "stages",
      process: "poisson",
      barrier: true,
      interval: 0,
      stages: [
        { rate: o.rate, duration: o.warmup / o.rate, warmup: true },
        { rate: o.rate, duration: o.requests / o.rate },
      ],
    },
  };
}

async function startReplicas(o: DemoOptions, phase: string): Promise<Child[]> {
  const args = (i: number) => [
    "sim-replica",
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--profile",
    o.profile,
    "--time-scale",
    String(o.timeScale),
    "--num-gpu-blocks-override",
    String(o.blocksPerReplica),
    "--max-model-len",
    "16384",
    "--seed",
    String(o.seed + i),
  ];
  return Promise.all(
    Array.from({ length: o.replicas }, (_, i) => spawnKvgate(`${phase} replica ${i}`, args(i))),
  );
}

async function lagOf(urls: string[]): Promise<number[]> {
  return Promise.all(
    urls.map(async (u) => {
      try {
        const res = await fetch(`${u}/metrics`, { signal: AbortSignal.timeout(5000) });
        const fams = parsePromText(await res.text(), { lenient: true }).families;
        return sumOf(fams, "kvgate:sim_lag_max_seconds") ?? Number.NaN;
      } catch {
        return Number.NaN;
      }
    }),
  );
}

async function phase(o: DemoOptions, router: "round-robin" | "kvgate"): Promise<DemoPhase> {
  const children: Child[] = [];
  const stop = () => stopAll(children);
  o.signal?.addEventListener("abort", () => void stop(), { once: true });
  try {
    children.push(...(await startReplicas(o, router)));
    const urls = children.map((c) => c.url);
    let targets = urls;
    if (router === "kvgate") {
      const gw = await spawnKvgate("gateway", [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--endpoints",
        urls.map((u) => new URL(u).host).join(","),
      ]);
      children.push(gw);
      targets = [gw.url];
    }
    const spec = resolveWorkloadSpec(workloadSpec(o));
    const workload = generateWorkload(spec);
    o.log(
      `${router}: ${o.replicas} replicas ready; ${o.warmup} warm-up then ${o.requests} measured requests at ${o.rate}/s (simulated)`,
    );
    const result = await runBench(workload, {
      targets,
      timeScale: o.timeScale,
      metricsEndpoints: urls,
      maxDuration: 900,
      progressIntervalMs: 5000,
      onProgress: (p) => o.log(`  ${router}: ${formatProgress(p, "sim s")}`),
      signal: o.signal,
    });
    const run = buildRun(spec, workload, result, {
      router,
      timeScale: o.timeScale,
      target: { mode: router === "kvgate" ? "single" : "round-robin", urls: targets },
    });
    return { router, run, replicaLagMaxS: await lagOf(urls) };
  } finally {
    await stop();
  }
}

function fmt(x: number | null | undefined, digits = 2): string {
  return x === null || x === undefined || Number.isNaN(x) ? "—" : x.toFixed(digits);
}

export function sideBySide(a: DemoPhase, b: DemoPhase): string {
  const rows: [string, (p: DemoPhase) => string][] = [
    ["requests ok / errors", (p) => `${p.run.requests - p.run.errors} / ${p.run.errors}`],
    ["output tokens/s", (p) => fmt(p.run.output_tokens_per_s, 0)],
    ["total tokens/s", (p) => fmt(p.run.total_tokens_per_s, 0)],
    ["TTFT p50 (s)", (p) => fmt(p.run.ttft_p50_s, 3)],
    ["TTFT p90 (s)", (p) => fmt(p.run.ttft_p90_s, 3)],
    ["TTFT p99 (s)", (p) => fmt(p.run.ttft_p99_s, 3)],
    ["TPOT p50 (s)", (p) => fmt(p.run.tpot_p50_s, 4)],
    ["e2e p50 (s)", (p) => fmt(p.run.e2e_p50_s, 2)],
    [
      "prefix-cache hit rate",
      (p) =>
        p.run.prefix_cache_hit_rate == null ? "—" : `${(p.run.prefix_cache_hit_rate * 100).toFixed(1)}%`,
    ],
    ["max replica lag (sim s)", (p) => fmt(Math.max(...p.replicaLagMaxS), 3)],
  ];
  const ratio = (x: number | null, y: number | null) => (x && y ? `${(x / y).toFixed(2)}x` : "—");
  const out = table(
    ["", a.router, b.router],
    rows.map(([name, f]) => [name, f(a), f(b)]),
  );
  return `${out}\nkvgate vs round-robin: output tokens/s ${ratio(b.run.output_tokens_per_s, a.run.output_tokens_per_s)}, TTFT p90 ${ratio(a.run.ttft_p90_s, b.run.ttft_p90_s)} better`;
}

export async function runDemo(o: DemoOptions): Promise<{ phases: DemoPhase[]; file: ResultsFile }> {
  o.log(
    `kvgate demo (simulated): ${o.replicas} x ${o.profile} replicas at ${o.timeScale}x, ${o.blocksPerReplica} KV blocks each; ` +
      `150 users x 6,000-token system prompts, 1,000-token questions, ${o.outputLen}-token answers`,
  );
  const phases: DemoPhase[] = [];
  for (const router of ["round-robin", "kvgate"] as const) {
    if (o.signal?.aborted) break;
    phases.push(await phase(o, router));
  }
  const file: ResultsFile = resultsFile(
    phases.map((p) => ({ ...p.run, replica_lag_max_s: p.replicaLagMaxS })),
    { kvgateVersion: KVGATE_VERSION, created: new Date().toISOString(), simulated: true },
  );
  if (o.json) writeFileSync(resolve(o.json), `${JSON.stringify(file, null, 2)}\n`);
  if (phases.length === 2) {
    o.log(`\n${sideBySide(phases[0], phases[1])}`);
    const out = resolve(o.report);
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(
      out,
      renderReport([{ name: "kvgate demo", file }], { title: "kvgate demo (simulated)" }).html,
    );
    o.log(`report: ${out}`);
  }
  return { phases, file };
}
