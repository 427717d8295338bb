/**
 * `kvgate simulate scenarios/autoscale-*.yaml`: the autoscaling policies of the scenario, one run
 * each on the same workload, and the comparison table (simulated seconds); `--json` writes every
 * run's figures, its scaling actions and its pool sizes over time.
 */
import { writeFileSync } from "node:fs";
import { formatAutoscale, runAutoscaleScenario } from "../sim/fleet/autoscale-run.ts";
import { loadAutoscaleScenario } from "../sim/fleet/autoscale-scenario.ts";
import { ScenarioError } from "../sim/fleet/scenario.ts";

export async function simulateAutoscale(
  file: string,
  f: { json?: string; quick?: boolean; routers?: string[] },
): Promise<void> {
  const sc = loadAutoscaleScenario(file);
  const a = sc.autoscale;
  // Here --routers picks autoscaling policies: the scenario has one router config.
  const unknown = (f.routers ?? []).filter((n) => !(a.policies as string[]).includes(n));
  if (unknown.length > 0)
    throw new ScenarioError(
      `unknown policy "${unknown[0]}": an autoscaling scenario compares policies, and --routers picks among them: ${a.policies.join(", ")}`,
    );
  console.error(
    `scenario ${sc.base.name}: pools ${a.pools.map((p) => `${p.name} ${p.min}–${p.max} (start ${p.initial})`).join(", ")} × ${sc.base.pools.map((p) => p.profile.name).join(", ")}; ` +
      `${a.curve.type} load over ${a.curve.duration} s; start-up ${a.startupDelay} s; policies ${(f.routers ?? a.policies).join(", ")}`,
  );
  const t0 = performance.now();
  const results = await runAutoscaleScenario(sc, {
    policies: f.routers,
    quick: f.quick,
    onDone: (r) =>
      console.error(
        `    done ${r.policy}: ${r.requests} requests, attainment ${(r.attainment * 100).toFixed(1)}%, ${r.gpuHours.toFixed(2)} GPU-h, ${r.actions} actions; wall ${r.wallSeconds.toFixed(1)} s`,
      ),
  });
  console.log(`== autoscaling (${sc.base.name}, simulated seconds)`);
  console.log(formatAutoscale(sc, results));
  console.error(`total wall ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  if (f.json) {
    writeFileSync(
      f.json,
      `${JSON.stringify({ scenario: sc.base.name, simulated: true, autoscale: a, results }, null, 2)}\n`,
    );
    console.error(`results written to ${f.json}`);
  }
}
