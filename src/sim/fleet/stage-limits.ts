/**
 * The steady-state step behind the mixed-step ceiling (limits.ts), and per-stage bounds for
 * barriered stages.
 *
 * A barriered stage (inference-perf's `interval`: each stage drains before the next starts) is
 * measured over [its start, its last completion], so its throughput includes the ramp-up — the
 * fleet cannot run more sequences than have arrived — which a steady-state rate ignores. At 60 QPS
 * on the 150 × 5 run, 1,500 requests of 1,000 output tokens arrive over 25 s while the fleet runs
 * at most ~1,300 sequences at once, so the first ~22 s of a ~113 s window are spent below full
 * concurrency: a steady-state ceiling overstates what any router can reach in that window.
 *
 * The stage bound is a relaxation, so it stays a bound: the fleet is one pool of R replicas, each
 * running at most C sequences, sequences spread evenly (per-replica throughput g(c) = c / T(c) is
 * concave, so an even spread is the best), every arrived request counts as runnable until the
 * stage's tokens are out (none ever finishes early, which only helps), preemption is free, and each
 * step carries the stage's share of prefill. Then the fleet emits at most R·g(min(C, A(t)/R))
 * tokens/s when A(t) requests have arrived, and the stage's last token comes no sooner than the
 * earliest time E the integral of that reaches the stage's output tokens, nor before any request's
 * arrival plus its output tokens at one decode step each. The bound is W / E.
 *
 * Each stage is read with its own requests under each prefix-reuse regime that fits (limits.ts),
 * and the best regime is kept: U is the stage's mean uncached prompt tokens with every block
 * computed by an earlier request (of any stage) reusable, C = (KV − the regime's resident set) ÷
 * (private KV a sequence holds per token it makes, U + (O − 1)/2 for one answer length), capped by
 * max_num_seqs and the token budget. A step of k sequences costs the step-time model's fixed part
 * plus k × the stage's work per output token, summed exactly over its requests (stepTerms,
 * PerToken): a request's first token comes from its prefill step, so only O − 1 of its tokens read
 * the KV as decodes (charging every token a decode at the mean context made the bound 0.08% too
 * tight on the 150 × 5 run: a fast-check property in test/fleet-stage-limits.test.ts found a
 * schedule beating it). A stage is not charged the prefixes its predecessors computed: in llm-d's
 * 150 × 5 run every prompt is seen in the warm-up, so the saturated stages compute one token per
 * prompt (U = 1, C = 164), not the run's mean of 106 (C = 135), and their bounds are 3% higher than
 * with the run's mean. The run's mean made the bound no bound: a schedule its relaxation allows
 * (free preemption, each replica running its share of a stage youngest-first within the KV beside
 * the resident set, block-granular) finished those stages faster than it said.
 * test/fleet-stage-limits.test.ts runs that schedule against the bound.
 *
 * Warm-up stages get no bound, and a stage that computes part of the resident set for the first
 * time is read as if the whole set were held from its start (KV is over-reserved for it; llm-d's
 * 150 × 5 run computes every prompt in its warm-up, so its measured stages are not affected).
 *
 * It assumes the regime's resident set stays in KV through the stage. vLLM keeps a cached prefix
 * only while there is room: under pressure it drops blocks no running request reads and recomputes
 * them when a request comes back for them, and a schedule doing that on purpose (prompts this stage
 * does not send, or whose requests are done) would hold less. Not counted. On the 150 × 5 run the
 * 20–60 QPS stages send all but at most 15 of the 750 prompts (15 at 35 QPS: 2,250 tokens a
 * replica, 2.7% of the KV beside the resident set), and at 3–15 QPS no replica runs enough
 * sequences to fill its KV; what dropping the prompts whose requests are done within a stage could
 * gain was not bounded.
 *
 * What it leaves out, so it is not reachable:
 * - the drain. A step costs the model's fixed part σ (launch and weight streaming: 12.2 ms of a ~95
 *   ms step on the 150 × 5 run) plus per-request terms, so a replica's time is its idle time + σ ×
 *   its steps + per-request work no schedule changes; only the step count is the schedule's. Tokens
 *   a request makes after its m-th come at a replica's step m + 1 or later, so the replica takes at
 *   least m + (KV those tokens hold, summed over their steps) ÷ (KV beside the resident set) steps,
 *   for every m. With the 60 QPS stage dealt evenly (187.5 requests a replica) that is 1,359 steps
 *   (m = 439) where the area alone (m = 0) gives 1,140, and with the ramp-up counted (work and
 *   steps before a time τ bounded by the arrivals) the stage's end would move from 113.1 to about
 *   115.3 s. It is not counted because it is not a bound over placements: the m steps are owed only
 *   by replicas still holding such tokens, a router may load replicas unevenly, and with the
 *   placement left free (work and progress bounded only in total) the same argument ends each of
 *   the stages tried (20, 40, 49 and 60 QPS) before this bound does (112.5 against 113.1 s at 60 QPS). No proof that the
 *   even spread is the worst case for the drain was found. How much any tighter bound within this
 *   relaxation could gain is measured by `npm run bench:stage-slack --
 *   scenarios/shared-prefix-73.yaml`: a schedule the relaxation allows (youngest-first, free
 *   preemption; relaxed-schedule.ts) ends the 40–60 QPS stages 2.4–3.0% after the bound with
 *   requests dealt evenly, 3.9–5.1% with whole prefix groups per replica;
 * - what the engine's own scheduling costs: vLLM admits requests without reserving KV for their
 *   answers and recomputes the ones it preempts, so a stage that arrives in a burst ages as a cohort
 *   and preempts (in the 150 × 5 run's 60 QPS stage, precise: ~130 preemptions and 33–159k prompt
 *   tokens prefilled per replica where one per request would do, and ~2,000 steps per replica where
 *   164 sequences at a time would need ~1,150). even-share.ts runs the engines themselves on each
 *   stage, dealt evenly with every reusable block a hit, and the limits carry that figure beside the
 *   bound (`even_share_output_tokens_per_s`): on the 150 × 5 run 91.1–91.5% of the bound at 40–60
 *   QPS and 87.5% at 15 QPS, what routing can reach there.
 */
import type { Workload } from "../../bench/workloads/types.ts";
import { stepTime } from "../../engine/profile.ts";
import type { FleetConfig } from "./replica.ts";

/**
 * The steady-state step of a replica running `conc` sequences: each step decodes C of them and
 * prefills C·U/O tokens of the next ones (one chunk at the mean context of a prompt's uncached
 * part), C capped so the step fits max_num_batched_tokens. Output tokens/s of the fleet.
 */
export function mixedStep(
  fleet: FleetConfig,
  conc: number,
  uncached: number,
  promptMean: number,
  outputMean: number,
): { concurrency: number; step: number; output: number } {
  if (conc <= 0 || outputMean <= 0) return { concurrency: 0, step: 0, output: 0 };
  const perStep = uncached / outputMean;
  const c = Math.max(1, Math.min(conc, Math.floor(fleet.maxNumBatchedTokens / (1 + perStep))));
  const tokens = c * perStep;
  const cached = Math.max(0, promptMean - uncached);
  const context = Math.max(0, cached + uncached / 2 - tokens / 2);
  const ctx = Math.round(promptMean + outputMean / 2);
  const step = stepTime(fleet.profile, {
    prefills: tokens > 0 ? [{ tokens, context }] : [],
    decodeContexts: new Array(c).fill(ctx),
  }).total;
  return { concurrency: c, step, output: (fleet.replicas * c) / step };
}

export interface StageLimit {
  index: number;
  requests: number;
  output_tokens: number;
  /** Seconds after the stage's start. */
  last_arrival_s: number;
  /** The best regime's mean uncached prompt tokens per request of this stage, and its sequences per replica. */
  uncached_prompt_tokens_mean: number;
  concurrency_per_replica: number;
  /** Earliest possible last token, seconds after the stage's start (see the module comment). */
  earliest_end_s: number;
  /** output_tokens ÷ earliest_end_s. */
  output_tokens_per_s: number;
  /** The prefix-reuse regime the bound was read under (limits.ts). */
  regime: RegimeName;
  /**
   * What the fleet's engines reach on this stage when it is dealt evenly and every reusable block
   * is a hit (even-share.ts; a reference, not a bound): its last token, s after the stage's start,
   * and output_tokens ÷ that.
   */
  even_share_end_s?: number;
  even_share_output_tokens_per_s?: number;
}

export type RegimeName = "zero" | "group" | "repeat";

/**
 * A stage's work per output token, summed exactly over its requests (limits.ts): each request
 * emits its first token from its prefill step and decodes the rest, so a mean prompt and answer
 * would charge every token a decode read it does not make.
 */
export interface PerToken {
  /** KV tokens read by decodes: Σ ((O − 1)·P + O(O − 1)/2) ÷ Σ O. */
  decodeContext: number;
  /** Prompt tokens prefilled: Σ U ÷ Σ O. */
  prefillTokens: number;
  /** Prefill attention work, Σ U(P − U/2) ÷ Σ O (the same however the prompt is chunked). */
  prefillAttention: number;
  /** Private KV tokens held per running sequence, per token made: Σ (U·O + O(O − 1)/2) ÷ Σ O. */
  privateTokens: number;
}

/** One prefix-reuse regime as the stage bounds read it (limits.ts). */
export interface StageRegime {
  name: RegimeName;
  /** KV tokens per replica left beside the regime's resident set (≤ 0: the regime does not fit). */
  freeTokensPerReplica: number;
  /**
   * Per stage index: the stage's own mean uncached prompt, prompt and output tokens per request, and
   * (when known) its exact work per output token, which the bound then uses instead of the means.
   */
  stages: ReadonlyMap<
    number,
    { uncachedMean: number; promptMean: number; outputMean: number; perToken?: PerToken }
  >;
}

/**
 * The step-time model's terms, each linear in what it counts (profile.ts): a step costs
 * `step` + `request` per scheduled request + `context` per decode KV token read + `prefill` per
 * prompt token + `attention` per unit of prefill attention work.
 */
export function stepTerms(fleet: FleetConfig): {
  step: number;
  request: number;
  context: number;
  prefill: number;
  attention: number;
} {
  const t = (prefills: { tokens: number; context: number }[], decodeContexts: number[]) =>
    stepTime(fleet.profile, { prefills, decodeContexts }).total;
  const one = t([], [0]);
  const request = t([], [0, 0]) - one;
  const context = (t([], [1024]) - one) / 1024;
  const chunk = t([{ tokens: 1024, context: 0 }], []);
  const attention = (t([{ tokens: 1024, context: 1024 }], []) - chunk) / (1024 * 1024);
  // 1,024 tokens at context 0 carry 1,024²/2 units of attention work.
  const prefill = (chunk - one - (attention * 1024 * 1024) / 2) / 1024;
  return { step: one - request, request, context, prefill, attention };
}

/**
 * Per-stage bounds of a barriered open-loop workload: each non-warm-up stage under each regime that fits, the
 * best kept; undefined when stages are not barriered (a stage's window then also holds earlier
 * stages' tails) or when requests depend on earlier ones (closed loop: arrivals are not known in
 * advance).
 */
export function stageLimits(
  workload: Workload,
  fleet: FleetConfig,
  regimes: readonly StageRegime[],
): StageLimit[] | undefined {
  if (workload.stageBarrier === undefined || workload.stages.length === 0) return undefined;
  if (workload.requests.some((r) => r.after !== undefined)) return undefined;
  const R = fleet.replicas;
  const one = { ...fleet, replicas: 1 };
  // One token per step at best; no step is shorter than one decode with nothing else in it.
  const fastest = stepTime(fleet.profile, { prefills: [], decodeContexts: [1] }).total;
  const terms = stepTerms(fleet);
  const out: StageLimit[] = [];
  for (const st of workload.stages) {
    // A warm-up builds the resident set that the regimes hold from the start: not read against a bound.
    if (st.warmup) continue;
    const jobs = workload.requests
      .filter((r) => r.stage === st.index)
      .map((r) => ({ at: Math.max(0, r.arrivalTime - st.start), tokens: r.maxTokens }))
      .sort((a, b) => a.at - b.at);
    if (jobs.length === 0) continue;
    let work = 0;
    let latest = 0;
    for (const j of jobs) {
      work += j.tokens;
      latest = Math.max(latest, j.at + j.tokens * fastest);
    }
    let best: StageLimit | undefined;
    for (const regime of regimes) {
      const s = regime.stages.get(st.index);
      if (s === undefined || !(regime.freeTokensPerReplica > 0) || !(s.outputMean > 0)) continue;
      const live = s.uncachedMean + s.outputMean / 2;
      const kvBound = live > 0 ? Math.floor(regime.freeTokensPerReplica / live) : fleet.maxNumSeqs;
      const conc = Math.min(fleet.maxNumSeqs, kvBound);
      if (!(conc > 0)) continue;
      const cap = mixedStep(one, conc, s.uncachedMean, s.promptMean, s.outputMean).concurrency;
      // g[k]: one replica's output tokens/s with k sequences.
      const g = [0];
      if (s.perToken !== undefined) {
        // Exact per-token work: a step making k tokens costs step + k × (one request, its decode
        // read, its share of prefill GEMM and attention).
        const w = s.perToken;
        const perSeq =
          terms.request +
          terms.context * w.decodeContext +
          terms.prefill * w.prefillTokens +
          terms.attention * w.prefillAttention;
        const kvCap =
          w.privateTokens > 0 ? Math.floor(regime.freeTokensPerReplica / w.privateTokens) : fleet.maxNumSeqs;
        const budgetCap = Math.floor(fleet.maxNumBatchedTokens / (1 + w.prefillTokens));
        const c = Math.max(1, Math.min(fleet.maxNumSeqs, kvCap, budgetCap));
        if (!(kvCap > 0)) continue;
        for (let k = 1; k <= c; k++) g.push(k / (terms.step + k * perSeq));
      } else
        for (let k = 1; k <= cap; k++)
          g.push(mixedStep(one, k, s.uncachedMean, s.promptMean, s.outputMean).output);
      const top = g.length - 1;
      const fleetRate = (arrived: number): number => {
        const q = Math.floor(arrived / R);
        const extra = arrived - q * R;
        return extra * g[Math.min(top, q + 1)] + (R - extra) * g[Math.min(top, q)];
      };
      let done = 0;
      let end = Number.POSITIVE_INFINITY;
      for (let k = 0; k < jobs.length; k++) {
        const rate = fleetRate(k + 1);
        const next = k + 1 < jobs.length ? jobs[k + 1].at : Number.POSITIVE_INFINITY;
        const span = next - jobs[k].at;
        if (rate > 0 && done + rate * span >= work) {
          end = jobs[k].at + (work - done) / rate;
          break;
        }
        done += rate * span;
      }
      end = Math.max(end, latest);
      if (best !== undefined && end > best.earliest_end_s) continue;
      best = {
        index: st.index,
        requests: jobs.length,
        output_tokens: work,
        last_arrival_s: jobs[jobs.length - 1].at,
        uncached_prompt_tokens_mean: s.uncachedMean,
        concurrency_per_replica: top,
        earliest_end_s: end,
        output_tokens_per_s: end > 0 ? work / end : 0,
        regime: regime.name,
      };
    }
    if (best !== undefined) out.push(best);
  }
  return out.length > 0 ? out : undefined;
}
