/**
 * Text output of `kvgate simulate`, pure: a section per router (summary and per-stage table), a
 * comparison across routers, and the workload's theoretical limits to read them against.
 */
import { table } from "../../bench/format.ts";
import type { Limits, RegimeLimit } from "./limits.ts";
import type { StorageSummary } from "./shared-storage.ts";
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
  const st = (r.simulation as { shared_storage?: StorageSummary }).shared_storage;
  if (st !== undefined)
    lines.push(
      `shared storage: ${int(st.written_chunks)} chunks written, ${int(st.read_chunks)} read, ${int(st.evicted_chunks)} dropped ` +
        `(${int(st.chunks)} of ${int(st.capacity_chunks)} held); prompt tokens loaded from storage ${int(st.storage_hit_tokens)}, from CPU ${int(st.cpu_hit_tokens)}`,
    );
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

/** The fleet's ceiling: the best regime's (limits.ts), output tokens/s. */
export function fleetCeiling(l: Limits): number {
  return Math.max(...Object.values(l.regimes).map((g) => g.output_tokens_per_s));
}

/**
 * A stage's ceiling: the fleet's, or the stage's offered output (rate × mean output tokens) when
 * that is lower. A stage is saturated when its offered output reaches the fleet's ceiling.
 */
export function stageCeiling(l: Limits, rate: number): { ceiling: number; saturated: boolean } {
  const fleet = fleetCeiling(l);
  const offered = rate * l.output_tokens_mean;
  return { ceiling: Math.min(fleet, offered), saturated: offered >= fleet };
}

/**
 * All routers side by side, with output throughput as a share of the best ceiling; "cached" is the
 * share of prompt tokens served from any KV tier (cached_tokens), "hit rate" the GPU prefix cache's.
 */
export function formatComparison(res: SimResults): string {
  const wall = new Map(res.wall_clock.routers.map((w) => [w.router, w]));
  return table(
    [...HEAD, "cached", "preempt", "of ceiling", "wall s", "cpu s"],
    res.runs.map((r) => [
      ...row(r),
      pct(r.cached_token_rate),
      int(r.fleet?.preemptions),
      pct((r.output_tokens_per_s ?? 0) / fleetCeiling(r.limits ?? res.limits)),
      fix(wall.get(r.router)?.wall_s, 1),
      fix(wall.get(r.router)?.cpu_s, 1),
    ]),
  );
}

/**
 * Per saturated stage (offered output ≥ the fleet's ceiling), each router's output tokens/s as a
 * share of the stage's ceiling: the fleet's steady-state one, or for a barriered stage its own bound
 * with the ramp-up counted (limits.stages, stage-limits.ts) when that is lower; and beside it, where
 * the limits have one, its share of the stage's even share (even-share.ts: the engines themselves
 * with the stage dealt evenly and every reusable block a hit, what routing can reach). "" when the
 * workload has no saturated stage.
 */
export function formatSaturatedStages(res: SimResults): string {
  const first = res.runs[0];
  if (first === undefined) return "";
  const stages = first.stages.filter((s) => !s.warmup && stageCeiling(res.limits, s.rate).saturated);
  if (stages.length === 0) return "";
  const ceiling = fleetCeiling(res.limits);
  const stageOf = (l: Limits, index: number) => l.stages?.find((b) => b.index === index);
  const bound = (index: number) =>
    Math.min(ceiling, stageOf(res.limits, index)?.output_tokens_per_s ?? ceiling);
  const staged = res.limits.stages !== undefined;
  const even = stages.some(
    (st) => stageOf(res.limits, st.index)?.even_share_output_tokens_per_s !== undefined,
  );
  const rows = stages.map((st) => [
    `${st.index}`,
    fix(st.rate, 0),
    ...(staged ? [int(bound(st.index))] : []),
    ...(even ? [int(stageOf(res.limits, st.index)?.even_share_output_tokens_per_s)] : []),
    ...res.runs.map((r) => {
      const s = r.stages.find((x) => x.index === st.index);
      // A run with its own fleet is read against its fleet's ceiling and stage bounds.
      const lim = r.limits ?? res.limits;
      const b = stageOf(lim, st.index);
      const c = Math.min(
        fleetCeiling(lim),
        b?.output_tokens_per_s ?? Number.POSITIVE_INFINITY,
        st.rate * res.limits.output_tokens_mean,
      );
      const out = s?.output_tokens_per_s;
      if (out == null) return "-";
      const e = b?.even_share_output_tokens_per_s;
      return even ? `${pct(out / c)} · ${e ? pct(out / e) : "-"}` : pct(out / c);
    }),
  ]);
  const own = res.runs.some((r) => r.limits !== undefined && r.limits !== res.limits);
  return [
    (staged
      ? `saturated stages (offered ≥ ceiling ${int(ceiling)} out tok/s): output tokens/s as a share of the stage's bound (its ramp-up counted: stages are barriered)`
      : `saturated stages (offered ≥ ceiling ${int(ceiling)} out tok/s): output tokens/s as a share of the ceiling`) +
      (even
        ? " · and of the even share (the engines themselves, each replica an equal share of the stage, every reusable block a hit: what routing can reach)"
        : "") +
      (own ? " (each run's own fleet's ceiling, capped at the stage's offered output)" : ""),
    table(
      [
        "stage",
        "QPS",
        ...(staged ? ["bound"] : []),
        ...(even ? ["even share"] : []),
        ...res.runs.map((r) => r.router),
      ],
      rows,
    ),
  ].join("\n");
}

interface Ranked {
  value: number;
  rank: number;
  best: SimRun;
}

/** Rank of `r` among runs by `metric` (1 = best); `higher` says which way is better. */
function ranked(
  runs: SimRun[],
  r: SimRun,
  metric: (x: SimRun) => number | null,
  higher: boolean,
): Ranked | null {
  const v = metric(r);
  if (v === null || !Number.isFinite(v)) return null;
  const vals = runs.map((x) => ({ x, v: metric(x) })).filter((e) => e.v !== null && Number.isFinite(e.v));
  vals.sort((a, b) => (higher ? (b.v as number) - (a.v as number) : (a.v as number) - (b.v as number)));
  const rank = 1 + vals.filter((e) => (higher ? (e.v as number) > v : (e.v as number) < v)).length;
  return { value: v, rank, best: vals[0].x };
}

/** value against best: "+12.3%" / "-4.0%", or "3.2×" once it is twice as large or more. */
function rel(value: number, best: number): string {
  if (best === 0) return "";
  const ratio = value / best;
  if (ratio >= 2) return `${ratio.toFixed(1)}×`;
  const d = (ratio - 1) * 100;
  return `${d >= 0 ? "+" : ""}${d.toFixed(1)}%`;
}

/**
 * One line per router: where it ranks on output tokens/s and TTFT p90/p99 (against the best
 * router on each), and the fleet figures that explain it — prefix-cache hit rate, preemptions
 * and KV spread (mean of max − min KV usage across replicas at each scrape).
 */
const out = (x: SimRun) => x.output_tokens_per_s;
const ttft90 = (x: SimRun) => x.ttft_p90_s;
const ttft99 = (x: SimRun) => x.ttft_p99_s;
const secs = (v: number) => `${fix(v, 3)} s`;

export function formatVerdicts(res: SimResults): string {
  const runs = res.runs;
  if (runs.length < 2) return "";
  const spread = (r: SimRun) =>
    r.fleet?.kv_usage_max != null && r.fleet?.kv_usage_min != null
      ? r.fleet.kv_usage_max - r.fleet.kv_usage_min
      : null;
  const lines = runs.map((r) => {
    const tput = ranked(runs, r, out, true);
    const p90 = ranked(runs, r, ttft90, false);
    const p99 = ranked(runs, r, ttft99, false);
    const part = (
      label: string,
      k: Ranked | null,
      metric: (x: SimRun) => number | null,
      f: (v: number) => string,
    ) => {
      if (k === null) return `${label} -`;
      if (k.rank === 1) return `${label} ${f(k.value)} (best)`;
      return `${label} ${f(k.value)} (#${k.rank}, ${rel(k.value, metric(k.best) ?? 0)} vs ${k.best.router})`;
    };
    const why: string[] = [];
    const hits = runs.map((x) => x.prefix_cache_hit_rate ?? 0);
    const bestHit = Math.max(...hits);
    const hit = r.prefix_cache_hit_rate ?? 0;
    if (bestHit > 0)
      why.push(`hit rate ${pct(hit)}${hit < bestHit - 0.005 ? ` (best ${pct(bestHit)})` : ""}`);
    const pre = r.fleet?.preemptions ?? 0;
    const minPre = Math.min(...runs.map((x) => x.fleet?.preemptions ?? 0));
    why.push(`${int(pre)} preemptions${pre > minPre ? ` (fewest ${int(minPre)})` : ""}`);
    const sp = spread(r);
    if (sp !== null) why.push(`KV spread ${(sp * 100).toFixed(1)} pts`);
    return `${r.router}: ${[
      part("out tok/s", tput, out, int),
      part("TTFT p90", p90, ttft90, secs),
      part("TTFT p99", p99, ttft99, secs),
    ].join("; ")} — ${why.join(", ")}`;
  });
  return ["verdict:", ...lines].join("\n");
}

function regimeRow(name: string, g: RegimeLimit): string[] {
  return [
    name,
    pct(g.prefix_hit_rate),
    int(g.uncached_prompt_tokens_mean),
    fix(g.prefill_requests_per_s, 1),
    int(g.prefill_output_tokens_per_s),
    `${int(g.resident_tokens_per_replica)}${g.via_tiers !== undefined ? " (in tiers)" : g.resident_fits ? "" : " (does not fit)"}`,
    int(g.concurrency_per_replica),
    ms(g.decode_step_s),
    int(g.decode_output_tokens_per_s),
    int(g.mixed_output_tokens_per_s),
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
        "mixed-step out tok/s",
        "ceiling out tok/s",
      ],
      [
        regimeRow("none", l.regimes.zero),
        regimeRow("group prefix", l.regimes.group),
        regimeRow("all repeats", l.regimes.repeat),
      ],
    ),
    "(group prefix: every request but each group's first reuses its group's shared prefix; all repeats: " +
      "every block seen before is reused, infinite KV. mixed-step: steps that decode the live requests " +
      "and carry their share of prefill, as the engines run them; ceiling = the smallest bound)",
    ...(l.offload !== undefined ? [formatOffloadLimit(l.offload)] : []),
    ...tierLines(l),
  ].join("\n");
}

/**
 * The tier bounds of the runs whose own fleet differs from the scenario's (their "of ceiling" is read
 * against them); "" when every run uses the scenario's fleet.
 */
export function formatRunLimits(res: SimResults): string {
  const same = JSON.stringify(res.limits);
  const out: string[] = [];
  for (const r of res.runs) {
    if (r.limits === undefined || r.limits === res.limits || JSON.stringify(r.limits) === same) continue;
    const l = r.limits;
    const repeat = l.regimes.repeat;
    out.push(
      `run ${r.router}'s fleet: ceiling ${int(Math.max(...Object.values(l.regimes).map((g) => g.output_tokens_per_s)))} out tok/s` +
        ` (all repeats: ${int(repeat.output_tokens_per_s)}${repeat.via_tiers !== undefined ? ", from the tiers" : repeat.resident_fits ? "" : ", resident set does not fit"})`,
      ...(l.offload !== undefined ? [`  ${formatOffloadLimit(l.offload)}`] : []),
      ...tierLines(l).map((x) => `  ${x}`),
    );
  }
  return out.join("\n");
}

/** The shared storage's bound and each regime reached from the tiers (limits-tiers.ts). */
function tierLines(l: Limits): string[] {
  const out: string[] = [];
  const s = l.offload?.storage;
  if (s !== undefined && l.offload !== undefined)
    out.push(
      `shared storage, bandwidth-bound (every "all repeats" hit from storage): ${(s.load_bytes_per_s / 1e9).toFixed(1)} GB/s ÷ ` +
        `${int(l.offload.kv_bytes_per_token)} B/token = ${int(s.load_tokens_per_s)} tok/s for the fleet; ` +
        `${int(l.offload.hit_tokens_per_request)} hit tokens/request → ${s.requests_per_s.toFixed(2)} req/s, ` +
        `${int(s.prompt_tokens_per_s)} prompt tok/s, ${int(s.output_tokens_per_s)} out tok/s`,
    );
  for (const [name, g] of [
    ["group prefix", l.regimes.group],
    ["all repeats", l.regimes.repeat],
  ] as const) {
    const v = g.via_tiers;
    if (v === undefined) continue;
    out.push(
      `${name} from the tiers: resident set in CPU${v.storage_share > 0 ? ` and storage (${pct(v.storage_share)} of hits from storage)` : ""}, ` +
        `${int(v.resident_in_hbm_per_replica)} tokens/replica left in HBM; the links carry ${v.link_requests_per_s.toFixed(2)} req/s ` +
        `(${int(v.link_output_tokens_per_s)} out tok/s) → ceiling ${int(v.output_tokens_per_s)} out tok/s`,
    );
  }
  return out;
}

/** The CPU tier's host-link bound (limits.ts offloadLimit). */
function formatOffloadLimit(o: NonNullable<Limits["offload"]>): string {
  return (
    `CPU tier, bandwidth-bound (every "all repeats" hit from CPU): ${(o.load_bytes_per_s / 1e9).toFixed(1)} GB/s ÷ ` +
    `${int(o.kv_bytes_per_token)} B/token = ${int(o.load_tokens_per_s_per_replica)} tok/s per replica; ` +
    `${int(o.hit_tokens_per_request)} hit tokens/request → ${o.requests_per_s.toFixed(2)} req/s, ` +
    `${int(o.prompt_tokens_per_s)} prompt tok/s, ${int(o.output_tokens_per_s)} out tok/s`
  );
}
