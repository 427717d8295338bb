/**
 * Runs an autoscaling scenario: the same workload (same seed, same requests) through a fresh fleet
 * and scheduler once per policy, each driven by its own AutoscaleController, and sums each run up:
 * SLO attainment (the share of all requests, failures included, whose TTFT and mean inter-token
 * latency meet the objectives), GPU-hours, scaling actions, the worst TTFT p99 over fixed windows
 * of arrival time, and the pools' peak sizes. Deterministic given the scenario.
 */

import { DynamoPolicy } from "../../autoscale/baselines/dynamo.ts";
import { HpaGpuPolicy } from "../../autoscale/baselines/hpa.ts";
import { KpaPolicy } from "../../autoscale/baselines/kpa.ts";
import { WvaPolicy } from "../../autoscale/baselines/wva.ts";
import { type PoolSpec, Recommender } from "../../autoscale/recommender.ts";
import type { AutoscalePolicy, Bounds, PoolRole, Slo } from "../../autoscale/types.ts";
import { percentile } from "../../bench/metrics.ts";
import type { RequestRecord } from "../../bench/request-metrics.ts";
import { requestMetrics } from "../../bench/request-metrics.ts";
import { admissionFromConfig } from "../../flow/admission.ts";
import { ROLE_LABEL } from "../../scheduler/plugins/filters/labels.ts";
import { createScheduler } from "../../scheduler/scheduler.ts";
import { AutoscaleController, type ManagedPool, type ScalingAction, type SizePoint } from "./autoscale.ts";
import type { AutoscaleScenario, PolicyName } from "./autoscale-scenario.ts";
import { runFleet } from "./fleet.ts";
import { PromptTokenizer } from "./prompt-tokens.ts";
import type { FleetConfig } from "./replica.ts";
import { scenarioWorkload } from "./simulate.ts";

export interface PolicyResult {
  policy: string;
  requests: number;
  failed: number;
  /** Share of requests meeting both objectives. */
  attainment: number;
  meetsTarget: boolean;
  gpuHours: number;
  actions: number;
  ttftP99: number | null;
  tpotP99: number | null;
  worstWindow: { start: number; ttftP99: number } | null;
  pools: { pool: string; peakReady: number; meanReady: number }[];
  endTime: number;
  actionLog: ScalingAction[];
  sizes: SizePoint[];
  wallSeconds: number;
}

export function poolRole(cfg: FleetConfig): PoolRole {
  const r = cfg.labels[ROLE_LABEL];
  return r === "prefill" ? "prefill" : r === "decode" ? "decode" : "aggregated";
}

export function poolSpecs(sc: AutoscaleScenario): PoolSpec[] {
  return sc.base.pools.map((cfg, k) => {
    const b = sc.autoscale.pools[k];
    return {
      name: b.name,
      role: poolRole(cfg),
      profile: cfg.profile,
      limits: {
        maxNumSeqs: cfg.maxNumSeqs,
        maxNumBatchedTokens: cfg.maxNumBatchedTokens,
        kvTokens: (cfg.numGpuBlocks - 1) * cfg.blockSize,
      },
      bounds: { min: b.min, max: b.max },
    };
  });
}

export function makePolicy(
  name: PolicyName,
  pools: PoolSpec[],
  slo: Slo,
  startupDelay: number,
): AutoscalePolicy {
  const bounds = new Map<string, Bounds>(pools.map((p) => [p.name, p.bounds]));
  switch (name) {
    case "kvgate":
      return new Recommender({ pools, slo, startupDelay });
    case "wva":
      return new WvaPolicy(bounds);
    case "dynamo":
      return new DynamoPolicy(pools, slo);
    case "kpa":
      return new KpaPolicy(bounds);
    case "hpa-gpu":
      return new HpaGpuPolicy(bounds);
  }
}

/** p99 TTFT of requests arriving in each `window` seconds (a failed request counts as never served). */
export function worstTtftWindow(
  records: readonly RequestRecord[],
  window: number,
): { start: number; ttftP99: number } | null {
  const byWin = new Map<number, number[]>();
  for (const r of records) {
    const m = requestMetrics(r, false);
    const k = Math.floor(r.start / window);
    const list = byWin.get(k) ?? [];
    list.push(m.ok && m.ttft !== undefined ? m.ttft : Number.POSITIVE_INFINITY);
    byWin.set(k, list);
  }
  let worst: { start: number; ttftP99: number } | null = null;
  for (const [k, list] of byWin) {
    const p = percentile(Float64Array.from(list).sort(), 99) as number;
    if (worst === null || p > worst.ttftP99) worst = { start: k * window, ttftP99: p };
  }
  return worst;
}

export async function runAutoscaleScenario(
  sc: AutoscaleScenario,
  opts: { policies?: string[]; quick?: boolean; onDone?(r: PolicyResult): void } = {},
): Promise<PolicyResult[]> {
  const { base, autoscale: a } = sc;
  const { workload } = scenarioWorkload(base, opts.quick);
  const tokenizer = new PromptTokenizer();
  const router = base.routers[0];
  const specs = poolSpecs(sc);
  const slo: Slo = a.slo;
  const names = (opts.policies ?? a.policies) as PolicyName[];
  const out: PolicyResult[] = [];
  for (const name of names) {
    const w0 = performance.now();
    const created = await createScheduler(router.configText, { seed: base.seed });
    const { admission } = admissionFromConfig(created.config);
    const policy = makePolicy(name, specs, slo, a.startupDelay);
    const managed: ManagedPool[] = specs.map((p, k) => ({
      name: p.name,
      role: p.role,
      gpus: base.pools[k].profile.hardware.tensorParallel,
      initial: a.pools[k].initial,
    }));
    const ctl = new AutoscaleController(managed, policy, a.startupDelay, a.sampleInterval ?? 2);
    const pools = router.pools.map((p, k) => ({ ...p, replicas: a.pools[k].initial }));
    const res = runFleet({
      fleet: pools[0],
      pools,
      kvLink: router.kvLink,
      workload,
      scheduler: created.scheduler,
      admission,
      seed: base.seed,
      scrapeInterval: base.scrapeInterval,
      gatewayDelay: base.gatewayDelay,
      routerTokenizer: base.routerTokenizer,
      kvEventsDelay: base.kvEventsDelay,
      tokenizer,
      observer: ctl,
      membership: ctl,
    });
    let good = 0;
    let failed = 0;
    const ttfts: number[] = [];
    const tpots: number[] = [];
    for (const r of res.records) {
      const m = requestMetrics(r, false);
      if (!m.ok) {
        failed++;
        continue;
      }
      if (m.ttft !== undefined) ttfts.push(m.ttft);
      if (m.tpot !== undefined) tpots.push(m.tpot);
      if (m.ttft !== undefined && m.ttft <= slo.ttft && (m.tpot ?? 0) <= slo.itl) good++;
    }
    const n = res.records.length;
    const sorted = (x: number[]) => Float64Array.from(x).sort();
    const poolStats = specs.map((p) => {
      const pts = ctl.sizes.filter((s) => s.pool === p.name);
      let area = 0;
      let peak = 0;
      for (let i = 0; i < pts.length; i++) {
        const end = i + 1 < pts.length ? pts[i + 1].time : res.endTime;
        area += pts[i].ready * Math.max(0, Math.min(end, res.endTime) - pts[i].time);
        peak = Math.max(peak, pts[i].ready);
      }
      return { pool: p.name, peakReady: peak, meanReady: res.endTime > 0 ? area / res.endTime : 0 };
    });
    const attainment = n > 0 ? good / n : 0;
    const r: PolicyResult = {
      policy: name,
      requests: n,
      failed,
      attainment,
      meetsTarget: attainment >= slo.attainment,
      gpuHours: ctl.gpuSeconds(res.endTime) / 3600,
      actions: ctl.actions.length,
      ttftP99: percentile(sorted(ttfts), 99) ?? null,
      tpotP99: percentile(sorted(tpots), 99) ?? null,
      worstWindow: worstTtftWindow(res.records, a.window ?? 60),
      pools: poolStats,
      endTime: res.endTime,
      actionLog: ctl.actions,
      sizes: ctl.sizes,
      wallSeconds: (performance.now() - w0) / 1000,
    };
    out.push(r);
    opts.onDone?.(r);
  }
  return out;
}

/** The comparison table, one row per policy, and a closing line on who meets the target cheapest. */
export function formatAutoscale(sc: AutoscaleScenario, results: readonly PolicyResult[]): string {
  const a = sc.autoscale;
  const head = `| policy | SLO attainment (TTFT ≤ ${a.slo.ttft}s, ITL ≤ ${a.slo.itl * 1000}ms) | meets ${a.slo.attainment * 100}% | GPU-hours | scaling actions | worst TTFT p99 (${a.window ?? 60}s window) | TTFT p99 | ${results[0]?.pools.map((p) => `${p.pool} peak / mean replicas`).join(" | ")} | failed |`;
  const sep = `|${" --- |".repeat(8 + (results[0]?.pools.length ?? 0))}`;
  const fmt = (x: number | null, d = 2) => (x === null ? "–" : Number.isFinite(x) ? x.toFixed(d) : "∞");
  const rows = results.map(
    (r) =>
      `| ${r.policy} | ${(r.attainment * 100).toFixed(1)}% | ${r.meetsTarget ? "yes" : "no"} | ${r.gpuHours.toFixed(2)} | ${r.actions} | ${r.worstWindow ? `${fmt(r.worstWindow.ttftP99)} s at ${r.worstWindow.start.toFixed(0)} s` : "–"} | ${fmt(r.ttftP99)} s | ${r.pools.map((p) => `${p.peakReady} / ${p.meanReady.toFixed(2)}`).join(" | ")} | ${r.failed} |`,
  );
  const meeting = results.filter((r) => r.meetsTarget).sort((x, y) => x.gpuHours - y.gpuHours);
  const kv = results.find((r) => r.policy === "kvgate");
  const bestOther = meeting.find((r) => r.policy !== "kvgate");
  let verdict: string;
  if (kv === undefined) verdict = "kvgate's recommender was not run.";
  else if (!kv.meetsTarget)
    verdict = `kvgate misses the ${a.slo.attainment * 100}% target (${(kv.attainment * 100).toFixed(1)}%)${bestOther ? `; the cheapest policy that meets it is ${bestOther.policy} at ${bestOther.gpuHours.toFixed(2)} GPU-hours` : "; no policy meets it"}.`;
  else if (bestOther === undefined)
    verdict = `only kvgate meets the ${a.slo.attainment * 100}% target, at ${kv.gpuHours.toFixed(2)} GPU-hours.`;
  else {
    const d = ((kv.gpuHours - bestOther.gpuHours) / bestOther.gpuHours) * 100;
    verdict = `kvgate meets the target at ${kv.gpuHours.toFixed(2)} GPU-hours, ${d <= 0 ? `${(-d).toFixed(1)}% fewer` : `${d.toFixed(1)}% more`} than the cheapest baseline that also meets it (${bestOther.policy}, ${bestOther.gpuHours.toFixed(2)}).`;
  }
  return [head, sep, ...rows, "", verdict].join("\n");
}
