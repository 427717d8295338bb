/**
 * Runs a scenario's routers in worker threads, several at once: each worker loads the scenario file
 * again, generates the (deterministic) workload once, and runs the routers it is handed, so results
 * equal a sequential run. Workers leave out the workload's limits, which the calling thread
 * computes once (simulate.ts). A router's CPU time is its worker thread's (thread-cpu.ts).
 */
import { resolve } from "node:path";
import { Worker } from "node:worker_threads";
import { type Scenario, ScenarioError } from "./scenario.ts";
import type { RouterOutcome, SimulateOptions } from "./simulate.ts";

export interface WorkerRequest {
  file: string;
  router: string;
  quick: boolean;
}

export type WorkerReply = { ok: true; outcome: RouterOutcome } | { ok: false; message: string; name: string };

/** Runs `routers` on `jobs` workers; outcomes come back in the routers' order. */
export async function runRoutersInWorkers(
  sc: Scenario,
  routers: Scenario["routers"],
  o: SimulateOptions & { quick: boolean; jobs: number },
): Promise<RouterOutcome[]> {
  if (sc.origin === "(inline)") throw new Error("parallel simulation needs a scenario loaded from a file");
  const file = resolve(sc.origin);
  const workerUrl = new URL("./router-worker-boot.mjs", import.meta.url);
  const outcomes: RouterOutcome[] = new Array(routers.length);
  // Longest first shortens the whole run: routers fed by KV events cost the most (the engines record
  // every block event), so they are handed out first. Outcomes keep the scenario's order.
  const heavy = (r: Scenario["routers"][number]) => r.configText.includes("precise-prefix-cache-producer");
  const order = routers
    .map((_, k) => k)
    .sort((a, b) => Number(heavy(routers[b])) - Number(heavy(routers[a])) || a - b);
  let next = 0;
  const runWorker = async (): Promise<void> => {
    const w = new Worker(workerUrl);
    try {
      while (next < routers.length) {
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
          w.postMessage({ file, router: r.name, quick: o.quick } satisfies WorkerRequest);
        });
        if (!reply.ok)
          throw reply.name === "ScenarioError" ? new ScenarioError(reply.message) : new Error(reply.message);
        outcomes[k] = reply.outcome;
        o.onRouterDone?.(reply.outcome);
      }
    } finally {
      await w.terminate();
    }
  };
  await Promise.all(Array.from({ length: Math.min(o.jobs, routers.length) }, runWorker));
  return outcomes;
}
