/**
 * Worker-thread entry for parallel simulation: runs one router of a scenario per message and posts
 * its outcome back. The scenario and its workload are built once per worker and reused.
 */
import { parentPort } from "node:worker_threads";
import { computeLimits } from "./limits.ts";
import type { WorkerReply, WorkerRequest, WorkloadFacts } from "./parallel.ts";
import { PromptTokenizer } from "./prompt-tokens.ts";
import { scaleScenario } from "./scale.ts";
import { loadScenario, type Scenario } from "./scenario.ts";
import { limitsFleet, type RouterContext, runRouter, scenarioWorkload } from "./simulate.ts";

let cached: { key: string; sc: Scenario; ctx: RouterContext } | null = null;

function context(req: WorkerRequest): { sc: Scenario; ctx: RouterContext } {
  const key = `${req.file}\n${req.quick}\n${req.seed}\n${req.routerSeed}\n${req.scale}`;
  if (cached?.key !== key) {
    const sc = scaleScenario(
      loadScenario(req.file, { seed: req.seed, routerSeed: req.routerSeed }),
      req.scale,
    );
    const { spec, workload } = scenarioWorkload(sc, req.quick);
    const tokenizer = new PromptTokenizer();
    cached = {
      key,
      sc,
      ctx: { spec, workload, tokenizer, limits: null },
    };
  }
  return cached;
}

parentPort?.on("message", async (req: WorkerRequest) => {
  let reply: WorkerReply;
  try {
    const { sc, ctx } = context(req);
    const router = sc.routers.find((r) => r.name === req.router);
    if (router === undefined) throw new Error(`unknown router "${req.router}"`);
    let facts: WorkloadFacts | undefined;
    if (req.limits) {
      // Before the router: the run then finds the prompts already tokenized.
      ctx.limits ??= computeLimits(ctx.workload, limitsFleet(sc), ctx.tokenizer);
      facts = { spec: ctx.spec, limits: ctx.limits };
    }
    const outcome = await runRouter(sc, router, { ...ctx, records: req.records });
    reply = { ok: true, outcome, ...(facts !== undefined ? { facts } : {}) };
  } catch (e) {
    reply = { ok: false, message: (e as Error).message, name: (e as Error).name };
  }
  parentPort?.postMessage(reply);
});
