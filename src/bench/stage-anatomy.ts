/**
 * stage-anatomy — where a barriered stage's time goes on each replica of a fleet simulation: engine
 * steps, how many sequences ran (time-weighted), preemptions, and the prompt tokens prefilled again
 * after a preemption (beyond each request's first admission), with each replica's last completion.
 * It tells a stage ended late because the engines recomputed, because one replica had more work, or
 * because concurrency fell off (ramp-up and drain). Pure: the runner (stage-anatomy-run.ts) feeds it
 * the steps and records of one simulated run.
 */

/** One engine step of one replica. */
export interface AnatomyStageStep {
  start: number;
  end: number;
  /** Sequences decoded in the step. */
  running: number;
  prefillTokens: number;
  preempted: number;
}

/** One completed request. */
export interface AnatomyStageRecord {
  stage: number;
  replica: number;
  promptTokens: number;
  /** Prompt tokens found cached at its first admission. */
  cachedTokens: number;
  outputTokens: number;
  /** Its last token's time. */
  end: number;
}

export interface ReplicaStageRow {
  replica: number;
  requests: number;
  steps: number;
  /** Sequences per step, weighted by the step's duration. */
  meanRunning: number;
  maxRunning: number;
  preemptions: number;
  prefillTokens: number;
  /** Σ (prompt − cached at first admission) of its requests: what one prefill per request needs. */
  firstAdmissionTokens: number;
  /** prefillTokens − firstAdmissionTokens: prefilled again after preemptions. */
  recomputedTokens: number;
  /** Its last completion, seconds after the stage's start. */
  endS: number;
}

export interface StageAnatomy {
  stage: number;
  outputTokens: number;
  /** From the stage's start to its last completion. */
  windowS: number;
  outputTokensPerS: number;
  /** outputTokensPerS ÷ the stage's bound, when one is given. */
  shareOfBound: number | null;
  preemptions: number;
  recomputedTokens: number;
  replicas: ReplicaStageRow[];
}

/**
 * Per stage (those with a start), per replica. A step belongs to the stage whose start is the latest
 * at or before the step's start; records carry their stage. `bounds`: stage index → output tok/s.
 */
export function stageAnatomy(
  stageStarts: ReadonlyArray<number | undefined>,
  steps: ReadonlyArray<ReadonlyArray<AnatomyStageStep>>,
  records: readonly AnatomyStageRecord[],
  bounds: ReadonlyMap<number, number> = new Map(),
): StageAnatomy[] {
  const starts = stageStarts
    .map((s, i) => ({ s, i }))
    .filter((x): x is { s: number; i: number } => x.s !== undefined);
  starts.sort((a, b) => a.s - b.s);
  const stageAt = (t: number): number => {
    let k = -1;
    for (const x of starts) if (t >= x.s) k = x.i;
    return k;
  };
  const rows = new Map<number, ReplicaStageRow[]>();
  const weighted = new Map<number, number[]>();
  const busy = new Map<number, number[]>();
  const R = steps.length;
  for (const { i } of starts) {
    rows.set(
      i,
      Array.from({ length: R }, (_, replica) => ({
        replica,
        requests: 0,
        steps: 0,
        meanRunning: 0,
        maxRunning: 0,
        preemptions: 0,
        prefillTokens: 0,
        firstAdmissionTokens: 0,
        recomputedTokens: 0,
        endS: 0,
      })),
    );
    weighted.set(i, new Array(R).fill(0));
    busy.set(i, new Array(R).fill(0));
  }
  for (let rep = 0; rep < R; rep++)
    for (const s of steps[rep]) {
      const k = stageAt(s.start);
      const row = rows.get(k)?.[rep];
      if (row === undefined) continue;
      const d = s.end - s.start;
      row.steps++;
      row.maxRunning = Math.max(row.maxRunning, s.running);
      row.preemptions += s.preempted;
      row.prefillTokens += s.prefillTokens;
      (weighted.get(k) as number[])[rep] += s.running * d;
      (busy.get(k) as number[])[rep] += d;
    }
  const out = new Map<number, number>();
  const last = new Map<number, number>();
  const startOf = new Map(starts.map((x) => [x.i, x.s]));
  for (const r of records) {
    const row = rows.get(r.stage)?.[r.replica];
    if (row === undefined) continue;
    const t0 = startOf.get(r.stage) as number;
    row.requests++;
    row.firstAdmissionTokens += r.promptTokens - r.cachedTokens;
    row.endS = Math.max(row.endS, r.end - t0);
    out.set(r.stage, (out.get(r.stage) ?? 0) + r.outputTokens);
    last.set(r.stage, Math.max(last.get(r.stage) ?? 0, r.end - t0));
  }
  const result: StageAnatomy[] = [];
  for (const { i } of starts) {
    const reps = rows.get(i) as ReplicaStageRow[];
    const w = weighted.get(i) as number[];
    const b = busy.get(i) as number[];
    let preemptions = 0;
    let recomputed = 0;
    for (const row of reps) {
      row.meanRunning = b[row.replica] > 0 ? w[row.replica] / b[row.replica] : 0;
      row.recomputedTokens = row.prefillTokens - row.firstAdmissionTokens;
      preemptions += row.preemptions;
      recomputed += row.recomputedTokens;
    }
    const windowS = last.get(i) ?? 0;
    const outputTokens = out.get(i) ?? 0;
    const rate = windowS > 0 ? outputTokens / windowS : 0;
    const bound = bounds.get(i);
    result.push({
      stage: i,
      outputTokens,
      windowS,
      outputTokensPerS: rate,
      shareOfBound: bound !== undefined && bound > 0 ? rate / bound : null,
      preemptions,
      recomputedTokens: recomputed,
      replicas: reps,
    });
  }
  return result;
}
