/**
 * Turns a finished driver run into a results-file run entry: aggregates the records with each
 * stage's actual start, and attaches the workload spec, seed, target and fleet figures. Pure;
 * the fleet simulator can call it with records it produced in virtual time.
 */
import type { DriverResult } from "./driver.ts";
import { aggregate, type Slo, type StageWindowInput } from "./metrics.ts";
import { type RunResult, runResult } from "./results.ts";
import type { WorkloadSpec } from "./workloads/spec.ts";
import type { Workload } from "./workloads/types.ts";

export interface BuildRunOptions {
  router: string;
  target?: { mode: "single" | "round-robin"; urls: string[] };
  timeScale: number;
  slo?: Slo;
}

export function buildRun(
  spec: WorkloadSpec,
  workload: Workload,
  result: Pick<DriverResult, "records" | "notSent" | "stageStarts" | "fleet" | "started"> &
    Partial<Pick<DriverResult, "maxScheduleLag">>,
  o: BuildRunOptions,
): RunResult {
  const stages: StageWindowInput[] = [];
  for (const s of workload.stages) {
    const start = result.stageStarts[s.index];
    if (start !== undefined)
      stages.push({ index: s.index, rate: s.rate, duration: s.duration, warmup: s.warmup, start });
  }
  const agg = aggregate(result.records, { slo: o.slo, stages });
  return runResult(agg, {
    router: o.router,
    ...(o.target ? { target: o.target } : {}),
    workload: { ...spec },
    timeScale: o.timeScale,
    started: result.started,
    notSent: result.notSent,
    ...(result.fleet ? { fleet: result.fleet } : {}),
    ...(result.maxScheduleLag !== undefined ? { driverLagMax: result.maxScheduleLag } : {}),
  });
}
