/**
 * stage-anatomy — per barriered stage of a fleet simulation (simulated seconds, deterministic for the
 * seed): each replica's steps, mean sequences running, preemptions, prompt tokens recomputed after
 * preemptions and last completion, with the stage's output tok/s as a share of its bound and of its
 * even share (the ones `kvgate simulate` prints). Runs one router of a scenario with the same fleet, scheduler, flow
 * control and timing as `kvgate simulate`. --config replaces the router's EndpointPickerConfig and
 * --max-num-seqs the replicas' vLLM --max-num-seqs, to try a gate without editing the scenario; the
 * bounds stay the scenario fleet's, so shares compare with the shipped run.
 *
 *   npm run bench:stage-anatomy -- scenarios/shared-prefix-73.yaml --router precise
 *     [--config FILE] [--max-num-seqs N] [--seed N] [--replicas]
 */
import { readFileSync } from "node:fs";
import { createScheduler } from "../scheduler/scheduler.ts";
import { runFleet } from "../sim/fleet/fleet.ts";
import { computeLimits } from "../sim/fleet/limits.ts";
import { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import { replicaId } from "../sim/fleet/replica.ts";
import { loadScenario } from "../sim/fleet/scenario.ts";
import { limitsFleet, scenarioFleetOptions, scenarioWorkload } from "../sim/fleet/simulate.ts";
import { parseBenchArgs } from "./cli-args.ts";
import { table } from "./format.ts";
import { type AnatomyStageRecord, type AnatomyStageStep, stageAnatomy } from "./stage-anatomy.ts";

const USAGE =
  "usage: npm run bench:stage-anatomy -- SCENARIO.yaml --router NAME [--config FILE] [--max-num-seqs N] [--seed N] [--replicas]";

const { values: args, positionals } = parseBenchArgs("bench:stage-anatomy", USAGE, {
  allowPositionals: true,
  options: {
    router: { type: "string" },
    config: { type: "string" },
    "max-num-seqs": { type: "string" },
    seed: { type: "string" },
    replicas: { type: "boolean", default: false },
  },
});

async function main(): Promise<void> {
  const file = positionals[0];
  if (file === undefined || args.router === undefined) throw new Error(USAGE);
  const maxSeqs = args["max-num-seqs"] === undefined ? null : Number(args["max-num-seqs"]);
  if (maxSeqs !== null && !(Number.isInteger(maxSeqs) && maxSeqs > 0))
    throw new Error(`--max-num-seqs must be a whole number > 0, got ${args["max-num-seqs"]}`);
  const sc = loadScenario(file, args.seed === undefined ? {} : { seed: Number(args.seed) });
  const r = sc.routers.find((x) => x.name === args.router);
  if (r === undefined)
    throw new Error(
      `no router "${args.router}" in ${file}; it has ${sc.routers.map((x) => x.name).join(", ")}`,
    );
  const configText = args.config === undefined ? r.configText : readFileSync(args.config, "utf8");
  const pools = maxSeqs === null ? r.pools : r.pools.map((p) => ({ ...p, maxNumSeqs: maxSeqs }));
  const { workload } = scenarioWorkload(sc);
  const tokenizer = new PromptTokenizer();
  const limits = computeLimits(workload, limitsFleet(sc), tokenizer);
  const bounds = new Map((limits.stages ?? []).map((s) => [s.index, s.output_tokens_per_s]));
  const evens = new Map((limits.stages ?? []).map((s) => [s.index, s.even_share_output_tokens_per_s]));
  const created = await createScheduler(configText, { seed: sc.seed });
  const n = pools.reduce((a, p) => a + p.replicas, 0);
  const steps: AnatomyStageStep[][] = Array.from({ length: n }, () => []);
  const indexOf = new Map(Array.from({ length: n }, (_, i) => [replicaId(i), i]));
  const res = runFleet({
    ...scenarioFleetOptions(sc, r, created, workload, tokenizer, pools),
    observer: {
      onStepEnd: (_now, replica, s) =>
        void steps[replica]?.push({
          start: s.startTime,
          end: s.endTime,
          running: s.numDecodeTokens,
          prefillTokens: s.numPrefillTokens,
          preempted: s.numPreemptedThisStep,
        }),
    },
  });
  const records: AnatomyStageRecord[] = [];
  for (const x of res.records) {
    const replica = x.endpoint === undefined ? undefined : indexOf.get(x.endpoint);
    if (x.error || x.stage === undefined || x.warmup || replica === undefined) continue;
    records.push({
      stage: x.stage,
      replica,
      promptTokens: x.promptTokens,
      cachedTokens: x.cachedTokens ?? 0,
      outputTokens: x.completionTokens,
      end: x.end,
    });
  }
  let stages = stageAnatomy(res.stageStarts, steps, records, bounds);
  if (bounds.size > 0) stages = stages.filter((s) => bounds.has(s.stage));
  const pct = (x: number | null) => (x === null ? "-" : `${(100 * x).toFixed(1)}%`);
  const int = (x: number) => Math.round(x).toLocaleString("en-US");
  const knobs = [
    args.config !== undefined ? `config ${args.config}` : "",
    maxSeqs !== null ? `--max-num-seqs ${maxSeqs}` : "",
  ].filter((s) => s !== "");
  console.log(
    `${sc.name}, router ${r.name}${knobs.length > 0 ? ` (${knobs.join(", ")})` : ""}; simulated seconds; bound = the scenario fleet's stage bound, even share = its engines with the stage dealt evenly (src/sim/fleet/even-share.ts):`,
  );
  const spread = (s: (typeof stages)[number], f: (x: (typeof s.replicas)[number]) => number) => {
    const v = s.replicas.filter((x) => x.requests > 0).map(f);
    return v.length === 0 ? "-" : `${Math.min(...v).toFixed(0)}–${Math.max(...v).toFixed(0)}`;
  };
  console.log(
    table(
      [
        "stage",
        "out tok/s",
        "share of bound",
        "of even share",
        "window s",
        "replica ends s",
        "mean running",
        "preemptions",
        "recomputed tokens",
      ],
      stages.map((s) => [
        String(s.stage),
        int(s.outputTokensPerS),
        pct(s.shareOfBound),
        pct(evens.get(s.stage) ? s.outputTokensPerS / (evens.get(s.stage) as number) : null),
        s.windowS.toFixed(1),
        spread(s, (x) => x.endS),
        spread(s, (x) => x.meanRunning),
        int(s.preemptions),
        int(s.recomputedTokens),
      ]),
    ),
  );
  if (!args.replicas) return;
  for (const s of stages) {
    console.log(`\nstage ${s.stage}:`);
    console.log(
      table(
        [
          "replica",
          "requests",
          "steps",
          "mean running",
          "max running",
          "preemptions",
          "prefilled",
          "first admissions",
          "recomputed",
          "end s",
        ],
        s.replicas.map((x) => [
          String(x.replica),
          String(x.requests),
          String(x.steps),
          x.meanRunning.toFixed(0),
          String(x.maxRunning),
          String(x.preemptions),
          int(x.prefillTokens),
          int(x.firstAdmissionTokens),
          int(x.recomputedTokens),
          x.endS.toFixed(1),
        ]),
      ),
    );
  }
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
