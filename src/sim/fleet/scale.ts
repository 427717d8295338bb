/**
 * `kvgate simulate --scale F`: the same traffic shape on a fleet F times the size. Every pool's
 * replicas, the arrival rates (or closed-loop users) and request counts are multiplied by F, and so
 * are the workload's pools of shared content, which a shape spreads over its replicas: prefix groups
 * (shared-prefix numGroups), documents (mixed-length documentPool) and shared system prompts
 * (multi-turn sharedSystemPrompts). A pool of one stays one, because one prompt everyone shares is
 * the shape itself (one-system-prompt, popular-prompt's popular stream). Per-replica figures (KV,
 * slots, the engine) and lengths are unchanged, so each replica sees the load it saw before. Router
 * configs are read as written: an absolute figure in one (a flow-control queue's capacity, say)
 * stays what it was. Not for regions (each region's replicas and traffic are its own) or traces.
 */

import type { ArrivalSpec } from "../../bench/workloads/arrivals.ts";
import { type MixOptions, streamSpec } from "../../bench/workloads/mix.ts";
import { mixStreams, type WorkloadSpec } from "../../bench/workloads/spec.ts";
import type { FleetConfig } from "./replica.ts";
import { type Scenario, ScenarioError } from "./scenario.ts";

/** Workload options holding a pool of shared content, per workload. */
const POOLS: Record<string, readonly string[]> = {
  "shared-prefix": ["numGroups"],
  "mixed-length": ["documentPool"],
  "multi-turn": ["sharedSystemPrompts"],
};

/** n × f, a whole count of at least one (a count of zero stays zero). */
const count = (n: number, f: number) => (n === 0 ? 0 : Math.max(1, Math.round(n * f)));

function scaleArrival(a: ArrivalSpec, f: number): ArrivalSpec {
  switch (a.type) {
    case "closed":
      return { ...a, users: count(a.users, f) };
    case "stages":
      return { ...a, stages: a.stages.map((s) => ({ ...s, rate: s.rate * f })) };
    default:
      return { ...a, rate: a.rate * f };
  }
}

function scaleOptions(workload: string, options: Record<string, unknown>, f: number) {
  const out = { ...options };
  for (const k of POOLS[workload] ?? []) {
    const n = out[k];
    if (typeof n === "number" && n > 1) out[k] = count(n, f);
  }
  return out;
}

function scaleSpec(spec: WorkloadSpec, f: number, where: string): WorkloadSpec {
  if (spec.workload === "trace")
    throw new ScenarioError(
      `${where}: --scale needs a generated workload; a trace replays its own arrivals (drop --scale, or scale the trace itself)`,
    );
  let options = scaleOptions(spec.workload, spec.options, f);
  if (spec.workload === "mix") {
    // Each stream resolved as the mix resolves it (its seed and defaults filled), then scaled, beside its tags.
    const mix = spec.options as MixOptions;
    const own = mixStreams(mix, spec.seed);
    const streams = mix.streams.map((s, i) => {
      const input = streamSpec(s);
      const tags = Object.fromEntries(Object.entries(s).filter(([k]) => !(k in input)));
      return { ...tags, ...scaleSpec(own[i], f, where) };
    });
    options = { ...options, streams };
  }
  return {
    ...spec,
    ...(spec.numRequests !== undefined ? { numRequests: count(spec.numRequests, f) } : {}),
    arrival: scaleArrival(spec.arrival, f),
    options,
  };
}

function scalePools(pools: FleetConfig[], f: number, where: string): FleetConfig[] {
  return pools.map((p, i) => {
    const n = p.replicas * f;
    if (!Number.isInteger(n) || n < 1)
      throw new ScenarioError(
        `${where}: --scale ${f} gives ${n} replicas in pool ${i + 1} (${p.replicas}); pick a factor that leaves a whole number of replicas in every pool`,
      );
    return { ...p, replicas: n };
  });
}

/** The scenario with its fleet and load multiplied by `f` (> 0). Throws ScenarioError where it cannot. */
export function scaleScenario(sc: Scenario, f: number): Scenario {
  const where = `scenario ${sc.origin}`;
  if (!Number.isFinite(f) || f <= 0)
    throw new ScenarioError(`${where}: --scale must be a number above 0, got ${f}`);
  if (f === 1) return sc;
  if (sc.locality !== undefined)
    throw new ScenarioError(
      `${where}: --scale does not scale regions yet (each region's replicas and traffic are its own); drop --scale`,
    );
  const pools = scalePools(sc.pools, f, where);
  return {
    ...sc,
    scale: (sc.scale ?? 1) * f,
    fleet: pools[0],
    pools,
    routers: sc.routers.map((r) => ({
      ...r,
      pools: r.pools === sc.pools ? pools : scalePools(r.pools, f, `${where}, router ${r.name}`),
    })),
    workload: scaleSpec(sc.workload, f, where),
  };
}
