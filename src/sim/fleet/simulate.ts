/**
 * Runs a scenario: generates its workload once, then for each router builds a fresh fleet and a
 * fresh scheduler from the router's EndpointPickerConfig, runs the event loop and turns the
 * records into a results-file run with the bench's own aggregation (buildRun), alongside the
 * workload's theoretical limits. Everything in the results is a function of the scenario and its
 * seeds except the wall-clock fields, `created` and `wall_clock`, kept apart (stripWallClock).
 */
import { type Breakdown, breakdown } from "../../bench/breakdown.ts";
import { type RequestRow, requestRows } from "../../bench/request-rows.ts";
import type { RunResult } from "../../bench/results.ts";
import { buildRun } from "../../bench/run.ts";
import { KVGATE_VERSION } from "../../bench/version.ts";
import { generateWorkload } from "../../bench/workloads/spec.ts";
import type { Workload } from "../../bench/workloads/types.ts";
import { Admission, admissionFromConfig } from "../../flow/admission.ts";
import { printConfig } from "../../scheduler/defaults.ts";
import { ROLE_LABEL } from "../../scheduler/plugins/filters/labels.ts";
import type { PrecisePrefixProducer } from "../../scheduler/plugins/precise-prefix-cache-producer.ts";
import { createScheduler, type Scheduler } from "../../scheduler/scheduler.ts";
import { type FleetRunOptions, preciseProducers, runFleet } from "./fleet.ts";
import { FlowSim } from "./flow.ts";
import { computeLimits, type Limits } from "./limits.ts";
import { type LocalityConfig, type OriginRow, originRows, originWorkload } from "./locality.ts";
import { PromptTokenizer } from "./prompt-tokens.ts";
import { type FleetConfig, replicaId } from "./replica.ts";
import { type RouterSpec, type Scenario, ScenarioError } from "./scenario.ts";
import { threadCpuSeconds } from "./thread-cpu.ts";

export interface SimulateOptions {
  /** Run only these routers (by scenario name), in the scenario's order. */
  routers?: string[];
  /** Scale the workload down to a tenth (at least 20 requests, 2 per closed-loop user) for a smoke run. */
  quick?: boolean;
  /** The seed the scenario was loaded with (loadScenario's override), for workers that load it again. */
  seed?: number;
  /** The routers' seed it was loaded with (loadScenario's override), likewise. */
  routerSeed?: number;
  onRouterStart?(name: string, index: number, total: number): void;
  onRouterDone?(outcome: RouterOutcome): void;
  /**
   * Routers run at once, each in a worker thread (default 1: in this thread, unless `workers`).
   * Results are identical either way: every router gets its own fleet, scheduler and seeds. Needs a
   * scenario loaded from a file, which each worker loads again.
   */
  jobs?: number;
  /**
   * Run in worker threads even when one job is asked for (`kvgate simulate` does): their young
   * generation is sized for the engines (parallel.ts), so one router alone runs faster there than in
   * a thread with Node's default. Needs a scenario loaded from a file.
   */
  workers?: boolean;
  /** Keep each router's per-request rows on its outcome (`kvgate simulate --records`). */
  records?: boolean;
}

/** A results-file run with the simulator's additions. */
export type SimRun = RunResult & {
  limits: Limits;
  simulation: Record<string, unknown>;
  router_config: { source: string; effective: string };
  /**
   * Σ cached_tokens ÷ Σ prompt tokens of the completed requests: hits from every KV tier (GPU, and
   * CPU when the fleet offloads), where prefix_cache_hit_rate is vllm:prefix_cache_hits (GPU only).
   */
  cached_token_rate: number | null;
  /** Per tenant, priority and stream, when the workload's requests are tagged (a mix). */
  breakdown?: Breakdown;
  /** Per region of origin, when the scenario has a locality section. */
  locality?: OriginRow[];
};

export interface RouterOutcome {
  run: SimRun;
  wallSeconds: number;
  /** CPU seconds of the thread that ran the router (NaN where the OS does not say). */
  cpuSeconds: number;
  /** One row per request, when the options asked for records. */
  rows?: RequestRow[];
}

export interface SimResults {
  kvgate_version: string;
  created: string;
  simulated: true;
  time_unit: "simulated_seconds";
  scenario: Record<string, unknown>;
  limits: Limits;
  runs: SimRun[];
  wall_clock: {
    created: string;
    total_s: number;
    /** Peak resident memory of the whole process (every worker thread included), MiB. */
    peak_rss_mib: number;
    routers: { router: string; wall_s: number; cpu_s: number }[];
  };
}

/** The workload a scenario runs (scaled down under `quick`). */
export function scenarioWorkload(
  sc: Scenario,
  quick = false,
): { spec: Scenario["workload"]; workload: Workload } {
  let spec = sc.workload;
  if (sc.locality !== undefined) return { spec, workload: regionalWorkload(sc, sc.locality, quick) };
  let workload = generateWorkload(spec, { traceText: sc.traceText });
  if (quick) {
    const n = workload.requests.length;
    // Closed-loop users keep at least two requests each, so they still revisit their prefixes.
    const users = spec.arrival.type === "closed" ? 2 * spec.arrival.users : 0;
    spec = { ...spec, numRequests: Math.min(n, Math.max(20, users, Math.ceil(n / 10))) };
    workload = generateWorkload(spec, { traceText: sc.traceText });
  }
  return { spec, workload };
}

/** A regions scenario's merged workload; `quick` keeps a tenth of each region's requests (at least 20). */
function regionalWorkload(sc: Scenario, loc: LocalityConfig, quick: boolean): Workload {
  const full = originWorkload(sc.workload, loc, sc.traceText);
  if (!quick) return full;
  const origins = loc.origins.map((o) => {
    const n = full.requests.filter((r) => r.origin === o.region).length;
    return { ...o, numRequests: Math.min(n, Math.max(20, Math.ceil(n / 10))) };
  });
  return originWorkload(sc.workload, { ...loc, origins }, sc.traceText);
}

export async function simulate(sc: Scenario, opts: SimulateOptions = {}): Promise<SimResults> {
  const t0 = performance.now();
  const routers = opts.routers === undefined ? sc.routers : pickRouters(sc, opts.routers);
  let outcomes: RouterOutcome[] = [];
  const jobs = Math.max(1, Math.min(opts.jobs ?? 1, routers.length));
  let spec: Scenario["workload"];
  let limits: Limits;
  if (jobs > 1 || opts.workers === true) {
    // The workers build the workload; one of them computes its limits too.
    const { runRoutersInWorkers } = await import("./parallel.ts");
    const res = await runRoutersInWorkers(sc, routers, { quick: opts.quick === true, jobs, ...opts });
    ({ outcomes } = res);
    ({ spec, limits } = res.facts);
  } else {
    const built = scenarioWorkload(sc, opts.quick);
    spec = built.spec;
    const { workload } = built;
    const tokenizer = new PromptTokenizer();
    limits = computeLimits(workload, limitsFleet(sc), tokenizer);
    for (const [k, r] of routers.entries()) {
      opts.onRouterStart?.(r.name, k, routers.length);
      const outcome = await runRouter(sc, r, { spec, workload, tokenizer, limits, records: opts.records });
      outcomes.push(outcome);
      opts.onRouterDone?.(outcome);
    }
  }
  const created = new Date().toISOString();
  return {
    kvgate_version: KVGATE_VERSION,
    created,
    simulated: true,
    time_unit: "simulated_seconds",
    scenario: {
      name: sc.name,
      description: sc.description,
      file: sc.origin,
      seed: sc.seed,
      ...(sc.routerSeed !== undefined ? { router_seed: sc.routerSeed } : {}),
      quick: opts.quick === true,
      ...(sc.scale !== undefined ? { scale: sc.scale } : {}),
      fleet: {
        replicas: sc.fleet.replicas,
        profile: sc.fleet.profile.name,
        model: sc.fleet.model,
        kv_tokens: sc.kvTokens,
        num_gpu_blocks: sc.fleet.numGpuBlocks,
        block_size: sc.fleet.blockSize,
        max_num_seqs: sc.fleet.maxNumSeqs,
        max_num_batched_tokens: sc.fleet.maxNumBatchedTokens,
        max_model_len: sc.fleet.maxModelLen,
        block_hash: sc.fleet.blockHashAlgo,
        kv_events: sc.fleet.enableKvCacheEvents,
        ...(sc.pools.length > 1 ? { pools: poolSummary(sc.pools) } : {}),
      },
      ...(sc.slo !== undefined ? { slo: sc.slo } : {}),
      scrape_interval_s: sc.scrapeInterval,
      gateway_delay_s: sc.gatewayDelay,
      router_tokenizer: sc.routerTokenizer,
      kv_events_delay_s: sc.kvEventsDelay,
      workload: spec,
    },
    limits,
    runs: outcomes.map((o) => o.run),
    wall_clock: {
      created,
      total_s: (performance.now() - t0) / 1000,
      // maxRSS is in KiB.
      peak_rss_mib: process.resourceUsage().maxRSS / 1024,
      routers: outcomes.map((o) => ({ router: o.run.router, wall_s: o.wallSeconds, cpu_s: o.cpuSeconds })),
    },
  };
}

/**
 * What every router of one scenario run shares: the workload, its tokenization and its limits
 * (null in a worker thread: the main thread computes them once and fills them in).
 */
export interface RouterContext {
  spec: Scenario["workload"];
  workload: Workload;
  tokenizer: PromptTokenizer;
  limits: Limits | null;
  /** Keep the run's per-request rows on the outcome. */
  records?: boolean;
}

/** One router against a fresh fleet. Deterministic given the scenario and the context. */
export async function runRouter(
  sc: Scenario,
  r: Scenario["routers"][number],
  ctx: RouterContext,
): Promise<RouterOutcome> {
  const { spec, workload, tokenizer, limits } = ctx;
  const routerSeed = sc.routerSeed ?? sc.seed;
  const w0 = performance.now();
  const c0 = threadCpuSeconds();
  let created: Awaited<ReturnType<typeof createScheduler>>;
  const peers: Scheduler[] = [];
  try {
    created = await createScheduler(r.configText, { seed: routerSeed });
    // More gateway replicas: one scheduler each, seeded apart (gateways.ts).
    for (let k = 1; k < (r.gateways?.replicas ?? 1); k++)
      peers.push((await createScheduler(r.configText, { seed: routerSeed + k })).scheduler);
  } catch (err) {
    throw new ScenarioError(
      `scenario ${sc.origin}: router "${r.name}" (${r.source}): ${(err as Error).message}`,
    );
  }
  const precise = preciseProducers(created.scheduler);
  for (const p of precise)
    if (p.blockSizeTokens !== r.pools[0].blockSize)
      throw new ScenarioError(
        `scenario ${sc.origin}: router "${r.name}" (${r.source}): ${p.typedName.name}: blockSizeTokens ${p.blockSizeTokens} must equal the fleet's block size ${sc.fleet.blockSize}: the precise index keys engine blocks`,
      );
  const opts = scenarioFleetOptions(sc, r, created, workload, tokenizer);
  const { flow, objectives } = opts;
  const res = runFleet({
    ...opts,
    ...(r.gateways ? { gateways: { schedulers: [created.scheduler, ...peers], sync: r.gateways.sync } } : {}),
    ...(sc.locality !== undefined ? { locality: sc.locality } : {}),
  });
  const base = buildRun(
    spec,
    workload,
    { records: res.records, notSent: 0, stageStarts: res.stageStarts, fleet: res.fleet, started: "" },
    { router: r.name, timeScale: 1, ...(sc.slo !== undefined ? { slo: sc.slo } : {}) },
  );
  for (const st of base.stages) {
    let cached = 0;
    let prompt = 0;
    for (const rec of res.records)
      if (rec.stage === st.index && !rec.error && rec.cachedTokens !== undefined) {
        cached += rec.cachedTokens;
        prompt += rec.promptTokens;
      }
    (st as Record<string, unknown>).prefix_cache_hit_rate = prompt > 0 ? cached / prompt : null;
  }
  let cachedAll = 0;
  let promptAll = 0;
  for (const rec of res.records)
    if (!rec.error && rec.cachedTokens !== undefined) {
      cachedAll += rec.cachedTokens;
      promptAll += rec.promptTokens;
    }
  const split = breakdown(res.records, workload.requests, objectives);
  const regions = sc.locality === undefined ? undefined : regionsById(r.pools, sc.locality.label);
  const run: SimRun = {
    ...base,
    ...(split !== null ? { breakdown: split } : {}),
    ...(regions !== undefined
      ? { locality: originRows(res.records, workload.requests, (id) => regions.get(id), sc.slo) }
      : {}),
    router_config: { source: r.source, effective: printConfig(created.config) },
    cached_token_rate: promptAll > 0 ? cachedAll / promptAll : null,
    simulation: {
      seed: sc.seed,
      ...(sc.routerSeed !== undefined ? { router_seed: sc.routerSeed } : {}),
      end_time_s: res.endTime,
      events: res.counters.events,
      steps: res.counters.steps,
      scrapes: res.counters.scrapes,
      prefill_tokens: res.counters.prefillTokens,
      decode_tokens: res.counters.decodeTokens,
      completed: res.counters.completed,
      dropped: res.counters.dropped,
      kv_events: sc.fleet.enableKvCacheEvents || precise.length > 0,
      ...(precise.length > 0
        ? {
            kv_event_batches: res.counters.kvEventBatches,
            precise_index: Object.fromEntries(precise.map((p) => [p.typedName.name, preciseStats(p)])),
          }
        : {}),
      config_warnings: created.warnings,
      ...(flow ? { flow_control: flow.summary() } : {}),
      pools: poolSummary(r.pools),
      gpus: gpuCount(r.pools),
      ...(res.pd !== undefined ? { pd: res.pd, kv_link: r.kvLink } : {}),
      ...(res.storage !== undefined ? { shared_storage: res.storage } : {}),
    },
    // A run with its own fleet is read against that fleet's limits (its tiers, its replicas).
    limits: r.pools === sc.pools ? (limits as Limits) : computeLimits(workload, r.pools[0], tokenizer),
  };
  return {
    run,
    wallSeconds: (performance.now() - w0) / 1000,
    cpuSeconds: threadCpuSeconds() - c0,
    ...(ctx.records === true ? { rows: requestRows(r.name, res.records) } : {}),
  };
}

/**
 * The fleet the limits describe: the first pool, together with every pool that differs from it only
 * in labels other than the role (one pool per region, say). A P/D fleet is described by its first
 * role's pools (the prefill side, as scenarios list them).
 */
export function limitsFleet(sc: Scenario): FleetConfig {
  const first = sc.pools[0];
  const shape = (p: FleetConfig) =>
    JSON.stringify({ ...p, replicas: 0, labels: { role: p.labels[ROLE_LABEL] }, profile: p.profile.name });
  const alike = sc.pools.filter((p) => shape(p) === shape(first));
  return alike.length === 1 ? first : { ...first, replicas: alike.reduce((n, p) => n + p.replicas, 0) };
}

/** Replica id → its `label` value, in runFleet's numbering (pool by pool). */
function regionsById(pools: readonly FleetConfig[], label: string): Map<string, string> {
  const out = new Map<string, string>();
  let i = 0;
  for (const p of pools) for (let k = 0; k < p.replicas; k++) out.set(replicaId(i++), p.labels[label]);
  return out;
}

/** The pools of a run's fleet, as the results file records them. */
export function poolSummary(pools: readonly FleetConfig[]): Record<string, unknown>[] {
  return pools.map((p) => ({
    replicas: p.replicas,
    profile: p.profile.name,
    tensor_parallel: p.profile.hardware.tensorParallel,
    role: p.labels[ROLE_LABEL] ?? null,
    kv_tokens: (p.numGpuBlocks - 1) * p.blockSize,
    max_num_seqs: p.maxNumSeqs,
    max_num_batched_tokens: p.maxNumBatchedTokens,
  }));
}

/** GPUs of a fleet: replicas × tensor parallelism, summed over pools. */
export function gpuCount(pools: readonly FleetConfig[]): number {
  return pools.reduce((n, p) => n + p.replicas * p.profile.hardware.tensorParallel, 0);
}

/** A precise producer's index counters and its routing hit ratio (blocks held by the picked endpoint). */
function preciseStats(p: PrecisePrefixProducer): Record<string, number> {
  const { bytes: _b, bytesPerEntry: _e, ...index } = p.index.stats();
  const s = p.stats();
  return {
    ...index,
    requests: s.requests as number,
    requests_without_tokens: s.requestsWithoutTokens as number,
    hit_blocks: s.hitBlocks as number,
    lookup_blocks: s.lookupBlocks as number,
    hit_ratio: s.hitRatio as number,
  };
}

function pickRouters(sc: Scenario, names: string[]): Scenario["routers"] {
  const known = new Set(sc.routers.map((r) => r.name));
  for (const n of names)
    if (!known.has(n))
      throw new ScenarioError(`unknown router "${n}"; the scenario has ${[...known].join(", ")}`);
  return sc.routers.filter((r) => names.includes(r.name));
}

/** The results without their wall-clock fields: equal for equal scenarios and seeds. */
export function stripWallClock(r: SimResults): Omit<SimResults, "created" | "wall_clock"> {
  const { created: _c, wall_clock: _w, ...rest } = r;
  return rest;
}

/**
 * The fleet-simulator run of one scenario router, as `kvgate simulate` runs it with one gateway and
 * no locality: the router's scheduler with its flow control or admission, the scenario's timings.
 * `kvgate simulate` adds its gateway peers and localities; benches that look inside a run
 * (ttft-anatomy, stage-anatomy) add an observer, and the demo's prediction runs it as it is.
 */
export function scenarioFleetOptions(
  sc: Scenario,
  r: RouterSpec,
  created: Awaited<ReturnType<typeof createScheduler>>,
  workload: Workload,
  tokenizer: PromptTokenizer,
  pools: FleetConfig[] = r.pools,
): FleetRunOptions {
  // With the flowControl gate, requests wait in flow control instead of legacy admission.
  const flow = FlowSim.of(created.scheduler);
  return {
    fleet: pools[0],
    pools,
    kvLink: r.kvLink,
    workload,
    scheduler: created.scheduler,
    admission: flow === null ? admissionFromConfig(created.config).admission : new Admission(),
    flow,
    objectives: new Map(Object.entries(created.config.objectives)),
    seed: sc.seed,
    scrapeInterval: sc.scrapeInterval,
    gatewayDelay: sc.gatewayDelay,
    routerTokenizer: sc.routerTokenizer,
    kvEventsDelay: sc.kvEventsDelay,
    tokenizer,
  };
}
