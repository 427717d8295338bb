/**
 * The per-region table of `kvgate simulate` for scenarios with a locality section, pure: one row per
 * router and region of origin — requests, share served in their own region, output tokens/s,
 * TTFT p50/p90/p99 (the cross-region hop included both ways) and the share meeting the SLO.
 */
import { table } from "../../bench/format.ts";
import type { SimResults } from "./simulate.ts";

const fix = (v: number | null | undefined, d: number) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(d);
const pct = (v: number | null | undefined) =>
  v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)}%`;

export function formatLocality(res: SimResults): string {
  const rows: string[][] = [];
  for (const run of res.runs)
    for (const o of run.locality ?? [])
      rows.push([
        run.router,
        o.origin,
        String(o.requests),
        String(o.errors),
        pct(o.local_share),
        fix(o.output_tokens_per_s, 0),
        fix(o.ttft_p50, 3),
        fix(o.ttft_p90, 3),
        fix(o.ttft_p99, 3),
        pct(o.slo_attainment),
      ]);
  if (rows.length === 0) return "";
  return `== by region of origin\n${table(
    [
      "router",
      "origin",
      "requests",
      "errors",
      "served locally",
      "out tok/s",
      "TTFT p50",
      "p90",
      "p99",
      "SLO met",
    ],
    rows,
  )}`;
}
