/**
 * A schedule the per-stage bound's relaxation allows (stage-limits.ts), run step by step: requests
 * placed on replicas by a given rule, each replica running the requests that have arrived in a given
 * priority order within max_num_seqs, the token budget and the KV left beside the resident set
 * (counted in blocks, as the engine allocates them: the prompt at its prefill step, prompt + m at the
 * step that makes token m + 1), preemption free (a request waiting keeps no KV and loses no work),
 * one token per request per step, each step timed by the engines' step-time model. Whatever it
 * reaches the bound must not beat (test/fleet-stage-limits.test.ts), and how far below the bound it
 * stays says how much a tighter bound within the same relaxation could gain (bench:stage-slack).
 * Pure: time is the schedule's own.
 */
import { stepTime } from "../../engine/profile.ts";
import type { FleetConfig } from "./replica.ts";

/** One request of a stage: arrival (s after the stage's start), prompt tokens, of them uncached, answer tokens. */
export interface RelaxedJob {
  at: number;
  prompt: number;
  uncached: number;
  output: number;
}

/** Which waiting request runs first: fewest tokens made, most made, earliest arrival, or `rank` alone. */
export type RelaxedPriority = "youngest" | "oldest" | "arrival" | "ranked";

export interface RelaxedOptions {
  /** The KV tokens per replica left beside the resident set. */
  freeTokens: number;
  priority?: RelaxedPriority;
  /** Each request's replica (index into `jobs`); round-robin by index when absent. */
  home?: (i: number) => number;
  /** Tie-break (and the whole order under "ranked"); the request's index when absent. */
  rank?: (i: number) => number;
}

/** The schedule's last token per replica (s after the stage's start; 0 for an idle replica) and output tokens/s. */
export function relaxedSchedule(
  f: FleetConfig,
  jobs: readonly RelaxedJob[],
  o: RelaxedOptions,
): { ends: number[]; outputTokensPerS: number } {
  const priority = o.priority ?? "youngest";
  const rank = o.rank ?? ((i: number) => i);
  type Live = RelaxedJob & { made: number; k: number; r: number };
  const cmp = (a: Live, b: Live): number => {
    const key =
      priority === "youngest"
        ? a.made - b.made
        : priority === "oldest"
          ? b.made - a.made
          : priority === "arrival"
            ? a.at - b.at
            : 0;
    return key !== 0 ? key : a.r - b.r;
  };
  const ends: number[] = [];
  let work = 0;
  let end = 0;
  const bs = f.blockSize;
  for (let replica = 0; replica < f.replicas; replica++) {
    const mine: Live[] = [];
    jobs.forEach((j, k) => {
      if ((o.home ? o.home(k) : k % f.replicas) === replica) mine.push({ ...j, made: 0, k, r: rank(k) });
    });
    let t = 0;
    let left = mine.length;
    while (left > 0) {
      const ready = mine.filter((j) => j.at <= t && j.made < j.output).sort(cmp);
      if (ready.length === 0) {
        t = Math.min(...mine.filter((j) => j.made < j.output).map((j) => j.at));
        continue;
      }
      let kv = 0;
      let budget = f.maxNumBatchedTokens;
      const prefills: { tokens: number; context: number }[] = [];
      const decodeContexts: number[] = [];
      const run: Live[] = [];
      for (const j of ready) {
        const tokens = j.made === 0 ? j.uncached : 1;
        const held = Math.ceil((j.prompt + j.made) / bs) * bs - (j.prompt - j.uncached);
        if (run.length === f.maxNumSeqs || kv + held > o.freeTokens || tokens > budget) continue;
        kv += held;
        budget -= tokens;
        run.push(j);
        if (j.made === 0) prefills.push({ tokens: j.uncached, context: j.prompt - j.uncached });
        else decodeContexts.push(j.prompt + j.made);
      }
      if (run.length === 0)
        throw new Error(
          `replica ${replica}: no waiting request fits ${o.freeTokens} free KV tokens; give the relaxation more KV`,
        );
      t += stepTime(f.profile, { prefills, decodeContexts }).total;
      for (const j of run) if (++j.made === j.output) left--;
    }
    ends.push(t);
    end = Math.max(end, t);
    for (const j of mine) work += j.output;
  }
  return { ends, outputTokensPerS: end > 0 ? work / end : 0 };
}
