/**
 * Everything `kvgate bench` settles from its flags before it sends a request: the workload (files
 * read with errors that name the flag), the targets and every other URL checked for a scheme,
 * number flags in range, --extra-body an object, the --json file writable (and, with --append,
 * holding runs on the same clock), and the fleet's clock read from the replicas' /metrics. Any
 * problem throws with what to fix, so a bad command line never costs a benchmark run.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { InvalidArgumentError } from "commander";
import { metricsUrl } from "../bench/fleet-metrics.ts";
import type { Slo } from "../bench/metrics.ts";
import { listModels, pickModel } from "../bench/model-list.ts";
import {
  BenchSetupError,
  type Clock,
  checkBaseUrl,
  decideClock,
  gatewayReplicas,
  probeMetrics,
} from "../bench/preflight.ts";
import { checkResultsTarget } from "../bench/results-io.ts";
import {
  generateWorkload,
  parseWorkloadYaml,
  resolveWorkloadSpec,
  type WorkloadSpec,
  type WorkloadSpecInput,
} from "../bench/workloads/spec.ts";
import { traceToJsonl, workloadToTrace } from "../bench/workloads/trace.ts";
import type { Workload } from "../bench/workloads/types.ts";

export const number = (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isFinite(n)) throw new InvalidArgumentError("must be a number.");
  return n;
};
export const integer = (v: string): number => {
  const n = number(v);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError("must be a non-negative integer.");
  return n;
};
export const list = (v: string): string[] =>
  v
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
export const collect = (v: string, prev: string[] = []) => [...prev, v];

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

export interface Flags {
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
  /** Unset: read from the replicas' kvgate:sim_time_scale (1 for real servers). */
  timeScale?: number;
  maxErrorRate: number;
  gatewayAdmin?: string;
  /** Text of --workload-file, read by the caller. */
  workloadText?: string;
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

/** The workload spec input from --workload-file's text and the flags (flags win). */
export function specFromFlags(f: Flags): WorkloadSpecInput {
  const base: WorkloadSpecInput = f.workloadText !== undefined ? parseWorkloadYaml(f.workloadText) : {};
  const spec: WorkloadSpecInput = { ...base, options: { ...base.options } };
  if (f.workload) spec.workload = f.workload as WorkloadSpecInput["workload"];
  if (f.preset) spec.preset = f.preset;
  if (f.trace) spec.workload ??= "trace";
  if (f.trace && spec.workload !== "trace")
    throw new InvalidArgumentError(
      `--trace replays a trace, but the workload is ${spec.workload}: drop --trace, or --workload/--preset`,
    );
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
    if (f.users === undefined)
      throw new InvalidArgumentError("--arrival closed needs --users N (how many users send at once)");
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

/** Reads a file a flag names, with an error that says which flag and what to do. */
function readFlagFile(flag: string, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    const why = err.code === "ENOENT" ? "no such file" : err.code === "EISDIR" ? "a directory" : err.message;
    throw new BenchSetupError(`${flag} ${path}: ${why}; check the path`);
  }
}

/** The workload spec and its requests from the flags; throws with what to fix. */
function loadWorkload(f: Flags) {
  const input = specFromFlags({
    ...f,
    ...(f.workloadFile ? { workloadText: readFlagFile("--workload-file", f.workloadFile) } : {}),
  });
  const spec = resolveWorkloadSpec(input);
  let traceText: string | undefined;
  if (spec.workload === "trace") {
    const path = f.trace ?? (spec.options["path"] as string | undefined);
    if (!path)
      throw new BenchSetupError(
        "the trace workload needs --trace FILE.jsonl (or options.path in --workload-file)",
      );
    traceText = readFlagFile(f.trace ? "--trace" : "options.path", path);
  }
  return { spec, workload: generateWorkload(spec, { traceText }) };
}

/** Checks every URL and number flag before anything is sent; returns the targets. */
function checkFlags(f: Flags): string[] {
  if (!!f.target === !!f.roundRobin?.length)
    throw new BenchSetupError("give exactly one of --target URL or --round-robin URL,URL,...");
  const urls = f.target
    ? [checkBaseUrl("--target", f.target)]
    : f.roundRobin!.map((u) => checkBaseUrl("--round-robin", u));
  for (const u of f.metricsEndpoints ?? []) checkBaseUrl("--metrics-endpoints", u);
  if (f.gatewayAdmin) checkBaseUrl("--gateway-admin", f.gatewayAdmin);
  if (f.gatewayAdmin && f.metricsEndpoints)
    throw new BenchSetupError("give at most one of --gateway-admin and --metrics-endpoints");
  if (f.timeScale !== undefined && !(f.timeScale > 0))
    throw new BenchSetupError(
      `--time-scale must be > 0 (simulated seconds per wall second), got ${f.timeScale}`,
    );
  if (!(f.maxErrorRate >= 0 && f.maxErrorRate <= 1))
    throw new BenchSetupError(
      `--max-error-rate is a fraction from 0 to 1 (e.g. 0.05), got ${f.maxErrorRate}`,
    );
  if (f.append && !f.json) throw new BenchSetupError("--append needs --json FILE (the file to append to)");
  return urls;
}

function parseExtraBody(text: string | undefined): Record<string, unknown> | undefined {
  if (text === undefined) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new BenchSetupError(
      `--extra-body is not JSON (${(e as Error).message}); e.g. '{"return_token_ids":true}'`,
    );
  }
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new BenchSetupError(`--extra-body must be a JSON object, e.g. '{"return_token_ids":true}'`);
  return v as Record<string, unknown>;
}

/** Where the fleet's /metrics are, and its clock. */
async function settleClock(f: Flags, urls: string[]): Promise<{ metricBases: string[]; clock: Clock }> {
  if (!f.metrics) {
    const notes =
      f.timeScale === undefined
        ? ["--no-metrics: the fleet's clock is not read; times are wall seconds unless --time-scale N"]
        : [];
    const clock: Clock = {
      timeScale: f.timeScale ?? 1,
      simulated: (f.timeScale ?? 1) !== 1,
      source: f.timeScale === undefined ? "default" : "flag",
      warnings: [],
      notes,
    };
    return { metricBases: [], clock };
  }
  const bases = f.metricsEndpoints ?? (f.gatewayAdmin ? await gatewayReplicas(f.gatewayAdmin) : urls);
  return { metricBases: bases, clock: decideClock(f.timeScale, await probeMetrics(bases.map(metricsUrl))) };
}

/**
 * Every target must answer GET /v1/models before the run; --model must be one it lists (when it
 * lists any), and without --model the first target's first model is used.
 */
async function checkModel(urls: string[], model: string | undefined): Promise<string> {
  const lists = await Promise.all(urls.map((u) => listModels(u)));
  if (model === undefined) return pickModel(urls[0], lists[0]);
  for (const [i, list] of lists.entries())
    if ("ids" in list && list.ids.length && !list.ids.includes(model))
      throw new BenchSetupError(
        `--model ${model}: ${urls[i]} serves ${list.ids.join(", ")}; pass one of those (or drop --model)`,
      );
  return model;
}

export interface Prepared {
  spec: WorkloadSpec;
  workload: Workload;
  urls: string[];
  model: string;
  extraBody?: Record<string, unknown>;
  /** Base URLs whose /metrics the driver scrapes ([] with --no-metrics). */
  metricBases: string[];
  clock: Clock;
}

/** Checks the flags and the setup; null after --dry-run (nothing to run). Throws with what to fix. */
export async function prepareBench(f: Flags): Promise<Prepared | null> {
  const { spec, workload } = loadWorkload(f);
  for (const note of workload.notes ?? []) console.error(`note: ${note}`);
  if (f.writeTrace) {
    try {
      writeFileSync(f.writeTrace, traceToJsonl(workloadToTrace(workload)));
    } catch (e) {
      throw new BenchSetupError(
        `--write-trace ${f.writeTrace}: cannot write (${(e as Error).message}); choose another path`,
      );
    }
    console.error(`wrote ${workload.requests.length} trace records to ${f.writeTrace}`);
  }
  if (f.dryRun) {
    const tokens = workload.requests.reduce((a, r) => a + r.promptTokensApprox, 0);
    console.log(
      `${spec.workload}: ${workload.requests.length} requests, ${workload.stages.length} stages, ` +
        `~${tokens} prompt tokens, seed ${spec.seed}`,
    );
    return null;
  }
  const urls = checkFlags(f);
  const extraBody = parseExtraBody(f.extraBody);
  if (f.json) checkResultsTarget(f.json, false, false);
  const model = await checkModel(urls, f.model);
  const { metricBases, clock } = await settleClock(f, urls);
  if (f.json) checkResultsTarget(f.json, !!f.append, clock.simulated);
  return { spec, workload, urls, model, extraBody, metricBases, clock };
}
