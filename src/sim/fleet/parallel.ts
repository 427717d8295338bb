/**
 * Runs a scenario's routers in worker threads, several at once: each worker loads the scenario file
 * again, generates the (deterministic) workload once, and runs the routers it is handed, so results
 * equal a sequential run. One job also asks its worker for the workload's spec and limits, so the
 * calling thread never builds the workload: at 512 replicas that is 1.4 GB of prompt text per copy.
 * It is the second job handed out, the first of the second worker, so the limits (6 s of engine
 * runs for the even shares on shared-prefix-73) are not added to the costliest router's time.
 * A router's CPU time is its worker thread's (thread-cpu.ts).
 */
import { resolve } from "node:path";
import { Worker } from "node:worker_threads";
import type { Limits } from "./limits.ts";
import { type Scenario, ScenarioError } from "./scenario.ts";
import type { RouterOutcome, SimulateOptions } from "./simulate.ts";

export interface WorkerRequest {
  file: string;
  router: string;
  quick: boolean;
  /** The scenario's seed replaced (kvgate simulate --seed). */
  seed?: number;
  /** The routers' seed set apart (kvgate simulate --router-seed). */
  routerSeed?: number;
  /** The fleet and its load multiplied (kvgate simulate --scale; 1: as written). */
  scale: number;
  /** Also send back the workload's spec and limits (computed before the router runs). */
  limits: boolean;
  /** Send back the run's per-request rows too. */
  records: boolean;
}

/** The workload's spec (as scaled under `quick`) and limits, from the worker that computed them. */
export interface WorkloadFacts {
  spec: Scenario["workload"];
  limits: Limits;
}

export type WorkerReply =
  | { ok: true; outcome: RouterOutcome; facts?: WorkloadFacts }
  | { ok: false; message: string; name: string };

/** Runs `routers` on `jobs` workers; outcomes come back in the routers' order, with the workload's facts. */
export async function runRoutersInWorkers(
  sc: Scenario,
  routers: Scenario["routers"],
  o: SimulateOptions & { quick: boolean; jobs: number },
): Promise<{ outcomes: RouterOutcome[]; facts: WorkloadFacts }> {
  if (sc.origin === "(inline)") throw new Error("parallel simulation needs a scenario loaded from a file");
  const file = resolve(sc.origin);
  const workerUrl = new URL("./router-worker-boot.mjs", import.meta.url);
  const outcomes: RouterOutcome[] = new Array(routers.length);
  // Longest first (each idle worker takes the costliest router left), so the workers finish close
  // together. Outcomes keep the scenario's order.
  const order = routers
    .map((_, k) => k)
    .sort((a, b) => routerCost(routers[b]) - routerCost(routers[a]) || a - b);
  let next = 0;
  const limitsJob = Math.min(1, routers.length - 1);
  let facts: WorkloadFacts | undefined;
  const runWorker = async (): Promise<void> => {
    const w = new Worker(workerUrl, { resourceLimits: { maxYoungGenerationSizeMb: YOUNG_GENERATION_MB } });
    try {
      while (next < routers.length) {
        const withLimits = next === limitsJob;
        const k = order[next++];
        const r = routers[k];
        o.onRouterStart?.(r.name, k, routers.length);
        const reply = await new Promise<WorkerReply>((res, rej) => {
          const onError = (e: Error) => rej(e);
          w.once("error", onError);
          w.once("message", (m: WorkerReply) => {
            w.off("error", onError);
            res(m);
          });
          w.postMessage({
            file,
            router: r.name,
            quick: o.quick,
            seed: o.seed,
            routerSeed: o.routerSeed,
            scale: sc.scale ?? 1,
            limits: withLimits,
            records: o.records === true,
          } satisfies WorkerRequest);
        });
        if (!reply.ok)
          throw reply.name === "ScenarioError" ? new ScenarioError(reply.message) : new Error(reply.message);
        if (reply.facts !== undefined) facts = reply.facts;
        outcomes[k] = reply.outcome;
        o.onRouterDone?.(reply.outcome);
      }
    } finally {
      await w.terminate();
    }
  };
  await Promise.all(Array.from({ length: Math.min(o.jobs, routers.length) }, runWorker));
  if (facts === undefined) throw new Error("parallel simulation: no worker sent the workload's limits");
  // Every run on the scenario's fleet gets the one limits object (a worker sends its own copy, or
  // none), so no such run reads as having a fleet of its own; a run with its own pools keeps its own.
  for (const [k, out] of outcomes.entries())
    if (routers[k].pools === sc.pools || out.run.limits == null) out.run.limits = facts.limits;
  return { outcomes, facts };
}

/**
 * The workers' young generation, MB (V8 splits it into two semi-spaces and a large-object space: 64 MB
 * semi-spaces here, against Node 20's 16). When an engine step still allocated an output per running
 * sequence, at the default size the scavenges took 14–20% of a worker's CPU on shared-prefix-73; at
 * this size 11–13% (CPU profiles, two interleaved pairs), for ~0.2 GB more peak memory. Now that it
 * lists only first and finishing tokens, a main-thread run of one router still spends 1.6 s on
 * scavenges at 16 MB and 0.85 s at 64 MB (`--trace-gc`, the default router, session 37).
 */
const YOUNG_GENERATION_MB = 192;

/**
 * A router's relative simulation cost, for longest-first ordering: routers fed by KV events cost the
 * most (the engines record every block event and the index applies it; ~1.5× a baseline on
 * shared-prefix-73), then those keeping an approximate prefix index (~1.1×), then the rest.
 */
export function routerCost(r: Scenario["routers"][number]): number {
  if (r.configText.includes("precise-prefix-cache-producer")) return 3;
  if (r.configText.includes("approx-prefix-cache-producer") || r.configText.includes("prefix-cache-scorer"))
    return 2;
  return 1;
}
