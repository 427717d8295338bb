/**
 * The one-command demo (`npm start` = `kvgate demo`): the tutorial workload (preset `tutorial`:
 * 150 closed-loop users, each with its own 6,000-token system prompt, asking 1,000-token questions
 * for 1,000-token answers) against simulated replicas run as separate processes: through client-side
 * round-robin and through kvgate at the same time, each phase on its own 8 replicas (or one after
 * the other with `sequential`). Beside the live figures it prints what the fleet simulator predicts
 * for the same fleet, workload and seed.
 *
 * Each phase gets fresh replicas so neither inherits the other's cache. The results file is
 * written when the phases end, and a finished phase is kept when the other fails. Every child
 * process is stopped on the way out, also on Ctrl-C.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { availableParallelism, setPriority } from "node:os";
import { dirname, resolve } from "node:path";
import { parsePromText, sumOf } from "../datalayer/prom-text.ts";
import {
  adaptiveStartTimeoutMs,
  type Child,
  cpuSecondsOf,
  simReplicaArgs,
  spawnKvgate,
  stopAll,
} from "../sim/launcher.ts";
import { type ClientCpu, type CpuUse, type DemoPhase, demoSummary } from "./demo-format.ts";
import { type Prediction, predictInWorkers } from "./demo-predict.ts";
import { runBench } from "./driver.ts";
import { formatProgress } from "./format.ts";
import { renderReport } from "./report/report.ts";
import { type ResultsFile, type RunResult, resultsFile } from "./results.ts";
import { buildRun } from "./run.ts";
import { KVGATE_VERSION } from "./version.ts";
import { generateWorkload, resolveWorkloadSpec, type WorkloadSpec } from "./workloads/spec.ts";
import type { Workload } from "./workloads/types.ts";

export type { DemoPhase } from "./demo-format.ts";

export interface DemoOptions {
  replicas: number;
  /** Simulated seconds per wall second of every replica. */
  timeScale: number;
  /**
   * Niceness of every replica process in both phases (0: as started). The replicas stand in for
   * GPUs and report when they run behind (the lag row); the gateway and the load generator are the
   * parts measured, so a positive value gives them a core first on a machine too small for all.
   */
  replicaNice: number;
  /** The gateway's metrics poll period, wall ms (the simulator is told it in simulated seconds). */
  scrapeIntervalMs: number;
  /** Closed-loop users, each with its own system prompt (the tutorial's 150). */
  users: number;
  /** Requests in all (the tutorial's 750: 5 questions per user). */
  requests: number;
  /** Users start their first questions evenly over this many simulated seconds (0: all at once). */
  rampUpS: number;
  /** Tokens per answer (the tutorial's 1,000). */
  outputLen: number;
  /**
   * The replicas' vLLM --stream-interval: new tokens per streamed chunk after the first (TTFT is
   * unchanged; the relay and the client handle a tenth of the socket writes at 10).
   */
  streamInterval: number;
  /** KV blocks per replica incl. the null block (--num-gpu-blocks-override); default: the profile's. */
  blocksPerReplica?: number;
  profile: string;
  seed: number;
  /** Start timeout of each child process, ms; default: adapted to the machine's load. */
  startTimeoutMs?: number;
  /** Skip the in-process fleet simulation. */
  predict: boolean;
  /**
   * Run round-robin, then kvgate, each alone on the machine, instead of both at once on their own
   * replicas (twice the wall time; for a machine too small to hold both).
   */
  sequential: boolean;
  /** The results file (written when the phases end; after each phase with `sequential`). */
  json: string;
  /** Where the HTML report goes. */
  report: string;
  log: (line: string) => void;
  signal?: AbortSignal;
}

const ROUTERS = ["round-robin", "kvgate"] as const;

/*
 * The defaults run both phases at once in real time, the users starting evenly over 20 s and the
 * replicas at nice 10: about 170 s on a 2-core VM (one phase after the other took 221 s at 1.25x).
 * Every answer is 1,000 tokens and nobody pauses, so users whose answers end a step apart on one
 * replica stay apart only if each next question reaches it within that step (~22 ms); one that comes
 * later is prefilled with its neighbour's, and from then on the two end and ask together, turn after
 * turn, in ever longer prefill steps. Started all at once, the first answers end within ~2 s, a step
 * apart on each replica: side by side, kvgate's live TTFT p90 was 0.59 / 0.62 s at nice 0 and
 * 0.21–0.25 s at nice 10 (simulated 0.21 s), and 1.0 s in a trial (not kept) that started kvgate 5 s
 * after round-robin. The ramp spaces a replica's users by 20 s ÷ 19: ~1 s, where a user's cold first
 * prompt takes ~0.39 s to prefill. Over 10 s (~0.5 s apart, a margin of ~0.1 s) a warm-up prefill
 * late by a replica's lag queued the next user's behind it and set the two closer for good: kvgate's
 * live TTFT p90 was +5.5 to +16% against the prediction on a quiet 2-core VM, and +180% (0.273 s,
 * users merged) with one core taken by another process; over 20 s, +3.2 to +5.3% in six quiet runs
 * and +12% with the core taken. Output tokens/s are ~10% lower over 20 s for both routers (the
 * window's ends hold fewer users); their ratio is the same.
 */
export const DEMO_DEFAULTS: Omit<DemoOptions, "log"> = {
  replicas: 8,
  timeScale: 1,
  replicaNice: 10,
  scrapeIntervalMs: 100,
  users: 150,
  requests: 750,
  rampUpS: 20,
  outputLen: 1000,
  streamInterval: 10,
  profile: "qwen3-32b-tp2-h100",
  seed: 42,
  predict: true,
  sequential: false,
  json: "results/demo.json",
  report: "results/demo-report.html",
};

/**
 * The prediction's trip from the client to a replica, wall ms (told the simulator in simulated
 * seconds). Live, a closed-loop user's next question reaches the replica a few ms after its last
 * answer token, after the replica has begun its next step, so it waits for that step to end; with no
 * trip at all the simulator admits it into that very step. kvgate's predicted TTFT is the same for
 * any trip from 0.1 to 20 simulated ms (p50 0.154 s, p90 0.209 s, against 0.077 / 0.133 s with
 * none); round-robin's p90 moves between 0.73 and 0.96 s.
 */
export const DEMO_HOP_WALL_MS = 2;

/**
 * How late the prediction lets each send come, wall ms (uniform from 0; told the simulator in
 * simulated seconds; demo-predict.ts jitterSends). Live, the next questions of users whose answers
 * ended in the same step leave the client one after another: in a 1.25x round-robin run, 91 of 599
 * gaps between sends were under 10 simulated ms where the exact simulator had 331 (329 of them 0).
 * Sent at one instant in a fixed order, round-robin's prediction dealt users back to replicas they
 * had used (26.2% hit rate against 16–18% live) and its TTFT p90 was 0.750 s against 0.54–0.61 s
 * live, with all users starting at once; with 5–50 ms of jitter it is 0.61–0.65 s at 15–17% hits,
 * and kvgate's is unchanged (0.203–0.207 s).
 */
export const DEMO_SEND_JITTER_WALL_MS = 10;

/**
 * Draws of that jitter the prediction simulates per router (~0.6 s each here). A draw is one order
 * in which the sends leave the client, and round-robin's hit rate moves with it: with the users
 * started over 10 s, 17.4–22.7% over 16 draws and 17.4–20.8% over five live runs (one of which
 * printed a warning against a single draw's 17.4%); over 20 s, 6.5–9.6% over the 8 draws (5.5–9.6%
 * over 32) and 6.4–11.1% over six live runs, one of them 15.5% above the range: at this ramp the
 * live send order is noisier than the 10 ms modelled. The summary compares each live figure with
 * the draws' range.
 */
export const DEMO_PREDICT_DRAWS = 8;

/** Room for the tutorial's 8,000-token requests; also lets a small --blocks fleet start. */
export const DEMO_MAX_MODEL_LEN = 16384;

/** A phase that did not finish; `kept` says what of the run was written anyway. */
export class DemoError extends Error {
  override name = "DemoError";
}

/** Why a phase stopped waiting at a Barrier: the other phase failed before it got there. */
export class Abandoned extends Error {
  override name = "Abandoned";
}

/**
 * Where side-by-side phases wait for each other: `arrive` resolves once every party has arrived;
 * `abandon` rejects every wait (Abandoned), for a phase that failed before arriving.
 */
export class Barrier {
  private arrived = 0;
  private open = (): void => undefined;
  private fail = (_: Error): void => undefined;
  readonly opened = new Promise<void>((resolve, reject) => {
    this.open = resolve;
    this.fail = reject;
  });
  constructor(private readonly parties: number) {
    this.opened.catch(() => undefined);
  }
  arrive(): Promise<void> {
    if (++this.arrived >= this.parties) this.open();
    return this.opened;
  }
  abandon(why: string): void {
    this.fail(new Abandoned(why));
  }
}

/**
 * Side by side, the phases start sending together and end together. Started as soon as they were
 * ready, the round-robin phase (no gateway to start) ran its first 3–4 s beside kvgate's booting
 * replicas and gateway, and its replicas fell 0.3–1.2 simulated s behind their timeline there (the
 * lag warning fired in six runs of six one day on this 2-core VM). And kvgate's phase, ~17 s
 * shorter, stopped its nine processes and aggregated its records while round-robin still ran: in
 * one run 18 deliveries came over 50 ms late then, none once a phase that finishes first keeps its
 * processes idle until the other is done. One stall ~95 s in, every replica of both phases
 * 0.12–0.16 s late at once, was a major collection of the prediction's garbage in this process: the
 * prediction runs in worker threads for that (demo-predict.ts, predictInWorkers).
 */
export interface PhaseLines {
  start: Barrier;
  finish: Barrier;
}

/** The tutorial preset, scaled only where the options differ from it. */
export function demoWorkloadSpec(o: Omit<DemoOptions, "log">): WorkloadSpec {
  return resolveWorkloadSpec({
    preset: "tutorial",
    seed: o.seed,
    numRequests: o.requests,
    options: { numGroups: o.users, outputLen: o.outputLen },
    // Each user's first question is cold for any router; the steady state is what routing changes.
    arrival: { type: "closed", users: o.users, thinkTime: 0, warmup: 1, rampUp: o.rampUpS },
  });
}

/*
 * The gateway scrapes at `kvgate serve`'s default period (DEMO_DEFAULTS.scrapeIntervalMs, 100 ms), in
 * wall time as a user's gateway would, and the simulator is told that period in simulated seconds.
 * Scraping every 100 simulated ms instead (50 ms wall at 2x) made 8 replicas render their ~30 KB
 * /metrics 160 times a wall second on the same 2 cores (a third of their CPU in a kvgate-only run),
 * which delayed the live requests; the simulator's figures for this workload are the same at 100,
 * 200 and 500 ms. Scraping 8 idle replicas every 100 wall ms keeps the gateway busy 77 ms per
 * second and each replica 16–23 (22 and 7–9 at 1,000 ms; CPU time from /proc, this 2-core VM).
 */

function startHint(o: DemoOptions, timeoutMs: number): string {
  const next = Math.ceil((timeoutMs * 3) / 1000);
  return (
    `What to do: the machine is too busy to start ${o.replicas} replicas in time; re-run with ` +
    `--start-timeout ${next} (seconds), or with fewer --replicas, or when the machine is less loaded.`
  );
}

async function startReplicas(o: DemoOptions, phase: string, timeoutMs: number): Promise<Child[]> {
  const args = (i: number) =>
    simReplicaArgs({
      profile: o.profile,
      "time-scale": o.timeScale,
      "num-gpu-blocks-override": o.blocksPerReplica,
      "max-model-len": DEMO_MAX_MODEL_LEN,
      "stream-interval": o.streamInterval,
      seed: o.seed + i,
    });
  const hint = startHint(o, timeoutMs);
  const started = await Promise.allSettled(
    Array.from({ length: o.replicas }, (_, i) =>
      spawnKvgate(`${phase} replica ${i}`, args(i), { timeoutMs, hint }),
    ),
  );
  const ok = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const failed = started.find((s) => s.status === "rejected");
  if (failed) {
    await stopAll(ok);
    throw failed.reason;
  }
  if (o.replicaNice > 0)
    for (const c of ok)
      try {
        setPriority(c.proc.pid ?? 0, o.replicaNice);
      } catch (err) {
        o.log(
          `warning: could not renice ${c.name} to ${o.replicaNice}: ${(err as Error).message}; it runs as started`,
        );
      }
  return ok;
}

/**
 * Waits until the gateway lists a model at /v1/models, i.e. it has scraped and admitted the
 * replicas; before that it has nowhere to route (and the driver cannot learn the model name).
 */
async function gatewayReady(url: string, replicas: number, timeoutMs: number, hint: string): Promise<void> {
  const t0 = performance.now();
  let last = "no answer yet";
  while (performance.now() - t0 < timeoutMs) {
    try {
      const res = await fetch(`${url}/v1/models`, { signal: AbortSignal.timeout(5000) });
      const body = (await res.json()) as { data?: unknown[] };
      if (res.ok && Array.isArray(body.data) && body.data.length > 0) return;
      last = `HTTP ${res.status}, ${Array.isArray(body.data) ? body.data.length : "no"} models listed`;
    } catch (err) {
      last = (err as Error).message;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(
    `the gateway at ${url} listed no model at /v1/models within ${(timeoutMs / 1000).toFixed(0)} s ` +
      `(last: ${last}): it has not admitted any of the ${replicas} replicas, whose /metrics it must scrape first. ${hint}`,
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

async function phase(
  o: DemoOptions,
  router: "round-robin" | "kvgate",
  spec: WorkloadSpec,
  workload: Workload,
  lines?: PhaseLines,
): Promise<DemoPhase> {
  const children: Child[] = [];
  const stop = () => stopAll(children);
  o.signal?.addEventListener("abort", () => void stop(), { once: true });
  const timeoutMs = o.startTimeoutMs ?? adaptiveStartTimeoutMs();
  const w0 = performance.now();
  // The last line this phase reached (side by side).
  let at: keyof PhaseLines | null = null;
  try {
    children.push(...(await startReplicas(o, router, timeoutMs)));
    const urls = children.map((c) => c.url);
    let targets = urls;
    if (router === "kvgate") {
      const args = [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--scrape-interval-ms",
        String(o.scrapeIntervalMs),
        "--endpoints",
        urls.map((u) => new URL(u).host).join(","),
      ];
      const gw = await spawnKvgate("gateway", args, { timeoutMs, hint: startHint(o, timeoutMs) });
      children.push(gw);
      targets = [gw.url];
      await gatewayReady(gw.url, o.replicas, timeoutMs, startHint(o, timeoutMs));
    }
    o.log(
      `${router}: ${o.replicas} replicas ready after ${((performance.now() - w0) / 1000).toFixed(1)} s; ` +
        `${workload.requests.length} requests from ${o.users} closed-loop users`,
    );
    if (lines) {
      at = "start";
      await lines.start.arrive();
    }
    const cpu = cpuMeter(
      children.slice(0, o.replicas),
      router === "kvgate" ? children[o.replicas] : undefined,
      // Side by side, this process drives both phases: runDemo reports its CPU once.
      o.sequential,
    );
    const result = await runBench(workload, {
      targets,
      timeScale: o.timeScale,
      metricsEndpoints: urls,
      maxDuration: 3600,
      progressIntervalMs: 10_000,
      onProgress: (p) => o.log(`  ${router}: ${formatProgress(p, " sim s")}`),
      signal: o.signal,
    });
    const cpuUse = cpu();
    const replicaLagMaxS = await lagOf(urls);
    const wallSeconds = (performance.now() - w0) / 1000;
    if (lines) {
      at = "finish";
      // This phase is done either way: if the other failed, its results are kept as they were.
      await lines.finish.arrive().catch(() => undefined);
    }
    const run = buildRun(spec, workload, result, {
      router,
      timeScale: o.timeScale,
      target: { mode: router === "kvgate" ? "single" : "round-robin", urls: targets },
    });
    return { router, run, records: result.records, replicaLagMaxS, wallSeconds, cpu: cpuUse };
  } catch (err) {
    if (at === null) lines?.start.abandon(`the ${router} phase did not start`);
    if (at !== "finish") lines?.finish.abandon(`the ${router} phase did not finish`);
    throw err;
  } finally {
    await stop();
  }
}

/**
 * Starts counting CPU seconds (replicas, gateway, and this process when `client`); the returned
 * function reads them.
 */
function cpuMeter(replicas: Child[], gateway: Child | undefined, client: boolean): () => CpuUse {
  const sum = (cs: Child[]) => {
    let t = 0;
    for (const c of cs) {
      const s = cpuSecondsOf(c.proc.pid);
      if (s === null) return null;
      t += s;
    }
    return t;
  };
  const r0 = sum(replicas);
  const g0 = gateway ? sum([gateway]) : null;
  const c0 = process.cpuUsage();
  const w0 = performance.now();
  return () => {
    const r1 = sum(replicas);
    const g1 = gateway ? sum([gateway]) : null;
    const c = process.cpuUsage(c0);
    return {
      wallS: (performance.now() - w0) / 1000,
      replicasS: r0 === null || r1 === null ? null : r1 - r0,
      gatewayS: g0 === null || g1 === null ? null : g1 - g0,
      clientS: client ? (c.user + c.system) / 1e6 : null,
    };
  };
}

/** The results file: the live runs, then the simulator's (router "<name> (kvgate simulate)"). */
export function demoResultsFile(phases: DemoPhase[], predictions: Prediction[]): ResultsFile {
  const runs: RunResult[] = [
    ...phases.map((p) => ({ ...p.run, source: "live", replica_lag_max_s: p.replicaLagMaxS })),
    ...predictions.map((p) => ({
      ...p.run,
      router: `${p.router} (kvgate simulate)`,
      source: "kvgate simulate",
    })),
  ];
  return resultsFile(runs, {
    kvgateVersion: KVGATE_VERSION,
    created: new Date().toISOString(),
    simulated: true,
  });
}

function writeOutputs(o: DemoOptions, phases: DemoPhase[], predictions: Prediction[]): ResultsFile {
  const file = demoResultsFile(phases, predictions);
  const json = resolve(o.json);
  mkdirSync(dirname(json), { recursive: true });
  writeFileSync(json, `${JSON.stringify(file, null, 2)}\n`);
  const html = resolve(o.report);
  mkdirSync(dirname(html), { recursive: true });
  writeFileSync(
    html,
    renderReport([{ name: o.json, file }], { title: "kvgate demo (simulated)", madeBy: "kvgate demo" }).html,
  );
  return file;
}

export async function runDemo(o: DemoOptions): Promise<{ phases: DemoPhase[]; file: ResultsFile | null }> {
  const t0 = performance.now();
  const spec = demoWorkloadSpec(o);
  const workload = generateWorkload(spec);
  o.log(
    `kvgate demo (simulated): ${o.replicas} x ${o.profile} replicas at ${o.timeScale}x real time` +
      `${o.replicaNice > 0 ? `, nice ${o.replicaNice}` : ""}; gateway scrapes every ${o.scrapeIntervalMs} wall ms; ` +
      `workload preset tutorial: ${o.users} users x 6,000-token system prompts, 1,000-token questions, ` +
      `${o.outputLen.toLocaleString("en-US")}-token answers, ${workload.requests.length} requests` +
      `${o.rampUpS > 0 ? `, users starting over ${o.rampUpS} s` : ", all users at once"}`,
  );
  let predictions: Prediction[] = [];
  if (o.predict) {
    const p0 = performance.now();
    predictions = await predictInWorkers(spec, {
      replicas: o.replicas,
      profile: o.profile,
      numGpuBlocks: o.blocksPerReplica,
      maxModelLen: DEMO_MAX_MODEL_LEN,
      scrapeIntervalS: (o.scrapeIntervalMs * o.timeScale) / 1000,
      gatewayDelayS: (DEMO_HOP_WALL_MS * o.timeScale) / 1000,
      sendJitterS: (DEMO_SEND_JITTER_WALL_MS * o.timeScale) / 1000,
      draws: DEMO_PREDICT_DRAWS,
    });
    o.log(
      `kvgate simulate (in-process, same fleet, workload and seed; ${predictions[0]?.draws.length ?? 0} draws ` +
        `of the send order per router, one worker thread each): done in ${((performance.now() - p0) / 1000).toFixed(1)} s`,
    );
  }
  const phases: DemoPhase[] = [];
  let file: ResultsFile | null = null;
  const failed = (router: string, err: unknown): DemoError => {
    const kept = phases.length
      ? ` The finished ${phases.map((p) => p.router).join(", ")} phase is kept in ${resolve(o.json)} and ${resolve(o.report)}.`
      : "";
    if (phases.length) writeOutputs(o, phases, predictions);
    const msg = (err as Error).message.replace(/\.?\s*$/, ".");
    return new DemoError(`the ${router} phase failed: ${msg}${kept}`);
  };
  let client: ClientCpu | undefined;
  if (o.sequential) {
    for (const router of ROUTERS) {
      if (o.signal?.aborted) break;
      try {
        phases.push(await phase(o, router, spec, workload));
      } catch (err) {
        if (o.signal?.aborted) break;
        throw failed(router, err);
      }
      file = writeOutputs(o, phases, predictions);
    }
  } else {
    // Side by side: each phase has its own replicas (and kvgate its gateway); this process drives both.
    const c0 = process.cpuUsage();
    const w0 = performance.now();
    const lines: PhaseLines = { start: new Barrier(ROUTERS.length), finish: new Barrier(ROUTERS.length) };
    lines.start.opened.then(
      () => o.log("both phases ready: their users start now, side by side"),
      () => undefined,
    );
    const settled = await Promise.allSettled(
      ROUTERS.map((router) => phase(o, router, spec, workload, lines)),
    );
    const c = process.cpuUsage(c0);
    client = { wallS: (performance.now() - w0) / 1000, cpuS: (c.user + c.system) / 1e6 };
    for (const s of settled) if (s.status === "fulfilled") phases.push(s.value);
    // The phase that failed, not the one that then stopped waiting for it at a line.
    const rejected = (s: PromiseSettledResult<DemoPhase>) => s.status === "rejected";
    const own = settled.findIndex(
      (s) => rejected(s) && !((s as PromiseRejectedResult).reason instanceof Abandoned),
    );
    const bad = own >= 0 ? own : settled.findIndex(rejected);
    if (bad >= 0 && !o.signal?.aborted)
      throw failed(ROUTERS[bad], (settled[bad] as PromiseRejectedResult).reason);
    if (phases.length) file = writeOutputs(o, phases, predictions);
  }
  if (phases.length === 2)
    o.log(
      `\n${demoSummary(phases, predictions, { timeScale: o.timeScale, cores: availableParallelism(), client })}`,
    );
  if (file) o.log(`results: ${resolve(o.json)}\nreport: ${resolve(o.report)}`);
  o.log(`wall time ${((performance.now() - t0) / 1000).toFixed(0)} s`);
  return { phases, file };
}
