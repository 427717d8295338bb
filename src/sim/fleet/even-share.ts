/**
 * What the fleet's own engines reach on a barriered stage when routing does all it can: the stage's
 * requests dealt out in arrival order, one replica after another (an equal share each, arrivals
 * interleaved), every block that the stage's bound counts as reusable found in cache, and no prefix
 * held on two replicas. The stage bound (stage-limits.ts) relaxes the engines themselves (free
 * preemption, any run order); this runs them as they are: vLLM admits every request whose prompt fits,
 * reserves nothing for its answer, and preempts the newest by recompute when blocks run out. A
 * router's share of this figure is what is left to routing; the gap between it and the bound is the
 * engines' handling of the stage.
 *
 * It is a reference, not a bound: a router may beat it by holding requests at the gateway (pacing
 * what each engine admits), or, when requests differ in size, by balancing live load better than an
 * even deal does (on no-sharing-overload, random 64–8,000-token prompts, the default reaches 102% of it
 * in the 44 QPS stage).
 *
 * On llm-d's 150 × 5 run (`npm run bench:stage-slack -- scenarios/shared-prefix-73.yaml`,
 * simulated) the engines' even share matches the relaxation's own even schedule to the token per
 * second at 3–35 QPS, where no replica runs out of KV, and falls to 91.1–91.5% of the bound at
 * 40–60 QPS, where each replica takes ~190 requests at once and its KV fills as their answers grow
 * (the relaxed schedule: 97.1–97.7%).
 *
 * How it is run: one engine of the fleet's shape whose KV is the replica's minus the regime's
 * resident set, plus one chain of blocks that every request's cached part is a prefix of (computed
 * before the stage starts, so a request's hit costs no KV of its own, as a shared prefix does),
 * each request's uncached part made unique so it hits nothing else. The chain is cached, not
 * pinned: under pressure vLLM may evict the part of it no running request reads, as it would any
 * cached prefix (on the 150 × 5 run every request reads all of it). Every replica's share is run,
 * one engine after another, and the stage ends with the latest: about as much engine work as one
 * router's run of the stages (~6 s of CPU on the 150 × 5 run, ~27 s on scale-512). A CPU offload
 * tier is left out: every hit is an HBM hit. Simulated seconds, deterministic.
 */

import type { FleetConfig } from "./replica.ts";
import { Replica } from "./replica.ts";

/** One request of a stage: arrival (s after the stage's start), prompt tokens, of them cached, answer tokens. */
export interface EvenShareJob {
  at: number;
  prompt: number;
  cached: number;
  output: number;
}

/** Token ids of the shared chain; a request's own tokens stay below them. */
const CHAIN_BASE = 100_000;
const CHAIN_SPAN = 20_000;
const OWN_SPAN = 60_000;

/** The stage under an even deal: its last token (s after the stage's start), and each share's run. */
export interface EvenShareRun {
  /** The latest share's last token. */
  end: number;
  /** Per replica: its share's last token (0 if it had none), requests and preemptions. */
  shares: { end: number; requests: number; preemptions: number }[];
}

/**
 * The stage under an even deal (jobs in arrival order, replica = index mod replicas), each share on an
 * engine with `freeTokens` of KV beside the resident set. Null when some request could not run even
 * alone in that KV (its uncached prompt and answer, in blocks): no engine would finish the stage.
 */
export function evenShare(
  fleet: FleetConfig,
  jobs: readonly EvenShareJob[],
  freeTokens: number,
): EvenShareRun | null {
  const bs = fleet.blockSize;
  const room = Math.floor(freeTokens / bs) * bs;
  if (jobs.some((j) => Math.ceil((j.prompt + j.output) / bs) * bs - cachedPart(j, bs) > room)) return null;
  const shares = Array.from({ length: fleet.replicas }, (_, r) =>
    runShare(
      fleet,
      jobs.filter((_, k) => k % fleet.replicas === r),
      room,
    ),
  );
  return { end: shares.reduce((m, s) => Math.max(m, s.end), 0), shares };
}

/** A job's cached tokens as the engine can hit them: whole blocks, at most prompt − 1 tokens. */
function cachedPart(j: EvenShareJob, bs: number): number {
  return Math.floor(Math.max(0, Math.min(j.cached, j.prompt - 1)) / bs) * bs;
}

/** One replica's share on one engine with `room` tokens of KV for its requests' own blocks. */
function runShare(
  fleet: FleetConfig,
  share: readonly EvenShareJob[],
  room: number,
): { end: number; requests: number; preemptions: number } {
  const bs = fleet.blockSize;
  const chainLen = share.reduce((m, j) => Math.max(m, cachedPart(j, bs)), 0);
  const blocks = room / bs + chainLen / bs + 1;
  const rep = new Replica(
    0,
    {
      ...fleet,
      replicas: 1,
      numGpuBlocks: blocks,
      // vLLM refuses a KV cache smaller than one max_model_len request; every job fits this one.
      maxModelLen: Math.min(fleet.maxModelLen, (blocks - 1) * bs),
      enableKvCacheEvents: false,
      kvOffload: undefined,
      sharedStorage: undefined,
    },
    1,
  );
  const engine = rep.engine;
  const chain = Array.from({ length: chainLen + 1 }, (_, k) => CHAIN_BASE + (k % CHAIN_SPAN));
  let now = -1;
  if (chainLen > 0) {
    engine.addRequest({ id: "chain", promptTokenIds: chain, maxTokens: 1, ignoreEos: true }, now);
    while (engine.hasUnfinishedRequests()) {
      now = rep.startStep(now) as number;
      rep.endStep();
    }
  }
  now = 0;
  let next = 0;
  let last = 0;
  let stepEnd = -1;
  for (;;) {
    const arrival = next < share.length ? Math.max(0, share[next].at) : Number.POSITIVE_INFINITY;
    if (stepEnd >= 0 && stepEnd <= arrival) {
      now = stepEnd;
      stepEnd = -1;
      for (const o of rep.endStep().outputs) if (o.record !== undefined) last = now;
    } else if (next < share.length && (stepEnd >= 0 || arrival <= now || !engine.hasUnfinishedRequests())) {
      now = Math.max(now, arrival);
      const j = share[next];
      const ids = chain.slice(0, cachedPart(j, bs));
      // The first own token differs per request, so no two requests' own blocks match.
      ids.push(next % OWN_SPAN, Math.floor(next / OWN_SPAN));
      for (let t = ids.length; t < j.prompt; t++) ids.push(t % OWN_SPAN);
      ids.length = j.prompt;
      engine.addRequest({ id: `s${next}`, promptTokenIds: ids, maxTokens: j.output, ignoreEos: true }, now);
      next++;
    } else if (engine.hasUnfinishedRequests()) {
      const end = rep.startStep(now);
      if (end === null) throw new Error("even share: the engine stalled with requests waiting");
      stepEnd = end;
    } else return { end: last, requests: share.length, preemptions: engine.stats().numPreemptions };
  }
}
