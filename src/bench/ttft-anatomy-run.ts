/**
 * ttft-anatomy — where one stream's time to first token goes in a fleet simulation (simulated
 * seconds, deterministic for the seed): runs one router of a scenario with the same fleet,
 * scheduler, flow control and timing as `kvgate simulate`, records every engine step and pick, and
 * explains each request of the stream with ttft-anatomy.ts: gateway wait, the rest of the step in
 * progress on its replica (and whether it carried a long prefill), its own step, and how many
 * replicas had a long prefill pending when it arrived. Prints a summary and the slowest requests.
 *
 *   npm run bench:ttft-anatomy -- scenarios/flow-noisy-neighbour.yaml --router vtc-reserve --stream b-flood
 *     [--long-tokens 1024] [--seed N] [--top 15]
 */
import { createScheduler } from "../scheduler/scheduler.ts";
import { runFleet } from "../sim/fleet/fleet.ts";
import { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import { replicaId } from "../sim/fleet/replica.ts";
import { loadScenario } from "../sim/fleet/scenario.ts";
import { scenarioFleetOptions, scenarioWorkload } from "../sim/fleet/simulate.ts";
import { parseBenchArgs } from "./cli-args.ts";
import { table } from "./format.ts";
import { type AnatomyRequest, type AnatomyStep, anatomy } from "./ttft-anatomy.ts";

const USAGE =
  "usage: npm run bench:ttft-anatomy -- SCENARIO.yaml --router NAME --stream NAME [--long-tokens N] [--seed N] [--top N]";

const { values: args, positionals } = parseBenchArgs("bench:ttft-anatomy", USAGE, {
  allowPositionals: true,
  options: {
    router: { type: "string" },
    stream: { type: "string" },
    "long-tokens": { type: "string", default: "1024" },
    seed: { type: "string" },
    top: { type: "string", default: "15" },
  },
});

async function main(): Promise<void> {
  const file = positionals[0];
  if (file === undefined || args.router === undefined || args.stream === undefined) throw new Error(USAGE);
  const longTokens = Number(args["long-tokens"]);
  const top = Number(args.top);
  if (!(Number.isInteger(longTokens) && longTokens > 0))
    throw new Error("--long-tokens must be a whole number > 0");
  const sc = loadScenario(file, args.seed === undefined ? {} : { seed: Number(args.seed) });
  const r = sc.routers.find((x) => x.name === args.router);
  if (r === undefined)
    throw new Error(
      `no router "${args.router}" in ${file}; it has ${sc.routers.map((x) => x.name).join(", ")}`,
    );
  const { workload } = scenarioWorkload(sc);
  const wanted = new Set(workload.requests.filter((q) => q.tags?.stream === args.stream).map((q) => q.id));
  if (wanted.size === 0) throw new Error(`no request of stream "${args.stream}" in ${file}'s workload`);
  const created = await createScheduler(r.configText, { seed: sc.seed });
  const n = r.pools.reduce((a, p) => a + p.replicas, 0);
  const steps: AnatomyStep[][] = Array.from({ length: n }, () => []);
  const indexOf = new Map(Array.from({ length: n }, (_, i) => [replicaId(i), i]));
  const picks = new Map<string, { at: number; endpoint: string }>();
  const res = runFleet({
    ...scenarioFleetOptions(sc, r, created, workload, new PromptTokenizer()),
    observer: {
      onStepEnd: (_now, replica, s) =>
        void steps[replica]?.push({ start: s.startTime, end: s.endTime, prefillTokens: s.numPrefillTokens }),
      onSchedule: (now, f, _c, target) =>
        void (target !== null && picks.set(f.requestId, { at: now, endpoint: target })),
    },
  });
  const reqs: AnatomyRequest[] = res.records.map((x) => {
    const p = picks.get(x.id);
    return {
      id: x.id,
      arrivedAt: x.start,
      pickedAt: p?.at ?? null,
      firstTokenAt: x.chunkTimes.length > 0 ? x.chunkTimes[0] : null,
      replica: p ? (indexOf.get(p.endpoint) ?? null) : null,
      promptTokens: x.promptTokens,
    };
  });
  const { rows, summary: s } = anatomy(
    reqs.filter((x) => wanted.has(x.id)),
    reqs,
    steps,
    longTokens,
    sc.gatewayDelay,
  );
  const ms = (x: number | null) => (x === null ? "-" : (x * 1000).toFixed(2));
  console.log(
    `${sc.name}, router ${r.name}, stream ${args.stream} (simulated ms; long prefill = prompt ≥ ${longTokens} tokens):`,
  );
  console.log(
    `  ${s.requests} requests: TTFT p50 ${ms(s.ttftP50)} / p90 ${ms(s.ttftP90)}; rest of the step in progress p50 ${ms(s.remainderP50)} / p90 ${ms(s.remainderP90)}; own step p50 ${ms(s.ownStepP50)}`,
  );
  console.log(
    `  arrived behind a step carrying a long prefill: ${s.behindLongPrefill}; while every replica had a long prefill pending: ${s.allReplicasLongPending}; first token in the first step after the one in progress: ${s.firstStepAfter}`,
  );
  const worst = [...rows].sort((a, b) => b.ttft - a.ttft).slice(0, top);
  console.log(
    table(
      [
        "request",
        "TTFT",
        "replica",
        "gateway wait",
        "rest of step",
        "its prefill",
        "steps",
        "own step",
        "long pending",
      ],
      worst.map((x) => [
        x.id,
        ms(x.ttft),
        String(x.replica),
        ms(x.gatewayWait),
        ms(x.remainder),
        String(x.inProgressPrefill),
        String(x.steps),
        ms(x.ownStep),
        `${x.longPendingReplicas}/${steps.length}`,
      ]),
    ),
  );
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
