/**
 * Text output of `kvgate simulate`, pure: a section per router (summary and per-stage table), a
 * comparison across routers, and the workload's theoretical limits to read them against.
 */
import { table } from "../../bench/format.ts";
import type { Limits, RegimeLimit } from "./limits.ts";
import type { RouterOutcome, SimResults, SimRun } from "./simulate.ts";

const fix = (v: number | null | undefined, d = 2) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(d);
const ms = (v: number | null | undefined) => (v === null || v === undefined ? "-" : (v * 1000).toFixed(1));
const pct = (v: number | null | undefined) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : `${(v * 100).toFixed(1)}%`;
const int = (v: number | null | undefined) =>
  v === null || v === undefined || !Number.isFinite(v) ? "-" : Math.round(v).toLocaleString("en-US");

const HEAD = ["router", "out tok/s", "TTFT p50 s", "p90 s", "p99 s", "TPOT p50 ms", "E2E p50 s", "hit rate"];

function row(r: SimRun): string[] {
  return [
    r.router,
    int(r.output_tokens_per_s),
    fix(r.ttft_p50_s, 3),
    fix(r.ttft_p90_s, 3),
    fix(r.ttft_p99_s, 3),
    ms(r.tpot_p50_s),
    fix(r.e2e_p50_s, 2),
    pct(r.prefix_cache_hit_rate),
  ];
}

/** One router's section: headline figures and, for staged workloads, a row per stage. */
export function formatRouter(o: RouterOutcome): string {
  const r = o.run;
  const sim = r.simulation as { end_time_s: number; steps: number; dropped: number };
  const lines = [
    `== router ${r.router} (${r.router_config.source})`,
    `${r.requests} requests, ${r.completed} completed, ${r.errors} dropped` +
      `${
        Object.keys(r.errors_by_kind).length
          ? ` (${Object.entries(r.errors_by_kind)
              .map(([k, v]) => `${k} ${v}`)
              .join(", ")})`
          : ""
      }` +
      `; ${fix(sim.end_time_s, 1)} simulated s, ${int(sim.steps)} engine steps; wall ${fix(o.wallSeconds, 1)} s (cpu ${fix(o.cpuSeconds, 1)} s)`,
    table(
      [...HEAD, "preemptions", "KV mean/peak"],
      [
        [
          ...row(r),
          int(r.fleet?.preemptions),
          `${pct(r.fleet?.kv_usage_mean)}/${pct(r.fleet?.kv_usage_peak)}`,
        ],
      ],
    ),
  ];
  if (r.stages.length > 0) {
    lines.push(
      "",
      table(
        [
          "stage",
          "QPS",
          "reqs",
          "out tok/s",
          "steady",
          "TTFT p50 s",
          "p90 s",
          "p99 s",
          "TPOT p50 ms",
          "E2E p50 s",
          "hit",
        ],
        r.stages.map((s) => [
          `${s.index}${s.warmup ? " (warm-up)" : ""}`,
          fix(s.rate, 0),
          String(s.requests),
          int(s.output_tokens_per_s),
          int(s.steady_output_tokens_per_s),
          fix(s.ttft_p50_s, 3),
          fix(s.ttft_p90_s, 3),
          fix(s.ttft_p99_s, 3),
          ms(s.tpot_p50_s),
          fix(s.e2e_p50_s, 2),
          pct((s as { prefix_cache_hit_rate?: number | null }).prefix_cache_hit_rate),
        ]),
      ),
    );
  }
  return lines.join("\n");
}

/** All routers side by side, with output throughput as a share of the best ceiling. */
export function formatComparison(res: SimResults): string {
  const ceiling = Math.max(...Object.values(res.limits.regimes).map((g) => g.output_tokens_per_s));
  const wall = new Map(res.wall_clock.routers.map((w) => [w.router, w]));
  return table(
    [...HEAD, "preempt", "of ceiling", "wall s", "cpu s"],
    res.runs.map((r) => [
      ...row(r),
      int(r.fleet?.preemptions),
      pct((r.output_tokens_per_s ?? 0) / ceiling),
      fix(wall.get(r.router)?.wall_s, 1),
      fix(wall.get(r.router)?.cpu_s, 1),
    ]),
  );
}

function regimeRow(name: string, g: RegimeLimit): string[] {
  return [
    name,
    pct(g.prefix_hit_rate),
    int(g.uncached_prompt_tokens_mean),
    fix(g.prefill_requests_per_s, 1),
    int(g.prefill_output_tokens_per_s),
    `${int(g.resident_tokens_per_replica)}${g.resident_fits ? "" : " (does not fit)"}`,
    int(g.concurrency_per_replica),
    ms(g.decode_step_s),
    int(g.decode_output_tokens_per_s),
    int(g.output_tokens_per_s),
  ];
}

/** The limits (see limits.ts for the definitions). */
export function formatLimits(l: Limits): string {
  return [
    `limits: ${l.replicas} replicas × ${int(l.kv_tokens_per_replica)} KV tokens; ${l.requests} requests, ` +
      `mean prompt ${int(l.prompt_tokens_mean)} and output ${int(l.output_tokens_mean)} tokens; prefill ` +
      `${int(l.prefill_tokens_per_s_per_replica)} tok/s per replica (${int(l.prefill_chunk_tokens)}-token chunk in ${ms(l.prefill_chunk_s)} ms)`,
    table(
      [
        "prefix reuse",
        "hit rate",
        "uncached/req",
        "prefill req/s",
        "prefill-bound out tok/s",
        "resident/replica",
        "live/replica",
        "decode step ms",
        "decode-bound out tok/s",
        "ceiling out tok/s",
      ],
      [
        regimeRow("none", l.regimes.zero),
        regimeRow("group prefix", l.regimes.group),
        regimeRow("all repeats", l.regimes.repeat),
      ],
    ),
    "(group prefix: every request but each group's first reuses its group's shared prefix; all repeats: " +
      "every block seen before is reused, infinite KV)",
  ].join("\n");
}
