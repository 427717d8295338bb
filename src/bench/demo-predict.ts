/**
 * What `kvgate simulate` predicts for the demo's own fleet and workload: the fleet simulator run
 * in this process (virtual time, the real scheduler) on the same workload spec and seed, the same
 * replica count, profile and KV capacity, with the gateway's built-in routing config for kvgate
 * and round-robin for the baseline. Its runs are results-file runs built by the same aggregation
 * as the live ones, so every figure is defined the same way on both sides.
 */
import { fileURLToPath } from "node:url";
import { stringify as toYaml } from "yaml";
import { DEFAULT_EPP_CONFIG_PATH } from "../gateway/routing.ts";
import { createScheduler } from "../scheduler/scheduler.ts";
import { runFleet } from "../sim/fleet/fleet.ts";
import { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import { parseScenario } from "../sim/fleet/scenario.ts";
import { scenarioFleetOptions } from "../sim/fleet/simulate.ts";
import type { RequestRecord } from "./metrics.ts";
import type { RunResult } from "./results.ts";
import { buildRun } from "./run.ts";
import { streamRng } from "./workloads/sampling.ts";
import type { WorkloadSpec } from "./workloads/spec.ts";
import type { Workload } from "./workloads/types.ts";

export const ROUND_ROBIN_CONFIG_PATH = fileURLToPath(
  new URL("../../config/examples/round-robin.yaml", import.meta.url),
);

export interface PredictFleet {
  replicas: number;
  profile: string;
  /** vLLM's --num-gpu-blocks-override (blocks incl. the null block); default: the profile's. */
  numGpuBlocks?: number;
  maxModelLen: number;
  /** The gateway's metric scrape period, simulated seconds. */
  scrapeIntervalS: number;
  /** Simulated seconds from a request's send to its arrival at the replica (default 0). */
  gatewayDelayS?: number;
  /**
   * Simulated seconds by which each send may come late, drawn uniformly from [0, this) per request
   * (seeded; jitterSends). Default 0: every closed-loop send at the instant its answer ends.
   */
  sendJitterS?: number;
}

export interface Prediction {
  router: "round-robin" | "kvgate";
  run: RunResult;
  records: RequestRecord[];
  wallSeconds: number;
}

/**
 * `workload` with every send up to `jitterS` seconds later (uniform, from `seed`): a closed-loop
 * request's wait after its predecessor ends, else its arrival time. A live client sends the next
 * questions of users whose answers ended in the same engine step one after another, milliseconds
 * apart and in no fixed order; the simulator, exact, sends them at one instant in the same order
 * every turn, and round-robin then deals a user back to a replica it used before more often than
 * live (the demo: 26% hit rate simulated against 16–18% live). The input is not changed.
 */
export function jitterSends(workload: Workload, jitterS: number, seed: number): Workload {
  if (!(jitterS >= 0) || !Number.isFinite(jitterS))
    throw new RangeError(`send jitter must be ≥ 0 s, got ${jitterS}`);
  if (jitterS === 0) return workload;
  const rng = streamRng(seed, "demo-send-jitter");
  const requests = workload.requests.map((r) => {
    const late = rng.next() * jitterS;
    return r.after
      ? { ...r, arrivalTime: r.arrivalTime + late, after: { ...r.after, delay: r.after.delay + late } }
      : { ...r, arrivalTime: r.arrivalTime + late };
  });
  return { ...workload, requests };
}

/** Simulates both routers on `workload` (generated from `spec`), round-robin first. */
export async function predict(
  spec: WorkloadSpec,
  workload: Workload,
  fleet: PredictFleet,
): Promise<Prediction[]> {
  const sc = parseScenario(
    toYaml({
      name: "kvgate demo",
      seed: spec.seed,
      fleet: {
        replicas: fleet.replicas,
        profile: fleet.profile,
        maxModelLen: fleet.maxModelLen,
        ...(fleet.numGpuBlocks !== undefined ? { numGpuBlocks: fleet.numGpuBlocks } : {}),
      },
      routers: [
        { name: "round-robin", config: ROUND_ROBIN_CONFIG_PATH },
        { name: "kvgate", config: DEFAULT_EPP_CONFIG_PATH },
      ],
      workload: { ...spec },
      scrapeIntervalMs: fleet.scrapeIntervalS * 1000,
      gatewayDelayMs: (fleet.gatewayDelayS ?? 0) * 1000,
    }),
  );
  const sent = jitterSends(workload, fleet.sendJitterS ?? 0, spec.seed);
  const tokenizer = new PromptTokenizer();
  const out: Prediction[] = [];
  for (const r of sc.routers) {
    const t0 = performance.now();
    const created = await createScheduler(r.configText, { seed: sc.seed });
    const res = runFleet(scenarioFleetOptions(sc, r, created, sent, tokenizer));
    const run = buildRun(
      spec,
      sent,
      { records: res.records, notSent: 0, stageStarts: res.stageStarts, fleet: res.fleet, started: "" },
      { router: r.name, timeScale: 1 },
    );
    out.push({
      router: r.name as Prediction["router"],
      run,
      records: res.records,
      wallSeconds: (performance.now() - t0) / 1000,
    });
  }
  return out;
}
