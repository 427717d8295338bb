/**
 * The fleet-simulator run a bench derives from one scenario router, as `kvgate simulate` runs it
 * (one gateway, no locality): the router's scheduler with its flow control or admission, the
 * scenario's timings. Benches that look inside a run (ttft-anatomy, stage-anatomy) add an observer.
 */
import { Admission, admissionFromConfig } from "../flow/admission.ts";
import type { createScheduler } from "../scheduler/scheduler.ts";
import type { FleetRunOptions } from "../sim/fleet/fleet.ts";
import { FlowSim } from "../sim/fleet/flow.ts";
import type { PromptTokenizer } from "../sim/fleet/prompt-tokens.ts";
import type { FleetConfig } from "../sim/fleet/replica.ts";
import type { RouterSpec, Scenario } from "../sim/fleet/scenario.ts";
import type { scenarioWorkload } from "../sim/fleet/simulate.ts";

export function scenarioFleetOptions(
  sc: Scenario,
  r: RouterSpec,
  created: Awaited<ReturnType<typeof createScheduler>>,
  workload: ReturnType<typeof scenarioWorkload>["workload"],
  tokenizer: PromptTokenizer,
  pools: FleetConfig[] = r.pools,
): FleetRunOptions {
  const flow = FlowSim.of(created.scheduler);
  return {
    fleet: pools[0],
    pools,
    kvLink: r.kvLink,
    workload,
    scheduler: created.scheduler,
    admission: flow === null ? admissionFromConfig(created.config).admission : new Admission(),
    flow,
    objectives: new Map(Object.entries(created.config.objectives)),
    seed: sc.seed,
    scrapeInterval: sc.scrapeInterval,
    gatewayDelay: sc.gatewayDelay,
    routerTokenizer: sc.routerTokenizer,
    kvEventsDelay: sc.kvEventsDelay,
    tokenizer,
  };
}
