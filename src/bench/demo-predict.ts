/**
 * What `kvgate simulate` predicts for the demo's own fleet and workload: the fleet simulator run
 * in this process (virtual time, the real scheduler) on the same workload spec and seed, the same
 * replica count, profile and KV capacity, with the gateway's built-in routing config for kvgate
 * and round-robin for the baseline. Its runs are results-file runs built by the same aggregation
 * as the live ones, so every figure is defined the same way on both sides.
 */
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
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
  /**
   * How many draws of that jitter to simulate per router (default 1; 1 when there is no jitter, as
   * every draw would be the same run). Which replica round-robin deals each send to, and so whether a
   * user's question finds its earlier turns there, is luck of the send order: over 16 draws of the
   * demo's 10 ms (users started over 10 s) its hit rate ran 17.4–22.7%, and one draw is one outcome
   * of that.
   */
  draws?: number;
}

export type PredictRouter = "round-robin" | "kvgate";

export interface Prediction {
  router: PredictRouter;
  /** The draw with the median output tokens/s, and its requests. */
  run: RunResult;
  records: RequestRecord[];
  /** Every draw's run, in draw order (draw 0 first). */
  draws: RunResult[];
}

/**
 * `workload` with every send up to `jitterS` seconds later (uniform, from `seed`): a closed-loop
 * request's wait after its predecessor ends, else its arrival time. A live client sends the next
 * questions of users whose answers ended in the same engine step one after another, milliseconds
 * apart and in no fixed order; the simulator, exact, sends them at one instant in the same order
 * every turn, and round-robin then deals a user back to a replica it used before more often than
 * live (the demo: 26% hit rate simulated against 16–18% live). The input is not changed. Each
 * `draw` is its own stream of the seed.
 */
export function jitterSends(workload: Workload, jitterS: number, seed: number, draw = 0): Workload {
  if (!(jitterS >= 0) || !Number.isFinite(jitterS))
    throw new RangeError(`send jitter must be ≥ 0 s, got ${jitterS}`);
  if (jitterS === 0) return workload;
  const rng = streamRng(seed, draw === 0 ? "demo-send-jitter" : `demo-send-jitter-${draw}`);
  const requests = workload.requests.map((r) => {
    const late = rng.next() * jitterS;
    return r.after
      ? { ...r, arrivalTime: r.arrivalTime + late, after: { ...r.after, delay: r.after.delay + late } }
      : { ...r, arrivalTime: r.arrivalTime + late };
  });
  return { ...workload, requests };
}

/**
 * Simulates both routers on `workload` (generated from `spec`), round-robin first, each once per
 * draw of the send jitter, every draw with a fresh scheduler.
 */
export async function predict(
  spec: WorkloadSpec,
  workload: Workload,
  fleet: PredictFleet,
  only?: PredictRouter[],
): Promise<Prediction[]> {
  const draws = (fleet.sendJitterS ?? 0) > 0 ? (fleet.draws ?? 1) : 1;
  if (!Number.isInteger(draws) || draws < 1)
    throw new RangeError(`prediction draws must be a whole number ≥ 1, got ${fleet.draws}`);
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
  const sent = Array.from({ length: draws }, (_, d) =>
    jitterSends(workload, fleet.sendJitterS ?? 0, spec.seed, d),
  );
  const tokenizer = new PromptTokenizer();
  const out: Prediction[] = [];
  for (const r of sc.routers) {
    if (only && !only.includes(r.name as PredictRouter)) continue;
    const runs: Array<{ run: RunResult; records: RequestRecord[] }> = [];
    for (const w of sent) {
      const created = await createScheduler(r.configText, { seed: sc.seed });
      const res = runFleet(scenarioFleetOptions(sc, r, created, w, tokenizer));
      const run = buildRun(
        spec,
        w,
        { records: res.records, notSent: 0, stageStarts: res.stageStarts, fleet: res.fleet, started: "" },
        { router: r.name, timeScale: 1 },
      );
      runs.push({ run, records: res.records });
    }
    const rate = (x: { run: RunResult }) => x.run.output_tokens_per_s ?? 0;
    const byRate = [...runs].sort((a, b) => rate(a) - rate(b));
    const median = byRate[Math.floor((byRate.length - 1) / 2)];
    out.push({
      router: r.name as PredictRouter,
      run: median.run,
      records: median.records,
      draws: runs.map((x) => x.run),
    });
  }
  return out;
}

/**
 * predict() with each router in its own worker thread, both at once (the demo's 8 draws each: 7–9 s
 * on 2 cores, against ~10 in one thread). A worker builds the workload again from `spec`. Run in the
 * demo's own thread, the 16 simulations left ~160 MB of garbage that V8 collected ~95 s into the
 * live phases, in one 98 ms pause whose parallel marking took both cores from the replicas: every
 * replica of both phases delivered 0.12–0.16 simulated s late at once. A worker's heap goes with it.
 * Three demo runs each way (users over 20 s): worst replica lag 0.10–0.15 s against 0.13–0.29, and
 * kvgate's TTFT p90 +3.2 to +4.6% from the prediction against +3.7 to +5.3%.
 */
export async function predictInWorkers(spec: WorkloadSpec, fleet: PredictFleet): Promise<Prediction[]> {
  const boot = new URL("./demo-predict-boot.mjs", import.meta.url);
  const one = async (router: PredictRouter): Promise<Prediction> => {
    const w = new Worker(boot, { workerData: { spec, fleet, router } });
    try {
      const reply = await new Promise<{ ok: true; prediction: Prediction } | { ok: false; message: string }>(
        (resolve, reject) => {
          w.once("message", resolve);
          w.once("error", reject);
          w.once("exit", (code) =>
            reject(new Error(`the ${router} prediction worker exited with code ${code}`)),
          );
        },
      );
      if (!reply.ok) throw new Error(`the ${router} prediction failed: ${reply.message}`);
      return reply.prediction;
    } finally {
      await w.terminate();
    }
  };
  return Promise.all((["round-robin", "kvgate"] as const).map(one));
}
