/**
 * The fleet-comparison table of `kvgate simulate`, pure: one row per run with its fleet (pools,
 * GPUs), output tokens/s, TTFT p50/p90, TPOT p50, E2E p50, goodput under the scenario's SLO, and
 * for P/D fleets the share of requests disaggregated and the mean KV transfer. Printed when runs
 * differ in fleet, use a KV link, or the scenario sets an SLO.
 */
import { table } from "../../bench/format.ts";
import type { SimResults, SimRun } from "./simulate.ts";

/** What runFleet reports of P/D (pd.ts). */
export interface PdSummary {
  /** Requests whose prefill ran on a prefill endpoint. */
  disaggregated: number;
  /** Requests the scheduler sent to a decode endpoint alone. */
  decode_only: number;
  transfers: number;
  /** Prompt tokens whose KV crossed the link (each transfer: the prompt less the decoder's own hit). */
  transferred_tokens: number;
  bytes: number;
  /** Mean seconds from the decoder asking for the KV to its landing (handshake, queue, wire, overhead). */
  transfer_mean_s: number | null;
  handshakes: number;
  /** Σ over every replica of prompt tokens by source (vLLM prompt_tokens_by_source). */
  prompt_tokens_by_source: Record<string, number>;
}

interface PoolRow {
  replicas: number;
  profile: string;
  tensor_parallel: number;
  role: string | null;
}

const fix = (v: number | null | undefined, d: number) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(d);
const int = (v: number | null | undefined) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : Math.round(v).toLocaleString("en-US");

/** "8 P TP1 + 2 D TP4" or "16 × TP1". */
export function fleetLabel(pools: readonly PoolRow[]): string {
  return pools
    .map((p) => {
      const role = p.role === null ? "" : p.role === "prefill" ? "P " : p.role === "decode" ? "D " : "PD ";
      return `${p.replicas} ${role}TP${p.tensor_parallel}`;
    })
    .join(" + ");
}

function sim(r: SimRun) {
  return r.simulation as { pools?: PoolRow[]; gpus?: number; pd?: PdSummary };
}

/** True when the comparison table says more than the router table: fleets differ, P/D ran, or an SLO is set. */
export function wantsFleetComparison(res: SimResults): boolean {
  if ((res.scenario as { slo?: unknown }).slo !== undefined) return true;
  const labels = new Set(res.runs.map((r) => fleetLabel(sim(r).pools ?? [])));
  return labels.size > 1 || res.runs.some((r) => sim(r).pd !== undefined);
}

export function formatFleetComparison(res: SimResults): string {
  const slo = (res.scenario as { slo?: { ttft?: number; tpot?: number; e2e?: number } }).slo;
  const sloText = slo
    ? Object.entries(slo)
        .map(([k, v]) => `${k} ≤ ${k === "tpot" ? `${(v * 1000).toFixed(0)} ms` : `${v} s`}`)
        .join(", ")
    : null;
  const rows = res.runs.map((r) => {
    const s = sim(r);
    const pd = s.pd;
    const n = pd ? pd.disaggregated + pd.decode_only : 0;
    const g = r.goodput;
    return [
      r.router,
      fleetLabel(s.pools ?? []),
      String(s.gpus ?? "-"),
      int(r.output_tokens_per_s),
      fix(r.ttft_p50_s, 3),
      fix(r.ttft_p90_s, 3),
      fix(r.tpot_p50_s === null ? null : r.tpot_p50_s * 1000, 1),
      fix(r.e2e_p50_s, 2),
      g ? `${fix((g.fraction ?? 0) * 100, 1)}% (${fix(g.requests_per_s, 1)}/s)` : "-",
      pd && n > 0 ? `${fix((pd.disaggregated / n) * 100, 0)}%` : "-",
      pd?.transfer_mean_s != null ? fix(pd.transfer_mean_s * 1000, 1) : "-",
    ];
  });
  return [
    `fleets compared${sloText ? ` (goodput: share and rate of requests with ${sloText})` : ""}`,
    table(
      [
        "run",
        "fleet",
        "GPUs",
        "out tok/s",
        "TTFT p50 s",
        "p90 s",
        "TPOT p50 ms",
        "E2E p50 s",
        "goodput",
        "P/D",
        "KV xfer ms",
      ],
      rows,
    ),
  ].join("\n");
}
