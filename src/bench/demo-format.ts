/**
 * The demo's text summary, pure: live round-robin and kvgate beside the fleet simulator's
 * prediction for the same fleet and workload, the ratios, how far live and simulated agree, where
 * the gain comes from, and a warning when the replicas could not keep up with their time scale.
 * Every figure is the results file's own (one definition: output tokens/s and req/s are over the
 * window from the first send to the last stream end), so the report shows the same numbers.
 */
import { table } from "./format.ts";
import { aggregateSet, type RequestRecord } from "./metrics.ts";
import type { RunResult } from "./results.ts";

export interface DemoPhase {
  router: "round-robin" | "kvgate";
  run: RunResult;
  records: RequestRecord[];
  /** Max simulated seconds each replica's delivery ran behind its modelled timeline. */
  replicaLagMaxS: number[];
  wallSeconds: number;
  /** CPU seconds each part used while the requests ran (null: not readable here), and that wall time. */
  cpu?: CpuUse;
}

export interface CpuUse {
  wallS: number;
  replicasS: number | null;
  /** The gateway process; null in the round-robin phase, which has none. */
  gatewayS: number | null;
  /**
   * The demo's own process: the load generator reading every stream. Null when both phases ran at
   * once: one process drove both, so its CPU is reported once (ClientCpu).
   */
  clientS: number | null;
}

/** The load generator's CPU while both phases ran side by side. */
export interface ClientCpu {
  wallS: number;
  cpuS: number;
}

/**
 * One line per phase: the cores each part kept busy on average while the requests ran, against
 * the machine's. The live TTFT includes any wait for a core, and only the kvgate phase has a
 * gateway relaying every token, so this is where a busy machine shows.
 */
export function cpuLines(phases: DemoPhase[], cores: number, client?: ClientCpu): string[] {
  const c = (s: number | null, wall: number) => (s === null ? "-" : (s / wall).toFixed(2));
  const lines = phases.flatMap((p) => {
    if (!p.cpu) return [];
    const { wallS, replicasS, gatewayS, clientS } = p.cpu;
    const parts = [
      `replicas ${c(replicasS, wallS)}`,
      gatewayS === null ? "no gateway" : `gateway ${c(gatewayS, wallS)}`,
      ...(clientS === null ? [] : [`client ${c(clientS, wallS)}`]),
    ];
    const total = (replicasS ?? 0) + (gatewayS ?? 0) + (clientS ?? 0);
    return [
      `CPU while ${p.router} ran (cores busy on average over ${wallS.toFixed(1)} wall s): ${parts.join(", ")}; ` +
        `${(total / wallS).toFixed(2)} of ${cores} cores`,
    ];
  });
  if (client !== undefined) {
    // Side by side: the phases' own cores add up, the load generator drove both.
    const all = phases.reduce((a, p) => a + (p.cpu?.replicasS ?? 0) + (p.cpu?.gatewayS ?? 0), client.cpuS);
    lines.push(
      `the load generator drove both phases at once: client ${c(client.cpuS, client.wallS)} over ` +
        `${client.wallS.toFixed(1)} wall s; everything together ${c(all, client.wallS)} of ${cores} cores`,
    );
  }
  return lines;
}

export interface Side {
  run: RunResult;
  records: RequestRecord[];
  /** A prediction's every draw of the send jitter (demo-predict.ts); `run` is the median one. */
  draws?: RunResult[];
}

/** Replica lag (simulated s) past which the live figures are not trusted to match the model. */
export const LAG_WARN_S = 0.25;

const fmt = (x: number | null | undefined, digits = 2): string =>
  x === null || x === undefined || !Number.isFinite(x) ? "-" : x.toFixed(digits);
const pct = (x: number | null | undefined): string =>
  x === null || x === undefined || !Number.isFinite(x) ? "-" : `${(x * 100).toFixed(1)}%`;
const mtok = (x: number | null): string => (x === null ? "-" : `${(x / 1e6).toFixed(2)}M`);

/**
 * TTFT p90 of the warm-up requests (each user's first question, whose 6,000-token system prompt no
 * replica has seen): sent and counted in the hit rate, but not in the measured figures.
 */
export function warmupTtftP90(side: Side): number | null {
  const warm = side.records.filter((r) => r.warmup);
  return warm.length ? aggregateSet(warm).ttft.p90 : null;
}

/** Prompt tokens the replicas had to prefill: prompt tokens × (1 − fleet prefix-cache hit rate). */
export function uncachedPromptTokens(run: RunResult): number | null {
  return run.prefix_cache_hit_rate === null ? null : run.input_tokens * (1 - run.prefix_cache_hit_rate);
}

const ratio = (x: number | null | undefined, y: number | null | undefined) =>
  x && y ? `${(x / y).toFixed(2)}x` : "-";

/** "N.NNx better" when kvgate's latency `kv` is below round-robin's `rr`, else "N.NNx worse" (never "0.53x better"). */
export function latencyVerdict(rr: number | null | undefined, kv: number | null | undefined): string {
  if (!rr || !kv) return "-";
  return rr >= kv ? `${(rr / kv).toFixed(2)}x better` : `${(kv / rr).toFixed(2)}x worse`;
}

/** Relative difference of live from simulated, e.g. "+3.1%". */
export function relDiff(live: number | null, sim: number | null): number | null {
  return live === null || sim === null || sim === 0 ? null : (live - sim) / sim;
}

/**
 * How far `live` lies outside the range of the predicted draws `sims`, relative to the nearer end:
 * 0 inside it, e.g. +0.031 above it. With one draw, relDiff against it.
 */
export function offRange(live: number | null, sims: Array<number | null>): number | null {
  const xs = sims.filter((x): x is number => x !== null && Number.isFinite(x));
  if (live === null || xs.length === 0) return null;
  const lo = Math.min(...xs);
  const hi = Math.max(...xs);
  if (live < lo) return relDiff(live, lo);
  if (live > hi) return relDiff(live, hi);
  return 0;
}

const signed = (d: number | null) => (d === null ? "-" : `${d >= 0 ? "+" : ""}${(d * 100).toFixed(1)}%`);

interface Row {
  name: string;
  value: (s: Side) => string;
  /** The number compared between live and simulated, if any, and how to print one. */
  compare?: (run: RunResult) => number | null;
  show?: (x: number) => string;
}

export function demoSummary(
  phases: DemoPhase[],
  predictions: Side[],
  o: { timeScale: number; cores?: number; client?: ClientCpu },
): string {
  const [rr, kv] = phases;
  const [srr, skv] = predictions;
  const sim = predictions.length === 2;
  const rows: Row[] = [
    { name: "requests ok / errors", value: (s) => `${s.run.completed} / ${s.run.errors}` },
    {
      name: "output tokens/s",
      value: (s) => fmt(s.run.output_tokens_per_s, 0),
      compare: (r) => r.output_tokens_per_s,
      show: (x) => fmt(x, 0),
    },
    { name: "req/s", value: (s) => fmt(s.run.requests_per_s, 2) },
    { name: "TTFT p50 (s)", value: (s) => fmt(s.run.ttft_p50_s, 3) },
    {
      name: "TTFT p90 (s)",
      value: (s) => fmt(s.run.ttft_p90_s, 3),
      compare: (r) => r.ttft_p90_s,
      show: (x) => fmt(x, 3),
    },
    { name: "TTFT p99 (s)", value: (s) => fmt(s.run.ttft_p99_s, 3) },
    { name: "TTFT p90, warm-up (s)", value: (s) => fmt(warmupTtftP90(s), 3) },
    { name: "TPOT p50 (ms)", value: (s) => fmt((s.run.tpot_p50_s ?? Number.NaN) * 1000, 1) },
    { name: "E2E p50 (s)", value: (s) => fmt(s.run.e2e_p50_s, 2) },
    {
      name: "prefix-cache hit rate (all)",
      value: (s) => pct(s.run.prefix_cache_hit_rate),
      compare: (r) => r.prefix_cache_hit_rate,
      show: pct,
    },
    { name: "prompt tokens prefilled", value: (s) => mtok(uncachedPromptTokens(s.run)) },
    { name: "run length (sim s)", value: (s) => fmt(s.run.window_s, 1) },
  ];
  const sides: Array<[string, Side | undefined]> = [
    ["round-robin", rr],
    ...(sim ? ([["  simulated", srr]] as Array<[string, Side]>) : []),
    ["kvgate", kv],
    ...(sim ? ([["  simulated", skv]] as Array<[string, Side]>) : []),
  ];
  const lags = phases.map((p) => Math.max(...p.replicaLagMaxS.map((x) => (Number.isNaN(x) ? 0 : x))));
  const body = rows.map((r) => [r.name, ...sides.map(([, s]) => (s ? r.value(s) : "-"))]);
  body.push([
    "max replica lag (sim s)",
    ...sides.map(([n], i) => (n.startsWith(" ") ? "-" : fmt(lags[i === 0 ? 0 : 1], 3))),
  ]);
  const lines = [
    "Simulated seconds throughout. Measured: each user's questions after the first (the first, warm-up, is",
    "cold for any router: no replica has seen that user's system prompt). output tokens/s and req/s: measured",
    "work over their window (first send to last stream end). Hit rate and lag: the whole run, warm-up included.",
    table(["", ...sides.map(([n]) => n)], body),
    "",
  ];
  const gain = (a: Side, b: Side) =>
    `output tokens/s ${ratio(b.run.output_tokens_per_s, a.run.output_tokens_per_s)}, ` +
    `TTFT p90 ${latencyVerdict(a.run.ttft_p90_s, b.run.ttft_p90_s)} ` +
    `(warm-up TTFT p90: ${fmt(warmupTtftP90(a), 3)} vs ${fmt(warmupTtftP90(b), 3)} s)`;
  lines.push(`kvgate vs round-robin, live:      ${gain(rr, kv)}`);
  if (sim) lines.push(`kvgate vs round-robin, simulated: ${gain(srr, skv)}`);
  if (sim) {
    const compared = rows.filter((r) => r.compare);
    const draws = Math.max(srr.draws?.length ?? 1, skv.draws?.length ?? 1);
    const sims = (s: Side, r: Row) => (s.draws ?? [s.run]).map((run) => r.compare!(run));
    if (draws > 1) {
      const span = (s: Side, r: Row) => {
        const xs = sims(s, r).filter((x): x is number => x !== null);
        if (xs.length === 0) return "-";
        const [lo, hi] = [r.show!(Math.min(...xs)), r.show!(Math.max(...xs))];
        return lo === hi ? lo : `${lo}–${hi}`;
      };
      lines.push(
        `simulated over ${draws} draws of the order in which users' sends leave the client (the columns: the median draw by output tokens/s), ` +
          `round-robin / kvgate: ${compared.map((r) => `${r.name} ${span(srr, r)} / ${span(skv, r)}`).join("; ")}`,
      );
    }
    const diffs = compared.map((r) => ({
      name: r.name,
      d: [offRange(r.compare!(rr.run), sims(srr, r)), offRange(r.compare!(kv.run), sims(skv, r))],
    }));
    const off = (d: number | null) => (draws > 1 && d === 0 ? "in range" : signed(d));
    const worst = Math.max(...diffs.flatMap((x) => x.d.map((v) => Math.abs(v ?? 0))));
    const what = draws > 1 ? `, how far outside the ${draws} draws' range` : "";
    lines.push(
      `live vs simulated (round-robin / kvgate)${what}: ${diffs.map((x) => `${x.name} ${off(x.d[0])} / ${off(x.d[1])}`).join("; ")}` +
        (worst <= 0.1 ? " (all within 10%)" : ` (WARNING: up to ${(worst * 100).toFixed(0)}% apart)`),
    );
  }
  lines.push(whereFrom(rr.run, kv.run));
  if (o.cores !== undefined) lines.push(...cpuLines(phases, o.cores, o.client));
  const lag = Math.max(...lags);
  if (lag > LAG_WARN_S)
    lines.push(
      `WARNING: a replica ran up to ${lag.toFixed(2)} simulated s behind its modelled timeline (kvgate:sim_lag_max_seconds): ` +
        `this machine could not keep up at ${o.timeScale}x, so live latencies are inflated. Re-run with a lower --time-scale or on a less loaded machine.`,
    );
  return lines.join("\n");
}

/** One line: the hit rates, the prefill they saved, and what that did to queueing and run length. */
export function whereFrom(rr: RunResult, kv: RunResult): string {
  const a = uncachedPromptTokens(rr);
  const b = uncachedPromptTokens(kv);
  const saved =
    a !== null && b !== null && a > 0 ? `${mtok(a - b)} (${((1 - b / a) * 100).toFixed(0)}%) fewer` : "-";
  return (
    `where the gain comes from: prefix-cache hit rate ${pct(kv.prefix_cache_hit_rate)} vs ${pct(rr.prefix_cache_hit_rate)}, ` +
    `so kvgate's replicas prefilled ${saved} prompt tokens (${mtok(b)} vs ${mtok(a)}); ` +
    `TTFT p50 went ${fmt(rr.ttft_p50_s, 3)} -> ${fmt(kv.ttft_p50_s, 3)} s and TPOT p50 ` +
    `${fmt((rr.tpot_p50_s ?? Number.NaN) * 1000, 1)} -> ${fmt((kv.tpot_p50_s ?? Number.NaN) * 1000, 1)} ms (steps spent on decoding), ` +
    `and the run took ${fmt(kv.window_s, 1)} instead of ${fmt(rr.window_s, 1)} simulated s ` +
    `(${kv.completed} vs ${rr.completed} answers completed).`
  );
}
