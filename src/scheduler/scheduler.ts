/**
 * The scheduler: builds plugin instances from an EffectiveConfig and, per request, runs the data
 * producers once, then the profiles the profile handler picks (filters → weighted scorers →
 * picker; llm-d/llm-d-router@ebab6879 pkg/epp/scheduling/scheduler_profile.go), and reports targets, failover
 * order and,
 * on request, a per-candidate explanation. Hooks after the pick feed the stateful plugins.
 */
import { IndexCache } from "./candidate-index.ts";
import type { LoadedConfig } from "./config.ts";
import { loadConfig } from "./config.ts";
import { Cycle } from "./cycle.ts";
import type { EffectiveConfig } from "./defaults.ts";
import { ConfigError } from "./errors.ts";
import type { Hasher } from "./hash.ts";
import { createXxHasher } from "./hash.ts";
import type { PluginHandle } from "./plugin-spec.ts";
import { ProfileRun } from "./profile-run.ts";
import type { PluginRegistry } from "./registry.ts";
import { builtinRegistry } from "./registry.ts";
import type { Mulberry32 } from "./rng.ts";
import { createRng } from "./rng.ts";
import type {
  Admitter,
  DataProducer,
  EndpointState,
  Explanation,
  Filter,
  Picker,
  Plugin,
  PluginStats,
  PreRequestHook,
  ProfileHandler,
  ProfileResult,
  RequestFacts,
  ResponseHooks,
  ResponseInfo,
  ScheduleFailure,
  ScheduleOptions,
  ScheduleResult,
  Scorer,
} from "./types.ts";
import {
  isAdmitter,
  isFilter,
  isPicker,
  isPreRequest,
  isProducer,
  isProfileHandler,
  isResponseHooks,
  isScorer,
} from "./types.ts";

export interface SchedulerOptions {
  /** Needed when the config hashes prompts (prefix plugins); see createXxHasher(). */
  hasher: Hasher | null;
  /** Seed of the scheduler's RNG (tie-breaks, random pickers, exploration). Default 0. */
  seed?: number;
  registry?: PluginRegistry;
}

export interface CompiledProfile {
  readonly name: string;
  readonly filters: readonly Filter[];
  readonly scorers: readonly { scorer: Scorer; weight: number }[];
  readonly picker: Picker;
}

export class Scheduler {
  readonly config: EffectiveConfig;
  readonly plugins: ReadonlyMap<string, Plugin>;
  readonly profiles: ReadonlyMap<string, CompiledProfile>;
  readonly #rng: Mulberry32;
  readonly #producers: DataProducer[];
  readonly #preRequest: PreRequestHook[];
  readonly #response: ResponseHooks[];
  readonly #admitters: Admitter[];
  readonly #explainers: Plugin[];
  readonly #handler: ProfileHandler;
  /** A plugin wants the output tokens of each response (onResponseComplete's ResponseInfo). */
  readonly wantsResponseUsage: boolean;
  readonly #indexes = new IndexCache();
  readonly #refreshers: Plugin[];
  /**
   * How often refresh() should run (seconds): the shortest period a plugin asks for; null when no
   * plugin measures between requests (then nobody needs to call it).
   */
  readonly refreshIntervalS: number | null;

  constructor(config: EffectiveConfig, opts: SchedulerOptions) {
    this.config = config;
    this.#rng = createRng(opts.seed ?? 0);
    const registry = opts.registry ?? builtinRegistry();
    const plugins = new Map<string, Plugin>();
    const handle: PluginHandle = { hasher: opts.hasher, plugin: (n) => plugins.get(n) };
    for (const p of config.plugins) {
      if (p.kind === "ignored") continue;
      const spec = registry.get(p.type);
      if (spec === undefined) throw new ConfigError(`plugin "${p.name}": unknown type ${p.type}`);
      const parsed = spec.params.safeParse(p.parameters);
      if (!parsed.success)
        throw new ConfigError(`plugin "${p.name}" (type ${p.type}): ${parsed.error.message}`);
      plugins.set(p.name, spec.factory(p.name, parsed.data, handle));
    }
    this.plugins = plugins;
    const all = [...plugins.values()];
    this.#producers = orderProducers(all.filter(isProducer));
    checkDependencies(all, this.#producers);
    this.#preRequest = all.filter(isPreRequest);
    this.#response = all.filter(isResponseHooks);
    this.#admitters = all.filter(isAdmitter);
    this.#explainers = all.filter((p) => typeof p.explain === "function");
    this.wantsResponseUsage = this.#response.some((h) => h.wantsResponseUsage === true);
    this.#refreshers = all.filter((p) => typeof p.refresh === "function" && (p.refreshIntervalS ?? 0) > 0);
    this.refreshIntervalS =
      this.#refreshers.length === 0
        ? null
        : Math.min(...this.#refreshers.map((p) => p.refreshIntervalS as number));
    const handler = plugins.get(config.profileHandler);
    if (handler === undefined || !isProfileHandler(handler)) {
      throw new ConfigError(`profile handler "${config.profileHandler}" is not a profile-handler plugin`);
    }
    this.#handler = handler;
    this.profiles = new Map(config.schedulingProfiles.map((p) => [p.name, compileProfile(p, plugins)]));
  }

  /**
   * Picks an endpoint for `req` among `candidates` at time `now` (seconds). Never throws for an
   * empty or fully filtered set: the result carries no target and a failure (503 / 429).
   */
  schedule(
    req: RequestFacts,
    candidates: readonly EndpointState[],
    now: number,
    opts: ScheduleOptions = {},
  ): ScheduleResult {
    const explain = opts.explain === true;
    // An explanation draws from a copy of the RNG: it shows the pick the next identical request
    // would get, and leaves the scheduler's own sequence (and so later picks) unchanged.
    const rng = explain ? this.#rng.clone() : this.#rng;
    const cycle = new Cycle(req, candidates, now, rng, this.#indexes);
    for (const p of this.#producers) p.produce(cycle, candidates);
    for (const a of this.#admitters) {
      const why = candidates.length > 0 ? a.admit(cycle, candidates) : null;
      if (why !== null) return this.#denied(req, cycle, a, why, explain);
    }
    const run: ProfileRun[] = [];
    for (let round = 0; round <= this.profiles.size; round++) {
      const names = this.#handler.pickProfiles(cycle, this.profiles);
      if (names.length === 0) break;
      for (const name of names) {
        const profile = this.profiles.get(name);
        if (profile === undefined || cycle.profileResults.has(name)) {
          throw new Error(
            `profile handler "${this.#handler.typedName.name}" picked "${name}" twice or unknown`,
          );
        }
        const r = new ProfileRun(profile, cycle, candidates, explain);
        run.push(r);
        cycle.profileResults.set(name, r);
      }
    }
    const primaryProfile = this.#handler.primaryProfile(cycle);
    const primary = cycle.profileResults.get(primaryProfile) ?? null;
    const profiles: Record<string, ProfileResult> = {};
    for (const r of run) profiles[r.name] = r;
    const outcome = this.#handler.outcome?.(cycle);
    let failure: ScheduleFailure | null = null;
    if (candidates.length === 0) {
      failure = { status: 503, reason: "rejected-no-endpoints", message: "no candidate endpoints" };
    } else if (primary?.target == null) {
      const why = primary?.failure ?? `profile "${primaryProfile}" did not run`;
      failure = { status: 429, reason: "rejected-saturated", message: why };
    }
    let explanation: Explanation | undefined;
    if (explain) {
      explanation = {
        requestId: req.requestId,
        profilesRun: run.map((r) => r.name),
        primaryProfile,
        profiles: {},
      };
      if (outcome)
        explanation.decision = {
          decision: outcome.decision,
          reason: outcome.reason,
          prefillTarget: outcome.prefillTarget?.id ?? null,
        };
      for (const r of run) explanation.profiles[r.name] = r.explain();
      this.#explainPlugins(cycle, explanation);
    }
    return {
      requestId: req.requestId,
      primaryProfile,
      profiles,
      target: primary?.target ?? null,
      failure,
      outcome,
      explanation,
      cycle,
    };
  }

  /** An admitter refused the request: no profile runs (llm-d's director answers 500). */
  #denied(req: RequestFacts, cycle: Cycle, a: Admitter, why: string, explain: boolean): ScheduleResult {
    const message = `request cannot be admitted: ${why}`;
    let explanation: Explanation | undefined;
    if (explain) {
      explanation = {
        requestId: req.requestId,
        profilesRun: [],
        primaryProfile: this.#handler.primaryProfile(cycle),
        denied: { admitter: a.typedName.name, reason: why },
        profiles: {},
      };
      this.#explainPlugins(cycle, explanation);
    }
    return {
      requestId: req.requestId,
      primaryProfile: explanation?.primaryProfile ?? "",
      profiles: {},
      target: null,
      failure: { status: 500, reason: null, message },
      explanation,
      cycle,
    };
  }

  #explainPlugins(cycle: Cycle, explanation: Explanation): void {
    for (const p of this.#explainers) {
      const e = p.explain?.(cycle);
      if (e === undefined) continue;
      explanation.plugins ??= {};
      explanation.plugins[p.typedName.name] = e;
    }
  }

  /** After the gateway commits to `result`: the prefix index learns, in-flight load is counted. */
  onPicked(req: RequestFacts, result: ScheduleResult, now: number): void {
    if (result.target === null || result.requestId !== req.requestId) return;
    for (const h of this.#preRequest) h.preRequest(result.cycle, result, now);
  }

  /** First response chunk from `endpointId` (the endpoint that served, after any failover). */
  onResponseStarted(req: RequestFacts, endpointId: string, now: number): void {
    for (const h of this.#response) h.onResponseStarted?.(req, endpointId, now);
  }

  /** Response finished, failed or was aborted; call exactly once per onPicked request. */
  onResponseComplete(req: RequestFacts, endpointId: string, now: number, info?: ResponseInfo): void {
    for (const h of this.#response) h.onResponseComplete?.(req, endpointId, now, info);
  }

  /**
   * Between requests, at time `now`: plugins take the measurements requests would otherwise take
   * (see Plugin.refresh). Call every refreshIntervalS; calling more or less often is safe.
   */
  refresh(now: number): void {
    for (const p of this.#refreshers) p.refresh?.(now);
  }

  /** Forgets per-endpoint state (index entries, counters, bindings) of endpoints not in `pool`. */
  retainEndpoints(pool: Iterable<string>): void {
    const keep = new Set(pool);
    for (const p of this.plugins.values()) p.retainEndpoints?.(keep);
  }

  /** Per plugin name, what that plugin knows of one endpoint (in-flight load, learned rates). */
  endpointViews(endpointId: string): Record<string, Record<string, unknown>> {
    const out: Record<string, Record<string, unknown>> = {};
    for (const [name, p] of this.plugins) if (p.endpointView) out[name] = p.endpointView(endpointId);
    return out;
  }

  /** Counters by plugin name, for metrics (e.g. prefix indexSize and hitRatio). */
  stats(): Record<string, PluginStats> {
    const out: Record<string, PluginStats> = {};
    for (const [name, p] of this.plugins) if (p.stats) out[name] = p.stats();
    return out;
  }
}

/** Loads `configText`, creates the xxhash64 hasher, and builds a scheduler. */
export async function createScheduler(
  configText: string,
  opts: { seed?: number; hasher?: Hasher; registry?: PluginRegistry } = {},
): Promise<{ scheduler: Scheduler } & LoadedConfig> {
  const registry = opts.registry ?? builtinRegistry();
  const loaded = loadConfig(configText, registry);
  const hasher = opts.hasher ?? (await createXxHasher());
  const scheduler = new Scheduler(loaded.config, { hasher, seed: opts.seed, registry });
  return { scheduler, ...loaded };
}

function compileProfile(
  p: EffectiveConfig["schedulingProfiles"][number],
  plugins: Map<string, Plugin>,
): CompiledProfile {
  const filters: Filter[] = [];
  const scorers: { scorer: Scorer; weight: number }[] = [];
  let picker: Picker | null = null;
  for (const ref of p.plugins) {
    const pl = plugins.get(ref.pluginRef);
    if (pl === undefined) throw new ConfigError(`profile "${p.name}": no plugin "${ref.pluginRef}"`);
    if (isPicker(pl)) picker = pl;
    else if (isScorer(pl)) scorers.push({ scorer: pl, weight: ref.weight ?? 1 });
    else if (isFilter(pl)) filters.push(pl);
    else
      throw new ConfigError(
        `profile "${p.name}": plugin "${ref.pluginRef}" is not a filter, scorer or picker`,
      );
  }
  if (picker === null) throw new ConfigError(`profile "${p.name}" has no picker`);
  return { name: p.name, filters, scorers, picker };
}

/** Orders producers so that each runs after the producers whose data it consumes. */
function orderProducers(producers: DataProducer[]): DataProducer[] {
  const byKey = new Map<string, DataProducer>();
  for (const p of producers) for (const k of p.produces?.() ?? []) byKey.set(k.name, p);
  const out: DataProducer[] = [];
  const state = new Map<DataProducer, "visiting" | "done">();
  const visit = (p: DataProducer): void => {
    const s = state.get(p);
    if (s === "done") return;
    if (s === "visiting")
      throw new ConfigError(`data producers depend on each other in a cycle (at "${p.typedName.name}")`);
    state.set(p, "visiting");
    const c = p.consumes?.();
    for (const k of [...(c?.required ?? []), ...(c?.optional ?? [])]) {
      const dep = byKey.get(k.name);
      if (dep !== undefined && dep !== p) visit(dep);
    }
    state.set(p, "done");
    out.push(p);
  };
  for (const p of producers) visit(p);
  return out;
}

function checkDependencies(plugins: Plugin[], producers: DataProducer[]): void {
  const produced = new Set<string>();
  for (const p of producers) for (const k of p.produces?.() ?? []) produced.add(k.name);
  for (const p of plugins) {
    for (const k of p.consumes?.().required ?? []) {
      if (!produced.has(k.name)) {
        throw new ConfigError(
          `plugin "${p.typedName.name}" (type ${p.typedName.type}) needs "${k.name}", which no plugin produces`,
        );
      }
    }
  }
}
