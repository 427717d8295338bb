/**
 * Worker-thread entry for the demo's prediction: simulates one router on the demo's workload (built
 * again here from its spec, which is deterministic) and posts the prediction back. The simulations'
 * garbage dies with the worker instead of waiting in the demo's heap for a major collection during
 * the live phases (demo-predict.ts, predictInWorkers).
 */
import { parentPort, workerData } from "node:worker_threads";
import { type PredictFleet, type PredictRouter, predict } from "./demo-predict.ts";
import type { WorkloadSpec } from "./workloads/spec.ts";
import { generateWorkload } from "./workloads/spec.ts";

const { spec, fleet, router } = workerData as {
  spec: WorkloadSpec;
  fleet: PredictFleet;
  router: PredictRouter;
};
try {
  const [p] = await predict(spec, generateWorkload(spec), fleet, [router]);
  parentPort?.postMessage({ ok: true, prediction: p });
} catch (e) {
  parentPort?.postMessage({ ok: false, message: (e as Error).message });
}
