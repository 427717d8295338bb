/**
 * `kvgate simulate SCENARIO.yaml`: runs a fleet scenario in virtual time — each router config
 * against a fresh fleet of engine models, through the gateway's real scheduler — and prints a
 * table per router, a comparison and the workload's theoretical limits; `--json` writes the
 * results file (simulated seconds), `--records` one JSON line per request of each router
 * (bench/request-rows.ts). Progress and wall-clock timings go to stderr.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import type { Command } from "commander";
import { formatBreakdown } from "../bench/breakdown.ts";
import { type RequestRow, rowsJsonl } from "../bench/request-rows.ts";
import { isAutoscaleScenario } from "../sim/fleet/autoscale-scenario.ts";
import {
  formatComparison,
  formatLimits,
  formatRouter,
  formatRunLimits,
  formatSaturatedStages,
  formatVerdicts,
} from "../sim/fleet/format.ts";
import { formatLocality } from "../sim/fleet/format-locality.ts";
import { formatFleetComparison, wantsFleetComparison } from "../sim/fleet/format-pd.ts";
import { scaleScenario } from "../sim/fleet/scale.ts";
import { loadScenario, type Scenario, ScenarioError } from "../sim/fleet/scenario.ts";
import { simulate } from "../sim/fleet/simulate.ts";
import { nonNegative, positive, positiveNumber } from "./flag-values.ts";
import { simulateAutoscale } from "./simulate-autoscale.ts";

/** An autoscaling scenario (it has an `autoscale` section): run by simulate-autoscale.ts. */
function isAutoscaleFile(file: string): boolean {
  try {
    return isAutoscaleScenario(readFileSync(file, "utf8"));
  } catch {
    return false;
  }
}

interface Flags {
  json?: string;
  records?: string;
  jobs: number;
  routers?: string[];
  quick?: boolean;
  seed?: number;
  routerSeed?: number;
  scale?: number;
}

const list = (v: string): string[] =>
  v
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);

async function action(file: string, f: Flags, cmd: Command): Promise<void> {
  const fail = (msg: string): never => cmd.error(`error: ${msg}`, { exitCode: 2 });
  if (isAutoscaleFile(file) && f.seed !== undefined)
    return fail("--seed is not supported for autoscaling scenarios yet: change seed: in the file instead");
  if (isAutoscaleFile(file) && f.routerSeed !== undefined)
    return fail(
      "--router-seed is not supported for autoscaling scenarios yet: their router is seeded by seed: in the file; drop the flag",
    );
  if (isAutoscaleFile(file) && f.scale !== undefined)
    return fail(
      "--scale is not supported for autoscaling scenarios: their fleet grows and shrinks by policy; change the load in the file instead",
    );
  if (isAutoscaleFile(file) && f.records !== undefined)
    return fail(
      "--records is not supported for autoscaling scenarios yet: their runs are per policy, not per router; drop the flag",
    );
  if (isAutoscaleFile(file))
    return simulateAutoscale(file, f).catch((e) =>
      e instanceof ScenarioError ? fail(e.message) : Promise.reject(e),
    );
  let sc: Scenario;
  try {
    sc = scaleScenario(loadScenario(file, { seed: f.seed, routerSeed: f.routerSeed }), f.scale ?? 1);
  } catch (e) {
    if (e instanceof ScenarioError) return fail(e.message);
    throw e;
  }
  console.error(
    `scenario ${sc.name}: ${sc.fleet.replicas} × ${sc.fleet.profile.name}, ${sc.kvTokens} KV tokens each; ` +
      `workload ${sc.workload.preset ?? sc.workload.workload}${f.quick ? " (quick: a tenth)" : ""}` +
      `${sc.scale !== undefined ? ` (scale ×${sc.scale})` : ""}; seed ${sc.seed}` +
      (sc.routerSeed !== undefined ? `, router seed ${sc.routerSeed}` : ""),
  );
  let res: Awaited<ReturnType<typeof simulate>>;
  const rows = new Map<string, RequestRow[]>();
  try {
    res = await simulate(sc, {
      records: f.records !== undefined,
      routers: f.routers,
      quick: f.quick,
      seed: f.seed,
      routerSeed: f.routerSeed,
      jobs: f.jobs,
      workers: true,
      onRouterStart: (name, i, n) => console.error(`[${i + 1}/${n}] ${name} ...`),
      onRouterDone: (o) => {
        const cpu = Number.isFinite(o.cpuSeconds) ? `, cpu ${o.cpuSeconds.toFixed(1)} s` : "";
        console.error(`    done ${o.run.router}: wall ${o.wallSeconds.toFixed(1)} s${cpu}`);
        console.log(`${formatRouter(o)}\n`);
        if (o.run.breakdown) console.log(`${formatBreakdown(o.run.breakdown)}\n`);
        if (o.rows) rows.set(o.run.router, o.rows);
      },
    });
  } catch (e) {
    if (e instanceof ScenarioError) return fail(e.message);
    throw e;
  }
  console.log(`== comparison (${sc.name}, simulated seconds)`);
  console.log(formatComparison(res));
  console.log("");
  const fleets = wantsFleetComparison(res) ? formatFleetComparison(res) : "";
  for (const section of [fleets, formatLocality(res), formatSaturatedStages(res), formatVerdicts(res)]) {
    if (section) console.log(`${section}\n`);
  }
  console.log(formatLimits(res.limits));
  const own = formatRunLimits(res);
  if (own) console.log(own);
  console.error(
    `total wall ${res.wall_clock.total_s.toFixed(1)} s, peak memory ${res.wall_clock.peak_rss_mib.toFixed(0)} MiB`,
  );
  if (f.json) {
    writeFileSync(f.json, `${JSON.stringify(res, null, 2)}\n`);
    console.error(`results written to ${f.json}`);
  }
  if (f.records) {
    writeFileSync(f.records, res.runs.map((r) => rowsJsonl(rows.get(r.router) ?? [])).join(""));
    console.error(`per-request rows written to ${f.records}`);
  }
}

/** Adds the `simulate` command to the program. */
export function registerSimulate(program: Command): Command {
  return program
    .command("simulate")
    .description("Simulate a fleet scenario in virtual time: router configs × engine models, with limits.")
    .argument("<scenario>", "scenario YAML (see scenarios/)")
    .option("--json <file>", "write the results JSON here")
    .option(
      "--records <file>",
      "write one JSON line per request of each router (replica, send time, TTFT, E2E, tokens, error)",
    )
    .option("--routers <names>", "run only these routers of the scenario (comma-separated)", list)
    .option("--quick", "scale the workload down to a tenth for a smoke run")
    .option(
      "--seed <n>",
      "replace the scenario's seed (and its workload's): the same traffic shape with other draws",
      nonNegative,
    )
    .option(
      "--router-seed <n>",
      "seed the routers' random draws (tie-breaks, random picks) apart from --seed: the same traffic with other placements",
      nonNegative,
    )
    .option(
      "--scale <f>",
      "the same traffic shape on a fleet f times the size: replicas, arrival rates, request counts and the workload's shared prompt pools × f (0.5, 2, …)",
      positiveNumber,
    )
    .option(
      "--jobs <n>",
      "routers simulated at once, one worker thread each (results are identical for any value)",
      positive,
      availableParallelism(),
    )
    .action(action);
}
