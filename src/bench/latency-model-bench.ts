/**
 * bench:latency-model — how well the in-process latency model predicts, on observations from the
 * fleet simulator running the real scheduler with config/examples/predicted-latency.yaml: every
 * TTFT and TPOT the producer trained on during the run (features at decision time, latency after),
 * in time order. Per workload and target, a fresh model per learner variant trains online on the
 * first 70% and is measured on the held-out 30% (MAPE, p50/p90 absolute percentage error, p90
 * absolute error in ms), beside a predict-the-mean baseline; also the prequential error (predict,
 * then learn) the router saw live. Then the cost of one prediction (CPU ns), and of a whole decision
 * with the trained predicted-latency config beside config/examples/default.yaml at 8 / 64 / 256
 * endpoints (timings: here, never in a test). Times are simulated. Writes JSON (default
 * results/bench-latency-model.json).
 *
 *   npm run bench:latency-model -- [--workloads mixed-length,multi-turn] [--train 0.7] [--quick] [--json FILE]
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { admissionFromConfig } from "../flow/admission.ts";
import type { EffectiveConfig } from "../scheduler/defaults.ts";
import type { LatencyFeatures } from "../scheduler/latency/predictor.ts";
import { LatencyPredictor } from "../scheduler/latency/predictor.ts";
import type { LatencyObservation } from "../scheduler/plugins/latency/producer.ts";
import { PredictedLatencyProducer } from "../scheduler/plugins/latency/producer.ts";
import type { Scheduler } from "../scheduler/scheduler.ts";
import { createScheduler } from "../scheduler/scheduler.ts";
import { chat, endpoint } from "../scheduler/testing.ts";
import { runFleet } from "../sim/fleet/fleet.ts";
import { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import { parseScenario } from "../sim/fleet/scenario.ts";
import { scenarioWorkload } from "../sim/fleet/simulate.ts";
import { parseBenchArgs } from "./cli-args.ts";
import { table } from "./format.ts";
import { evaluate, type Learner } from "./latency-model-eval.ts";

const USAGE =
  "usage: npm run bench:latency-model -- [--workloads mixed-length,multi-turn,long-prompt] [--train 0.7] [--quick] [--json FILE]";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const LEARNERS: Learner[] = ["relative", "linear", "log", "split", "mean"];

const { values: args } = parseBenchArgs("bench:latency-model", USAGE, {
  options: {
    workloads: { type: "string", default: "mixed-length,multi-turn,long-prompt" },
    train: { type: "string", default: "0.7" },
    quick: { type: "boolean", default: false },
    json: { type: "string", default: "results/bench-latency-model.json" },
  },
});

/** 4 × Llama-3.1-8B H100 under rising load: queues form in the later stages, so latency varies. */
const WORKLOADS: Record<string, string> = {
  "mixed-length": `
workload: mixed-length
options:
  shortLen: { mean: 400, std: 300, min: 8, max: 2000 }
  longLen: { mean: 20000, std: 5000, min: 8000, max: 30000 }
  longFraction: 0.03
  outputLen: { mean: 200, std: 80, min: 16, max: 400 }
  documentPool: 30
  api: chat
arrival:
  type: stages
  process: poisson
  stages:
    - { rate: 10, duration: 30 }
    - { rate: 25, duration: 40 }
    - { rate: 40, duration: 40 }
    - { rate: 55, duration: 40 }`,
  "long-prompt": `
workload: mixed-length
options:
  shortLen: { mean: 3000, std: 1500, min: 200, max: 8000 }
  longLen: { mean: 12000, std: 2000, min: 8000, max: 16000 }
  longFraction: 0.05
  outputLen: { mean: 150, std: 50, min: 16, max: 300 }
  documentPool: 200
  api: chat
arrival:
  type: stages
  process: poisson
  stages:
    - { rate: 8, duration: 30 }
    - { rate: 16, duration: 40 }
    - { rate: 24, duration: 40 }
    - { rate: 32, duration: 40 }`,
  "multi-turn": `
workload: multi-turn
options:
  turns: { mean: 6, std: 2, min: 3, max: 9 }
  systemPromptLen: 1000
  sharedSystemPrompts: 8
  questionLen: { mean: 200, std: 60, min: 20, max: 400 }
  outputLen: { mean: 300, std: 100, min: 50, max: 600 }
  thinkTime: 2
  api: chat
arrival:
  type: stages
  process: poisson
  stages:
    - { rate: 1, duration: 30 }
    - { rate: 3, duration: 40 }
    - { rate: 5, duration: 40 }
    - { rate: 7, duration: 40 }`,
};

function scenarioText(workload: string): string {
  const indented = WORKLOADS[workload]
    .trim()
    .split("\n")
    .map((l) => `  ${l}`)
    .join("\n");
  return `name: latency-model-${workload}
description: observations for bench:latency-model
seed: 7
fleet:
  replicas: 4
  profile: llama-3.1-8b-h100
routers:
  - name: predicted-latency
    config: config/examples/predicted-latency.yaml
workload:
${indented}
scrapeIntervalMs: 100
gatewayDelayMs: 0
`;
}

async function collect(workload: string, quick: boolean) {
  const sc = parseScenario(scenarioText(workload), resolve(ROOT, "bench-latency-model.yaml"));
  const { workload: w } = scenarioWorkload(sc, quick);
  const r = sc.routers[0];
  const created = await createScheduler(r.configText, { seed: sc.seed });
  return { ...runObserved(sc, w, created.scheduler, created.config), scheduler: created.scheduler };
}

/** Runs the fleet and collects every observation the scheduler's latency producer trains on. */
function runObserved(
  sc: ReturnType<typeof parseScenario>,
  w: ReturnType<typeof scenarioWorkload>["workload"],
  scheduler: Scheduler,
  config: EffectiveConfig,
) {
  const r = sc.routers[0];
  const producer = [...scheduler.plugins.values()].find(
    (p): p is PredictedLatencyProducer => p instanceof PredictedLatencyProducer,
  );
  if (producer === undefined) throw new Error("the config has no predicted-latency-producer");
  const obs: LatencyObservation[] = [];
  producer.onObservation = (o) => obs.push(o);
  const t0 = process.cpuUsage();
  const res = runFleet({
    fleet: r.pools[0],
    pools: r.pools,
    kvLink: r.kvLink,
    workload: w,
    scheduler,
    admission: admissionFromConfig(config).admission,
    seed: sc.seed,
    scrapeInterval: sc.scrapeInterval,
    gatewayDelay: sc.gatewayDelay,
    routerTokenizer: sc.routerTokenizer,
    kvEventsDelay: sc.kvEventsDelay,
    tokenizer: new PromptTokenizer(),
  });
  const cpu = process.cpuUsage(t0);
  return {
    obs,
    requests: w.requests.length,
    completed: res.counters.completed,
    simSeconds: res.endTime,
    runCpuSeconds: (cpu.user + cpu.system) / 1e6,
    stats: producer.stats(),
  };
}

/**
 * CPU µs per decision (schedule + onPicked + response hooks), median of 5 runs of 2,000, for a
 * scheduler over `n` idle endpoints with metrics and an 8k-character chat prompt per request.
 */
function decisionCost(s: Scheduler, n: number, seed: number): number {
  const eps = Array.from({ length: n }, (_, i) =>
    endpoint(`10.0.${i >> 8}.${i & 255}:8000`, {
      kvCacheUsagePercent: (i % 10) / 20,
      runningRequestsSize: i % 7,
    }),
  );
  const sys = "You are a careful assistant. ".repeat(280);
  const runs: number[] = [];
  let now = 1000 + seed;
  for (let r = 0; r < 5; r++) {
    const k = 2000;
    const t = process.cpuUsage();
    for (let i = 0; i < k; i++) {
      const req = chat(`d${seed}-${r}-${i}`, sys, `question ${i % 50}`);
      const res = s.schedule(req, eps, now);
      if (res.target !== null) {
        s.onPicked(req, res, now);
        s.onResponseStarted(req, res.target.id, now + 0.05);
        s.onResponseComplete(req, res.target.id, now + 0.5, { outputTokens: 50 });
      }
      now += 0.001;
    }
    const c = process.cpuUsage(t);
    runs.push((c.user + c.system) / k);
  }
  runs.sort((a, b) => a - b);
  return Math.round(runs[2] * 10) / 10;
}

/** CPU nanoseconds per prediction (TTFT and TPOT of one endpoint), median of 5 runs. */
function predictionCost(obs: readonly LatencyObservation[]): number {
  const m = new LatencyPredictor({ minSamples: 1 });
  for (const o of obs) (o.kind === "ttft" ? m.observeTtft : m.observeTpot).call(m, o.features, o.ms);
  const fs: LatencyFeatures[] = obs.slice(0, 1000).map((o) => o.features);
  const runs: number[] = [];
  let sink = 0;
  for (let r = 0; r < 5; r++) {
    const n = 200_000;
    const t = process.cpuUsage();
    for (let i = 0; i < n; i++) sink += m.predict(fs[i % fs.length]).ttftMs ?? 0;
    const c = process.cpuUsage(t);
    runs.push(((c.user + c.system) * 1000) / n);
  }
  if (sink === -1) console.log(sink);
  runs.sort((a, b) => a - b);
  return Math.round(runs[2]);
}

const trainFraction = Number(args.train);
const out: Record<string, unknown> = {
  bench: "latency-model",
  created: new Date().toISOString(),
  host: { cpus: os.cpus().length, loadavg: os.loadavg().map((v) => Math.round(v * 100) / 100) },
  config: "config/examples/predicted-latency.yaml",
  trainFraction,
  workloads: {},
};
const rows: string[][] = [];
let allObs: LatencyObservation[] = [];
let trained: Scheduler | null = null;
for (const name of args.workloads.split(",")) {
  if (WORKLOADS[name] === undefined)
    throw new Error(`unknown workload "${name}"; known: ${Object.keys(WORKLOADS).join(", ")}`);
  const c = await collect(name, args.quick);
  allObs = allObs.concat(c.obs);
  trained ??= c.scheduler;
  const targets: Record<string, unknown> = {};
  for (const kind of ["ttft", "tpot"] as const) {
    const per: Record<string, unknown> = {};
    for (const l of LEARNERS) {
      const v = evaluate(c.obs, kind, l, { trainFraction, minSamples: 100 });
      per[l] = v;
      const h = v.heldOut;
      rows.push([
        name,
        kind,
        l,
        String(h?.n ?? 0),
        h ? `${h.mape}%` : "-",
        h ? `${h.p50ApePct}%` : "-",
        h ? `${h.p90ApePct}%` : "-",
        h ? `${h.p90AbsMs} ms` : "-",
        h ? `${h.meanActualMs} ms` : "-",
        v.prequential ? `${v.prequential.mape}%` : "-",
      ]);
    }
    targets[kind] = per;
  }
  (out.workloads as Record<string, unknown>)[name] = {
    requests: c.requests,
    completed: c.completed,
    simulatedSeconds: Math.round(c.simSeconds * 10) / 10,
    runCpuSeconds: Math.round(c.runCpuSeconds * 10) / 10,
    observations: { ttft: c.stats.ttftSamples, tpot: c.stats.tpotSamples },
    targets,
  };
}
out.predictionCpuNs = predictionCost(allObs);
const dflt = (
  await createScheduler(readFileSync(resolve(ROOT, "config/examples/default.yaml"), "utf8"), { seed: 1 })
).scheduler;
const decision: Record<string, { predictedLatencyUs: number; defaultUs: number }> = {};
for (const n of [8, 64, 256]) {
  if (trained === null) break;
  decision[n] = { predictedLatencyUs: decisionCost(trained, n, n), defaultUs: decisionCost(dflt, n, n) };
}
out.decisionCpuUs = decision;
console.log(
  table(
    [
      "workload",
      "target",
      "learner",
      "held-out n",
      "MAPE",
      "p50 APE",
      "p90 APE",
      "p90 |err|",
      "mean",
      "prequential MAPE",
    ],
    rows,
  ),
);
console.log(
  `one prediction (TTFT + TPOT, one endpoint): ${out.predictionCpuNs} CPU ns; load average ${(out.host as { loadavg: number[] }).loadavg.join(" ")}`,
);
for (const [n, d] of Object.entries(decision))
  console.log(
    `decision at ${n} endpoints (CPU µs, median): predicted-latency ${d.predictedLatencyUs}, default ${d.defaultUs}`,
  );
const file = resolve(process.cwd(), args.json);
mkdirSync(dirname(file), { recursive: true });
writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
console.log(`wrote ${file}`);
