/**
 * `kvgate bench`: generates a workload from a seed and drives it against a target (a gateway, one
 * replica, real vLLM) or client-side round-robin over several base URLs, then prints a summary
 * and optionally writes a results JSON file. A progress line goes to stderr (redrawn on a TTY,
 * a plain line every 10 s otherwise).
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { type Command, InvalidArgumentError, Option } from "commander";
import { type DriverProgress, runBench } from "../bench/driver.ts";
import { formatProgress, formatSummary } from "../bench/format.ts";
import { parseSlo, type Slo } from "../bench/metrics.ts";
import { parseResultsFile, type ResultsFile, resultsFile } from "../bench/results.ts";
import { buildRun } from "../bench/run.ts";
import { KVGATE_VERSION } from "../bench/version.ts";
import { PRESETS } from "../bench/workloads/presets.ts";
import {
  generateWorkload,
  parseWorkloadYaml,
  resolveWorkloadSpec,
  WORKLOAD_NAMES,
  type WorkloadSpecInput,
} from "../bench/workloads/spec.ts";
import { traceToJsonl, workloadToTrace } from "../bench/workloads/trace.ts";

const number = (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isFinite(n)) throw new InvalidArgumentError("must be a number.");
  return n;
};
const integer = (v: string): number => {
  const n = number(v);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError("must be a non-negative integer.");
  return n;
};
const list = (v: string): string[] =>
  v
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
const collect = (v: string, prev: string[] = []) => [...prev, v];

/** "15:50w,3:20" → stages (rate:duration, a trailing "w" marks a warm-up stage). */
export function parseStages(v: string): Array<{ rate: number; duration: number; warmup?: boolean }> {
  return list(v).map((part) => {
    const m = /^([0-9.]+):([0-9.]+)(w?)$/.exec(part);
    if (!m) throw new InvalidArgumentError(`bad stage "${part}" (expected RATE:DURATION, e.g. 10:30)`);
    return { rate: Number(m[1]), duration: Number(m[2]), ...(m[3] ? { warmup: true } : {}) };
  });
}

/** "key=value" → [key, value], the value as JSON when it parses (numbers, objects), else a string. */
export function parseSet(kv: string): [string, unknown] {
  const i = kv.indexOf("=");
  if (i <= 0) throw new InvalidArgumentError(`bad --set "${kv}" (expected KEY=VALUE)`);
  const raw = kv.slice(i + 1);
  try {
    return [kv.slice(0, i), JSON.parse(raw)];
  } catch {
    return [kv.slice(0, i), raw];
  }
}

interface Flags {
  target?: string;
  roundRobin?: string[];
  workload?: string;
  preset?: string;
  workloadFile?: string;
  trace?: string;
  seed?: number;
  numRequests?: number;
  arrival?: "constant" | "poisson" | "gamma" | "closed";
  rate?: number;
  burstiness?: number;
  users?: number;
  thinkTime?: number;
  stages?: Array<{ rate: number; duration: number; warmup?: boolean }>;
  stageProcess?: "constant" | "poisson" | "gamma";
  barrier?: boolean;
  stageInterval?: number;
  set?: string[];
  model?: string;
  slo?: Slo;
  timeScale: number;
  maxDuration?: number;
  maxRequests?: number;
  requestTimeout?: number;
  metricsEndpoints?: string[];
  metrics: boolean;
  extraBody?: string;
  json?: string;
  append?: boolean;
  router?: string;
  dryRun?: boolean;
  writeTrace?: string;
  quiet?: boolean;
}

/** The workload spec input from --workload-file and the flags (flags win). */
export function specFromFlags(f: Flags): WorkloadSpecInput {
  const base: WorkloadSpecInput = f.workloadFile
    ? parseWorkloadYaml(readFileSync(f.workloadFile, "utf8"))
    : {};
  const spec: WorkloadSpecInput = { ...base, options: { ...base.options } };
  if (f.workload) spec.workload = f.workload as WorkloadSpecInput["workload"];
  if (f.preset) spec.preset = f.preset;
  if (f.trace) spec.workload ??= "trace";
  if (f.seed !== undefined) spec.seed = f.seed;
  if (f.numRequests !== undefined) spec.numRequests = f.numRequests;
  for (const kv of f.set ?? []) {
    const [k, v] = parseSet(kv);
    (spec.options as Record<string, unknown>)[k] = v;
  }
  if (f.stages) {
    spec.arrival = {
      type: "stages",
      stages: f.stages,
      ...(f.stageProcess ? { process: f.stageProcess } : {}),
      ...(f.burstiness !== undefined ? { burstiness: f.burstiness } : {}),
      ...(f.barrier ? { barrier: true } : {}),
      ...(f.stageInterval !== undefined ? { interval: f.stageInterval } : {}),
    };
  } else if (f.arrival === "closed" || (f.arrival === undefined && f.users !== undefined)) {
    if (f.users === undefined) throw new InvalidArgumentError("--arrival closed needs --users");
    spec.arrival = {
      type: "closed",
      users: f.users,
      ...(f.thinkTime !== undefined ? { thinkTime: f.thinkTime } : {}),
    };
  } else if (f.arrival || f.rate !== undefined) {
    const type = f.arrival ?? "poisson";
    const rate = f.rate ?? 1;
    spec.arrival =
      type === "gamma" ? { type, rate, burstiness: f.burstiness ?? 1 } : { type: type as "poisson", rate };
  }
  return spec;
}

async function action(f: Flags, cmd: Command): Promise<void> {
  const fail = (msg: string): never => cmd.error(`error: ${msg}`, { exitCode: 2 });
  let spec: ReturnType<typeof resolveWorkloadSpec>;
  let workload: ReturnType<typeof generateWorkload>;
  try {
    spec = resolveWorkloadSpec(specFromFlags(f));
    const traceText =
      spec.workload === "trace"
        ? readFileSync(f.trace ?? String(spec.options["path"] ?? ""), "utf8")
        : undefined;
    workload = generateWorkload(spec, { traceText });
  } catch (e) {
    return fail((e as Error).message);
  }
  for (const note of workload.notes ?? []) console.error(`note: ${note}`);
  if (f.writeTrace) {
    writeFileSync(f.writeTrace, traceToJsonl(workloadToTrace(workload)));
    console.error(`wrote ${workload.requests.length} trace records to ${f.writeTrace}`);
  }
  if (f.dryRun) {
    const tokens = workload.requests.reduce((a, r) => a + r.promptTokensApprox, 0);
    console.log(
      `${spec.workload}: ${workload.requests.length} requests, ${workload.stages.length} stages, ` +
        `~${tokens} prompt tokens, seed ${spec.seed}`,
    );
    return;
  }
  if (!!f.target === !!f.roundRobin?.length)
    return fail("give exactly one of --target URL or --round-robin URL,URL,...");
  const urls = f.target ? [f.target] : (f.roundRobin as string[]);
  const mode = f.target ? "single" : "round-robin";
  let extraBody: Record<string, unknown> | undefined;
  if (f.extraBody) {
    try {
      extraBody = JSON.parse(f.extraBody);
    } catch {
      return fail("--extra-body must be a JSON object");
    }
  }
  const unit = f.timeScale !== 1 ? "s(sim)" : "s";
  const tty = process.stderr.isTTY && !f.quiet;
  let lastPlain = 0;
  const onProgress = (p: DriverProgress) => {
    if (f.quiet) return;
    if (tty) process.stderr.write(`\r\x1b[2K${formatProgress(p, unit)}`);
    else if (performance.now() - lastPlain >= 10_000) {
      lastPlain = performance.now();
      process.stderr.write(`${formatProgress(p, unit)}\n`);
    }
  };
  const abort = new AbortController();
  const onSigint = () => abort.abort();
  process.once("SIGINT", onSigint);
  let result: Awaited<ReturnType<typeof runBench>>;
  try {
    result = await runBench(workload, {
      targets: urls,
      model: f.model,
      timeScale: f.timeScale,
      maxDuration: f.maxDuration,
      maxRequests: f.maxRequests,
      requestTimeout: f.requestTimeout,
      metricsEndpoints: f.metrics ? f.metricsEndpoints : [],
      extraBody,
      onProgress,
      signal: abort.signal,
    });
  } catch (e) {
    console.error(`kvgate bench: ${(e as Error).message}`);
    process.exitCode = 1;
    return;
  } finally {
    process.removeListener("SIGINT", onSigint);
    if (tty) process.stderr.write("\n");
  }
  const scales = result.fleet?.sim_time_scales;
  // Simulated: a scaled clock, or replicas that identify as kvgate's simulator.
  const simulated = f.timeScale !== 1 || scales !== undefined;
  if (scales && !scales.every((s) => s === f.timeScale))
    console.error(
      `warning: replicas run at time scale ${scales.join(", ")} but --time-scale is ${f.timeScale}`,
    );
  const run = buildRun(spec, workload, result, {
    router: f.router ?? (mode === "round-robin" ? "round-robin" : "target"),
    target: { mode, urls },
    timeScale: f.timeScale,
    slo: f.slo,
  });
  console.log(formatSummary(run, unit));
  if (result.maxScheduleLag > 1)
    console.error(
      `warning: requests were sent up to ${result.maxScheduleLag.toFixed(1)} ${unit} late; ` +
        "the driver could not keep up (lower --time-scale or the rate)",
    );
  if (f.json) {
    let file: ResultsFile;
    if (f.append && existsSync(f.json)) {
      file = parseResultsFile(readFileSync(f.json, "utf8"));
      if (file.simulated !== simulated) return fail(`${f.json} holds ${file.time_unit} runs; not appending`);
      file.runs.push(run);
    } else {
      file = resultsFile([run], {
        kvgateVersion: KVGATE_VERSION,
        created: new Date().toISOString(),
        simulated,
      });
    }
    writeFileSync(f.json, `${JSON.stringify(file, null, 2)}\n`);
    console.error(`results written to ${f.json}`);
  }
}

/** Adds the `bench` command to the program. */
export function registerBench(program: Command): Command {
  return program
    .command("bench")
    .description("Drive a seeded workload against a gateway, a replica or a round-robin list, and report.")
    .option("--target <url>", "one base URL: a kvgate gateway, one replica or real vLLM")
    .option("--round-robin <urls>", "client-side round-robin over these base URLs (comma-separated)", list)
    .addOption(new Option("--workload <name>", "workload generator").choices([...WORKLOAD_NAMES]))
    .addOption(new Option("--preset <name>", "named workload preset").choices(Object.keys(PRESETS)))
    .option(
      "--workload-file <yaml>",
      "workload spec file (workload, preset, seed, numRequests, arrival, options)",
    )
    .option("--trace <file.jsonl>", "JSONL trace to replay (workload trace)")
    .option("--seed <n>", "workload seed", integer)
    .option(
      "--num-requests <n>",
      "requests to generate (sessions for multi-turn); stages set their own",
      integer,
    )
    .addOption(
      new Option("--arrival <type>", "arrival process").choices(["constant", "poisson", "gamma", "closed"]),
    )
    .option("--rate <qps>", "requests (or sessions) per second", number)
    .option("--burstiness <k>", "gamma shape: 1 = Poisson, larger = more regular, smaller = burstier", number)
    .option(
      "--users <n>",
      "closed loop: concurrent users, each sending when its previous request ends",
      integer,
    )
    .option("--think-time <s>", "closed loop: pause between a user's requests", number)
    .option(
      "--stages <list>",
      "QPS sweep RATE:DURATION,... (suffix w = warm-up), e.g. 15:50w,3:20,10:20",
      parseStages,
    )
    .addOption(
      new Option("--stage-process <p>", "arrivals within stages").choices(["constant", "poisson", "gamma"]),
    )
    .option("--barrier", "start each stage only after the previous one drained (inference-perf)")
    .option("--stage-interval <s>", "pause between stages", number)
    .option("--set <key=value>", "workload option, repeatable (e.g. --set numGroups=150)", collect)
    .option("--model <name>", "model name (default: first of GET /v1/models)")
    .option("--slo <list>", "goodput SLOs in seconds, e.g. ttft=2,tpot=0.05", (v) => {
      try {
        return parseSlo(v);
      } catch (e) {
        throw new InvalidArgumentError((e as Error).message);
      }
    })
    .option(
      "--time-scale <n>",
      "simulated seconds per wall second of the target; times reported simulated",
      number,
      1,
    )
    .option("--max-duration <s>", "hard stop, workload seconds (default 3600)", number)
    .option("--max-requests <n>", "send at most this many requests", integer)
    .option("--request-timeout <s>", "per-request limit, workload seconds (default 600)", number)
    .option(
      "--metrics-endpoints <urls>",
      "replica base URLs to scrape /metrics from (default: the targets)",
      list,
    )
    .option("--no-metrics", "do not scrape /metrics")
    .option("--extra-body <json>", "merged into every request body, e.g. '{\"return_token_ids\":true}'")
    .option("--json <file>", "write results JSON here")
    .option("--append", "append the run to an existing --json file")
    .option("--router <name>", "router label for the results (default: target or round-robin)")
    .option("--dry-run", "generate the workload, print its size and exit")
    .option("--write-trace <file.jsonl>", "write the generated workload as a JSONL trace")
    .option("--quiet", "no progress line")
    .action(action);
}
