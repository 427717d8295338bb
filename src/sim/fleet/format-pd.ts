/**
 * The fleet-comparison table of `kvgate simulate`, pure: one row per run (per measured stage when
 * there are several) with its fleet (pools,
 * GPUs), output tokens/s, TTFT p50/p90, TPOT p50, E2E p50, goodput under the scenario's SLO, and
 * for P/D fleets the share of requests disaggregated and the KV transfer's median and mean (ask
 * to landing: handshake, NIC queue, wire and overhead; warm-up transfers included). Printed when runs
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
  transfer_p50_s: number | null;
  handshakes: number;
  /** With regions: transfers whose decoder and prefiller sat in different regions, and their bytes. */
  cross_region_transfers?: number;
  cross_region_bytes?: number;
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
  interface Figures {
    output_tokens_per_s: number | null;
    ttft_p50_s: number | null;
    ttft_p90_s: number | null;
    tpot_p50_s: number | null;
    e2e_p50_s: number | null;
    goodput?: { fraction: number | null; requests_per_s: number | null };
  }
  const rows: string[][] = [];
  for (const r of res.runs) {
    const s = sim(r);
    const pd = s.pd;
    const n = pd ? pd.disaggregated + pd.decode_only : 0;
    // Per measured stage when the workload has several, else the run's figures.
    const stages = r.stages.filter((st) => !st.warmup);
    const parts: [string, Figures][] =
      stages.length > 1
        ? stages.map((st) => [fix(st.rate, 0), st])
        : [[stages.length === 1 ? fix(stages[0].rate, 0) : "-", r]];
    for (const [qps, f] of parts) {
      const g = f.goodput;
      rows.push([
        r.router,
        fleetLabel(s.pools ?? []),
        String(s.gpus ?? "-"),
        qps,
        int(f.output_tokens_per_s),
        fix(f.ttft_p50_s, 3),
        fix(f.ttft_p90_s, 3),
        fix(f.tpot_p50_s === null ? null : f.tpot_p50_s * 1000, 1),
        fix(f.e2e_p50_s, 2),
        g ? `${fix((g.fraction ?? 0) * 100, 1)}% (${fix(g.requests_per_s, 1)}/s)` : "-",
        pd && n > 0 ? `${fix((pd.disaggregated / n) * 100, 0)}%` : "-",
        pd?.transfer_p50_s != null
          ? `${fix(pd.transfer_p50_s * 1000, 1)} / ${fix((pd.transfer_mean_s ?? 0) * 1000, 1)}`
          : "-",
      ]);
    }
  }
  return [
    `fleets compared${sloText ? ` (goodput: share and rate of requests with ${sloText})` : ""}`,
    table(
      [
        "run",
        "fleet",
        "GPUs",
        "QPS",
        "out tok/s",
        "TTFT p50 s",
        "p90 s",
        "TPOT p50 ms",
        "E2E p50 s",
        "goodput",
        "P/D",
        "KV xfer p50/mean ms",
      ],
      rows,
    ),
  ].join("\n");
}
