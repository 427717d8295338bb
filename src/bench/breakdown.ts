/**
 * Per-tenant, per-priority and per-stream figures of a run whose requests carry tags (a `mix`
 * workload, mix.ts): for each group its requests, completions, rejections by status and llm-d's
 * dropped reason, throughput (completed requests and output tokens per second over the group's
 * own window), TTFT p50/p90 and SLO attainment (requests with an SLO that succeeded within their
 * own x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms, failures counting as misses). Pure; the bench
 * and the fleet simulator both call it, so their tables mean the same.
 */

import { table } from "./format.ts";
import { percentile } from "./latency-summary.ts";
import { type RequestRecord, requestMetrics } from "./request-metrics.ts";
import type { RequestSpec } from "./workloads/types.ts";

export interface GroupFigures {
  group: string;
  requests: number;
  completed: number;
  /** "429 rejected-saturated" → count (status, then the dropped reason or the error kind). */
  rejected: Record<string, number>;
  requests_per_s: number | null;
  output_tokens_per_s: number | null;
  ttft_p50_s: number | null;
  ttft_p90_s: number | null;
  /** Requests that carried an SLO, and how many met it. */
  slo_requests: number;
  slo_met: number;
  slo_attainment: number | null;
}

export interface Breakdown {
  by_tenant: GroupFigures[];
  by_priority: GroupFigures[];
  by_stream: GroupFigures[];
}

/** Objective name → priority (InferenceObjective spec.priority); unknown or none is 0, as llm-d. */
export type ObjectivePriorities = ReadonlyMap<string, number> | Record<string, number>;

function priorityOf(objectives: ObjectivePriorities, name: string | undefined): number {
  if (name === undefined) return 0;
  const p = objectives instanceof Map ? objectives.get(name) : (objectives as Record<string, number>)[name];
  return p ?? 0;
}

/** Status and reason of a failed request, as the tables show it. */
export function rejectionKey(r: RequestRecord): string {
  const e = r.error;
  if (e === undefined) return "";
  return e.status !== undefined ? `${e.status} ${e.reason ?? e.kind}` : e.kind;
}

export function groupFigures(
  group: string,
  recs: readonly RequestRecord[],
  specs: readonly RequestSpec[],
): GroupFigures {
  const ttfts: number[] = [];
  const rejected: Record<string, number> = {};
  let completed = 0;
  let out = 0;
  let sloRequests = 0;
  let sloMet = 0;
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (const [i, r] of recs.entries()) {
    const m = requestMetrics(r, false);
    const tags = specs[i].tags;
    first = Math.min(first, r.start);
    if (m.ok) {
      completed++;
      out += m.tokensOut;
      last = Math.max(last, r.end);
      if (m.ttft !== undefined) ttfts.push(m.ttft);
    } else {
      const k = rejectionKey(r);
      rejected[k] = (rejected[k] ?? 0) + 1;
    }
    if (tags?.sloTtftMs !== undefined || tags?.sloTpotMs !== undefined) {
      sloRequests++;
      const ttftOk =
        tags.sloTtftMs === undefined || (m.ttft !== undefined && m.ttft * 1000 <= tags.sloTtftMs);
      const tpotOk = tags.sloTpotMs === undefined || m.tpot === undefined || m.tpot * 1000 <= tags.sloTpotMs;
      if (m.ok && ttftOk && tpotOk) sloMet++;
    }
  }
  ttfts.sort((a, b) => a - b);
  const window = last > first ? last - first : 0;
  return {
    group,
    requests: recs.length,
    completed,
    rejected,
    requests_per_s: window > 0 ? completed / window : null,
    output_tokens_per_s: window > 0 ? out / window : null,
    ttft_p50_s: percentile(ttfts, 50) ?? null,
    ttft_p90_s: percentile(ttfts, 90) ?? null,
    slo_requests: sloRequests,
    slo_met: sloMet,
    slo_attainment: sloRequests > 0 ? sloMet / sloRequests : null,
  };
}

/**
 * The breakdown of `records` (any order; matched to `specs` by id; warm-up requests left out), or
 * null when no request carries tags. `objectives` (name → priority) labels and orders the priority
 * groups "name (priority)", highest first; null (the bench, which cannot see the gateway's
 * InferenceObjectives): by objective name alone.
 */
export function breakdown(
  records: readonly RequestRecord[],
  specs: readonly RequestSpec[],
  objectives: ObjectivePriorities | null = null,
): Breakdown | null {
  if (!specs.some((s) => s.tags !== undefined)) return null;
  const byId = new Map(specs.map((s) => [s.id, s]));
  const groups = (key: (s: RequestSpec) => string, order: (a: string, b: string) => number) => {
    const m = new Map<string, { recs: RequestRecord[]; specs: RequestSpec[] }>();
    for (const r of records) {
      const s = byId.get(r.id);
      if (s === undefined || r.warmup) continue;
      const k = key(s);
      let g = m.get(k);
      if (!g) m.set(k, (g = { recs: [], specs: [] }));
      g.recs.push(r);
      g.specs.push(s);
    }
    return [...m.entries()].sort(([a], [b]) => order(a, b)).map(([k, g]) => groupFigures(k, g.recs, g.specs));
  };
  const byName = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  const prioLabel = (s: RequestSpec) =>
    objectives === null
      ? (s.tags?.objective ?? "(none)")
      : `${s.tags?.objective ?? "(none)"} (${priorityOf(objectives, s.tags?.objective)})`;
  const prioOf = (label: string) => Number(/\((-?\d+)\)$/.exec(label)?.[1] ?? 0);
  const streamOrder = new Map<string, number>();
  for (const s of specs)
    if (s.tags && !streamOrder.has(s.tags.stream)) streamOrder.set(s.tags.stream, streamOrder.size);
  return {
    by_tenant: groups((s) => s.tags?.tenant ?? "(none)", byName),
    by_priority: groups(prioLabel, (a, b) => prioOf(b) - prioOf(a) || byName(a, b)),
    by_stream: groups(
      (s) => s.tags?.stream ?? "(untagged)",
      (a, b) => (streamOrder.get(a) ?? 1e9) - (streamOrder.get(b) ?? 1e9),
    ),
  };
}

const s3 = (x: number | null) => (x === null ? "-" : x.toFixed(3));
const f1 = (x: number | null) => (x === null ? "-" : x.toFixed(1));

/** llm-d's request headers for a request's tags (the bench sends them; mix.ts explains each). */
export function tagHeaders(spec: RequestSpec): Record<string, string> {
  const t = spec.tags;
  if (t === undefined) return {};
  return {
    ...(t.tenant !== undefined ? { "x-gateway-inference-fairness-id": t.tenant } : {}),
    ...(t.objective !== undefined ? { "x-gateway-inference-objective": t.objective } : {}),
    ...(t.sloTtftMs !== undefined ? { "x-llm-d-slo-ttft-ms": String(t.sloTtftMs) } : {}),
    ...(t.sloTpotMs !== undefined ? { "x-llm-d-slo-tpot-ms": String(t.sloTpotMs) } : {}),
  };
}

/** The breakdown as three text tables (per tenant, per priority, per stream). */
export function formatBreakdown(b: Breakdown): string {
  const rows = (gs: GroupFigures[]) =>
    gs.map((g) => [
      g.group,
      `${g.completed}/${g.requests}`,
      f1(g.requests_per_s === null ? null : g.requests_per_s),
      f1(g.output_tokens_per_s),
      s3(g.ttft_p50_s),
      s3(g.ttft_p90_s),
      g.slo_attainment === null
        ? "-"
        : `${(g.slo_attainment * 100).toFixed(0)}% (${g.slo_met}/${g.slo_requests})`,
      Object.entries(g.rejected)
        .map(([k, v]) => `${v} × ${k}`)
        .join(", ") || "-",
    ]);
  const head = (first: string) => [
    first,
    "served",
    "req/s",
    "out tok/s",
    "TTFT p50",
    "p90",
    "SLO met",
    "rejected",
  ];
  return [
    "per tenant:",
    table(head("tenant"), rows(b.by_tenant)),
    "per priority:",
    table(head("objective (priority)"), rows(b.by_priority)),
    "per stream:",
    table(head("stream"), rows(b.by_stream)),
  ].join("\n");
}
