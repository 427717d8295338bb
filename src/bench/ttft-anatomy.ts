/**
 * ttft-anatomy, the arithmetic (pure): where each request's time to first token went in a fleet
 * simulation, from the engine steps of its replica (ttft-anatomy-run.ts records them). Per request:
 * the wait at the gateway (arrival → pick), the rest of the step in progress on its replica when it
 * got there (and whether that step carried a long prefill), the steps from then to its first token
 * (the last one carries it), and how many replicas had a long prefill pending at the gateway (a
 * long prompt picked there whose first token had not come back) when it arrived.
 */
import { quantile } from "./flow-bench-stats.ts";

export interface AnatomyStep {
  start: number;
  end: number;
  prefillTokens: number;
}

export interface AnatomyRequest {
  id: string;
  /** Arrival at the gateway, the pick, and the first token (simulated s); null if never. */
  arrivedAt: number;
  pickedAt: number | null;
  firstTokenAt: number | null;
  replica: number | null;
  promptTokens: number;
}

export interface AnatomyRow {
  id: string;
  ttft: number;
  replica: number;
  gatewayWait: number;
  /** Rest of the step in progress on the replica when the request got there (0: idle). */
  remainder: number;
  /** Prefill tokens of that step. */
  inProgressPrefill: number;
  /** Steps after it, up to and including the one that produced the first token. */
  steps: number;
  /** Duration of the step that produced the first token. */
  ownStep: number;
  /** Replicas with a long prefill pending at the gateway when the request arrived. */
  longPendingReplicas: number;
}

export interface AnatomySummary {
  requests: number;
  ttftP50: number | null;
  ttftP90: number | null;
  remainderP50: number | null;
  remainderP90: number | null;
  ownStepP50: number | null;
  /** Arrived while the step in progress on its replica carried at least `longTokens` of prefill. */
  behindLongPrefill: number;
  /** Arrived while every replica had a long prefill pending. */
  allReplicasLongPending: number;
  /** First token in the first step after the one in progress. */
  firstStepAfter: number;
}

/**
 * Rows for `of` (the requests to explain) against every request (`all`, for the pending long
 * prefills) and each replica's steps in time order. `delay`: seconds from the pick to the replica.
 */
export function anatomy(
  of: readonly AnatomyRequest[],
  all: readonly AnatomyRequest[],
  steps: readonly (readonly AnatomyStep[])[],
  longTokens: number,
  delay = 0,
): { rows: AnatomyRow[]; summary: AnatomySummary } {
  const long = all.filter(
    (r) =>
      r.promptTokens >= longTokens && r.pickedAt !== null && r.replica !== null && r.firstTokenAt !== null,
  );
  const rows: AnatomyRow[] = [];
  for (const r of of) {
    const first = r.firstTokenAt;
    if (r.pickedAt === null || first === null || r.replica === null) continue;
    const at = r.pickedAt + delay;
    const mine = steps[r.replica] ?? [];
    const cur = mine.find((s) => s.start <= at && s.end > at);
    const from = cur ? cur.end : at;
    const after = mine.filter((s) => s.start >= from - 1e-12 && s.end <= first + 1e-12);
    const last = after[after.length - 1];
    const pending = new Set<number>();
    for (const l of long)
      if (l.id !== r.id && (l.pickedAt as number) <= r.arrivedAt && (l.firstTokenAt as number) > r.arrivedAt)
        pending.add(l.replica as number);
    rows.push({
      id: r.id,
      ttft: first - r.arrivedAt,
      replica: r.replica,
      gatewayWait: r.pickedAt - r.arrivedAt,
      remainder: cur ? cur.end - at : 0,
      inProgressPrefill: cur?.prefillTokens ?? 0,
      steps: after.length,
      ownStep: last ? last.end - last.start : 0,
      longPendingReplicas: pending.size,
    });
  }
  const q = (f: (x: AnatomyRow) => number, p: number) => quantile(rows.map(f), p);
  return {
    rows,
    summary: {
      requests: rows.length,
      ttftP50: q((x) => x.ttft, 0.5),
      ttftP90: q((x) => x.ttft, 0.9),
      remainderP50: q((x) => x.remainder, 0.5),
      remainderP90: q((x) => x.remainder, 0.9),
      ownStepP50: q((x) => x.ownStep, 0.5),
      behindLongPrefill: rows.filter((x) => x.inProgressPrefill >= longTokens).length,
      allReplicasLongPending: rows.filter((x) => x.longPendingReplicas >= steps.length && steps.length > 0)
        .length,
      firstStepAfter: rows.filter((x) => x.steps === 1).length,
    },
  };
}
