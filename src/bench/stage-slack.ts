/**
 * stage-slack — how far each barriered stage's bound (the one `kvgate simulate` prints) is from a
 * schedule its own relaxation allows (src/sim/fleet/relaxed-schedule.ts: free preemption,
 * youngest-first, the KV left beside the resident set). No router or engine runs: simulated seconds,
 * deterministic for the seed. The bound is a lower bound on a stage's end; the schedule's end is one
 * that the relaxation reaches, so the relaxation's best lies between them, and no tighter bound
 * proved within the same relaxation can gain more than the gap. Two placements: requests dealt
 * round-robin (even, as the bound assumes) and whole prefix groups per replica (group g on replica
 * g mod R, as affinity routing places them). A request's prompt counts as cached, in full blocks,
 * when an earlier request sent the same prompt (exact for llm-d's 150 × 5 run, whose warm-up sends
 * every prompt); otherwise it is prefilled whole. Beside them, the stage's even share from the
 * limits (src/sim/fleet/even-share.ts): the fleet's own engines, vLLM's admission and preemption
 * included, with the stage dealt round-robin and every reusable block a hit, which `kvgate simulate`
 * prints beside the bound.
 *
 *   npm run bench:stage-slack -- scenarios/shared-prefix-73.yaml [--seed N] [--stages 9,16]
 */

import { computeLimits } from "../sim/fleet/limits.ts";
import { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import { type RelaxedJob, relaxedSchedule } from "../sim/fleet/relaxed-schedule.ts";
import { loadScenario } from "../sim/fleet/scenario.ts";
import { limitsFleet, scenarioWorkload } from "../sim/fleet/simulate.ts";
import { parseBenchArgs } from "./cli-args.ts";
import { table } from "./format.ts";

const USAGE = "usage: npm run bench:stage-slack -- SCENARIO.yaml [--seed N] [--stages I,J,...]";

const { values: args, positionals } = parseBenchArgs("bench:stage-slack", USAGE, {
  allowPositionals: true,
  options: { seed: { type: "string" }, stages: { type: "string" } },
});

function main(): void {
  const file = positionals[0];
  if (file === undefined) throw new Error(USAGE);
  const sc = loadScenario(file, args.seed === undefined ? {} : { seed: Number(args.seed) });
  const { workload } = scenarioWorkload(sc);
  const fleet = limitsFleet(sc);
  const tok = new PromptTokenizer();
  const limits = computeLimits(workload, fleet, tok);
  if (limits.stages === undefined)
    throw new Error(`${file}: no stage bounds (stages must be barriered and open-loop); nothing to compare`);
  const only = args.stages?.split(",").map(Number);
  if (only?.some((x) => !Number.isInteger(x)))
    throw new Error(`--stages takes stage indices, e.g. 9,16; ${USAGE}`);
  const free = limits.kv_tokens_per_replica - limits.regimes.repeat.resident_tokens_per_replica;
  if (!(free > 0))
    throw new Error(`${file}: the resident set does not fit the KV cache; no relaxed schedule`);
  const bs = fleet.blockSize;
  const seen = new Set<string>();
  const byStage = new Map<number, { job: RelaxedJob; group: string }[]>();
  const starts = new Map(workload.stages.map((s) => [s.index, s.start]));
  for (const r of [...workload.requests].sort((a, b) => a.arrivalTime - b.arrivalTime)) {
    const text = r.prompt ?? JSON.stringify(r.messages ?? []);
    const prompt = r.kind === "chat" ? tok.chat(r.messages ?? []).length : tok.completion(text).length;
    const cached = seen.has(text) ? Math.floor((prompt - 1) / bs) * bs : 0;
    seen.add(text);
    if (r.stage === undefined) continue;
    const list = byStage.get(r.stage) ?? [];
    byStage.set(r.stage, list);
    list.push({
      job: {
        at: r.arrivalTime - (starts.get(r.stage) ?? 0),
        prompt,
        uncached: prompt - cached,
        output: r.maxTokens,
      },
      group: String(r.groupId ?? r.sessionId ?? text),
    });
  }
  const rows: string[][] = [];
  for (const b of limits.stages) {
    if (only !== undefined && !only.includes(b.index)) continue;
    const list = byStage.get(b.index) ?? [];
    const jobs = list.map((x) => x.job);
    const even = relaxedSchedule(fleet, jobs, { freeTokens: free });
    const groups = new Map<string, number>();
    for (const x of list) if (!groups.has(x.group)) groups.set(x.group, groups.size);
    const grouped = relaxedSchedule(fleet, jobs, {
      freeTokens: free,
      home: (i) => (groups.get(list[i].group) ?? 0) % fleet.replicas,
    });
    const rate = workload.stages.find((s) => s.index === b.index)?.rate ?? 0;
    const pct = (x: number) => `${((100 * x) / b.output_tokens_per_s).toFixed(1)}%`;
    rows.push([
      String(b.index),
      String(rate),
      b.output_tokens_per_s.toFixed(0),
      b.earliest_end_s.toFixed(2),
      `${even.outputTokensPerS.toFixed(0)} (${pct(even.outputTokensPerS)})`,
      Math.max(...even.ends).toFixed(2),
      `${grouped.outputTokensPerS.toFixed(0)} (${pct(grouped.outputTokensPerS)})`,
      Math.max(...grouped.ends).toFixed(2),
      b.even_share_output_tokens_per_s === undefined
        ? "-"
        : `${b.even_share_output_tokens_per_s.toFixed(0)} (${pct(b.even_share_output_tokens_per_s)})`,
      b.even_share_end_s?.toFixed(2) ?? "-",
    ]);
  }
  console.log(
    `${sc.name}: ${fleet.replicas} replicas, ${free} KV tokens each beside the resident set; relaxed schedule: youngest-first, free preemption (simulated s)`,
  );
  console.log(
    table(
      [
        "stage",
        "QPS",
        "bound tok/s",
        "bound end s",
        "even: tok/s (of bound)",
        "end s",
        "whole groups: tok/s (of bound)",
        "end s",
        "engines, even share: tok/s (of bound)",
        "end s",
      ],
      rows,
    ),
  );
}

try {
  main();
} catch (e) {
  console.error((e as Error).message);
  process.exit(1);
}
