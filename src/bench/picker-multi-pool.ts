/**
 * bench:picker's multi-pool step: what `kvgate serve --pools` adds to a decision before the pool's
 * scheduler runs, timed alone: InferenceModelRewrite resolution (a rename and a 70/30 split among
 * other models) and the model → pool lookup (pool-router.ts), over a mix of requests for 4 pools ×
 * 4 models each. Cells: every pool declares its models (a Map lookup); the pools learn their models
 * from `replicas` replicas' /v1/models lists, the target's pool asked last (remembered after the first
 * lookup); and that first lookup itself (one Set lookup per replica of every pool asked).
 */
import type { ModelRewrite } from "../datalayer/pool-resources.ts";
import { PoolRouter } from "../gateway/multi-pool/pool-router.ts";
import { createRng } from "../scheduler/rng.ts";
import { type Percentiles, percentiles } from "./picker-decision.ts";

export interface MultiPoolStepResult {
  /** Pools declare their models. */
  declared: Percentiles;
  /** The requested model's pool learns its models from `replicas` replicas: remembered after the first scan. */
  learned: Percentiles;
  /** The same, each lookup a first one (the scan over every pool's replicas; after forgetLearned()). */
  learnedScan: Percentiles;
  replicas: number;
}

const POOLS = 4;
const MODELS_PER_POOL = 4;

const REWRITES: ModelRewrite[] = [
  {
    name: "rename",
    createdAtMs: 0,
    rules: [{ matches: ["old-name"], targets: [{ model: "m0-0", weight: null }] }],
  },
  {
    name: "split",
    createdAtMs: 1,
    rules: [
      {
        matches: ["chat"],
        targets: [
          { model: "m1-0", weight: 70 },
          { model: "m2-0", weight: 30 },
        ],
      },
    ],
  },
];

function time(
  router: PoolRouter<number>,
  models: readonly string[],
  calls: number,
  seed: number,
  forget = false,
): Percentiles {
  const rng = createRng(seed);
  const draw = () => rng.next();
  const ns = new Float64Array(calls);
  let sink = 0;
  for (let i = 0; i < calls + 2000; i++) {
    const model = models[i % models.length];
    if (forget) router.forgetLearned();
    const t0 = process.hrtime.bigint();
    const r = router.route(model, draw);
    const t1 = process.hrtime.bigint();
    sink += r === null ? 0 : r.pool;
    if (i >= 2000) ns[i - 2000] = Number(t1 - t0);
  }
  if (sink < 0) console.log(sink); // keeps the calls observable
  return percentiles(ns);
}

export function runMultiPoolStep(calls: number, replicas: number, seed = 1): MultiPoolStepResult {
  const served = (p: number) => Array.from({ length: MODELS_PER_POOL }, (_, j) => `m${p}-${j}`);
  const declaredEntries = Array.from({ length: POOLS }, (_, p) => ({
    name: `p${p}`,
    pool: p,
    models: served(p),
  }));
  // Requests: mostly served names, some renamed, some split.
  const mix = [...Array.from({ length: POOLS }, (_, p) => served(p)).flat(), "chat", "chat", "old-name"];
  const declared = time(new PoolRouter(declaredEntries, REWRITES, () => false), mix, calls, seed);
  // Worst case: no pool declares; each is asked in turn, the last after `replicas` misses per pool.
  const lists = Array.from({ length: POOLS }, (_, p) =>
    Array.from({ length: replicas }, (_, k) => new Set(k === replicas - 1 ? served(p) : [`other-${k}`])),
  );
  const learnedEntries = declaredEntries.map((e) => ({ ...e, models: null }));
  const learnedRouter = new PoolRouter(learnedEntries, REWRITES, (p, m) => lists[p].some((s) => s.has(m)));
  const lastPool = served(POOLS - 1);
  const learned = time(learnedRouter, lastPool, calls, seed);
  const learnedScan = time(learnedRouter, lastPool, calls, seed, true);
  return { declared, learned, learnedScan, replicas };
}
