/**
 * The steady-state step behind the mixed-step ceiling (limits.ts), and per-stage bounds for
 * barriered stages.
 *
 * A barriered stage (inference-perf's `interval`: each stage drains before the next starts) is
 * measured over [its start, its last completion], so its throughput includes the ramp-up — the
 * fleet cannot run more sequences than have arrived — which a steady-state rate ignores. At 60 QPS
 * on the 150 × 5 run, 1,500 requests of 1,000 output tokens arrive over 25 s while the fleet runs
 * ~1,100 sequences at once, so the first ~18 s of a ~120 s window are spent below full
 * concurrency: a steady-state ceiling overstates what any router can reach in that window.
 *
 * The stage bound is a relaxation, so it stays a bound: the fleet is one pool of R replicas, each
 * running at most C sequences (the best regime's mixed-step concurrency), sequences spread evenly
 * (per-replica throughput g(c) = c / T(c) is concave, so an even spread is the best), every arrived
 * request counts as runnable until the stage's tokens are out (none ever finishes early, which only
 * helps), preemption is free, and each step carries the regime's share of prefill. Then the fleet
 * emits at most R·g(min(C, A(t)/R)) tokens/s when A(t) requests have arrived, and the stage's last
 * token comes no sooner than the earliest time E the integral of that reaches the stage's output
 * tokens, nor before any request's arrival plus its output tokens at one decode step each. The
 * bound is W / E. It leaves out the drain (the last requests finishing with fewer companions),
 * which a schedule without free preemption cannot avoid either, so it is still not reachable.
 */
import type { Workload } from "../../bench/workloads/types.ts";
import { stepTime } from "../../engine/profile.ts";
import type { RegimeLimit } from "./limits.ts";
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
  /** Earliest possible last token, seconds after the stage's start (see the module comment). */
  earliest_end_s: number;
  /** output_tokens ÷ earliest_end_s. */
  output_tokens_per_s: number;
}

/**
 * Per-stage bounds of a barriered open-loop workload under `regime` (the fleet's best); undefined
 * when stages are not barriered (a stage's window then also holds earlier stages' tails) or when
 * requests depend on earlier ones (closed loop: arrivals are not known in advance).
 */
export function stageLimits(
  workload: Workload,
  fleet: FleetConfig,
  regime: RegimeLimit,
  promptMean: number,
  outputMean: number,
): StageLimit[] | undefined {
  if (workload.stageBarrier === undefined || workload.stages.length === 0) return undefined;
  if (workload.requests.some((r) => r.after !== undefined)) return undefined;
  const cap = regime.mixed_concurrency_per_replica;
  if (!(cap > 0)) return undefined;
  const u = regime.uncached_prompt_tokens_mean;
  // g[k]: one replica's output tokens/s with k sequences.
  const g = [0];
  for (let k = 1; k <= cap; k++) {
    const m = mixedStep({ ...fleet, replicas: 1 }, k, u, promptMean, outputMean);
    g.push(m.output);
  }
  const R = fleet.replicas;
  const fleetRate = (arrived: number): number => {
    const q = Math.floor(arrived / R);
    const extra = arrived - q * R;
    return extra * g[Math.min(cap, q + 1)] + (R - extra) * g[Math.min(cap, q)];
  };
  // One token per step at best; no step is shorter than one decode with nothing else in it.
  const fastest = stepTime(fleet.profile, { prefills: [], decodeContexts: [1] }).total;
  const out: StageLimit[] = [];
  for (const st of workload.stages) {
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
    out.push({
      index: st.index,
      requests: jobs.length,
      output_tokens: work,
      last_arrival_s: jobs[jobs.length - 1].at,
      earliest_end_s: end,
      output_tokens_per_s: end > 0 ? work / end : 0,
    });
  }
  return out;
}
