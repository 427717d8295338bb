/**
 * Autoscaling scenarios (scenarios/autoscale-*.yaml): one fleet whose pools scale between bounds,
 * one router config, a workload whose load follows a curve (load-curves.ts), the pools' latency
 * objectives, the start-up delay, and the policies to compare on the same requests. Parsed
 * strictly (unknown fields are errors naming the field) and resolved with the fleet scenarios'
 * own machinery (scenario.ts) for pools and the workload.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { allowedSuffix } from "../../scheduler/zod-keys.ts";
import { curveStages, type LoadCurve } from "./load-curves.ts";
import { parseScenario, type Scenario, ScenarioError } from "./scenario.ts";

export const POLICY_NAMES = ["kvgate", "wva", "dynamo", "kpa", "hpa-gpu"] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

const pos = z.number().finite().positive();
const step = pos.optional();
const CurveSchema = z.discriminatedUnion("type", [
  z.strictObject({
    type: z.literal("diurnal"),
    duration: pos,
    trough: pos,
    peak: pos,
    period: pos.optional(),
    step,
  }),
  z.strictObject({
    type: z.literal("flash"),
    duration: pos,
    base: pos,
    peak: pos,
    at: z.number().nonnegative(),
    length: pos,
    rise: z.number().nonnegative().optional(),
    step,
  }),
  z.strictObject({ type: z.literal("ramp"), duration: pos, from: pos, to: pos, step }),
]);

const BoundsSchema = z.strictObject({
  name: z.string().regex(/^[a-z0-9-]+$/, "lower-case letters, digits and '-'"),
  min: z.number().int().positive(),
  max: z.number().int().positive(),
  initial: z.number().int().positive(),
});

export const AutoscaleSectionSchema = z.strictObject({
  /** Seconds from asking for a replica to it serving (model load). */
  startupDelay: z.number().finite().nonnegative(),
  /** Seconds between the controller's samples (default 2). */
  sampleInterval: pos.optional(),
  /** Per pool of the fleet (in order): its name and bounds. */
  pools: z.array(BoundsSchema).min(1),
  slo: z.strictObject({ ttft: pos, itl: pos, attainment: z.number().min(0).max(1) }),
  policies: z.array(z.enum(POLICY_NAMES)).min(1),
  curve: CurveSchema,
  /** Window of the worst TTFT p99, seconds (default 60). */
  window: pos.optional(),
});
export type AutoscaleSection = z.infer<typeof AutoscaleSectionSchema>;

export interface AutoscaleScenario {
  base: Scenario;
  autoscale: AutoscaleSection & { curve: LoadCurve };
}

/** Whether a scenario file's YAML is an autoscaling scenario (it has an `autoscale` section). */
export function isAutoscaleScenario(text: string): boolean {
  try {
    const v = parseYaml(text) as Record<string, unknown> | null;
    return v !== null && typeof v === "object" && "autoscale" in v;
  } catch {
    return false;
  }
}

/** Parses an autoscaling scenario; `file` anchors relative paths. Throws ScenarioError. */
export function parseAutoscaleScenario(text: string, file?: string): AutoscaleScenario {
  const origin = file ?? "(inline)";
  const raw = parseYaml(text) as Record<string, unknown>;
  const { autoscale: section, ...rest } = raw;
  const parsed = AutoscaleSectionSchema.safeParse(section);
  if (!parsed.success) {
    const i = parsed.error.issues[0];
    const unknown = i.code === "unrecognized_keys";
    const at = ["autoscale", ...i.path, ...(unknown ? [i.keys[0]] : [])].join(".");
    const message = unknown
      ? `unknown field${allowedSuffix(AutoscaleSectionSchema, i.path, section)}`
      : i.message;
    throw new ScenarioError(`scenario ${origin}: ${at}: ${message}`);
  }
  const a = parsed.data;
  // The load curve becomes the workload's arrival stages.
  const workload = {
    ...(rest.workload as Record<string, unknown>),
    arrival: { type: "stages", process: "poisson", stages: curveStages(a.curve) },
  };
  const base = parseScenarioWith({ ...rest, workload }, file);
  if (a.pools.length !== base.pools.length)
    throw new ScenarioError(
      `scenario ${origin}: autoscale.pools: ${a.pools.length} given, the fleet has ${base.pools.length} pool(s); give one per pool, in order`,
    );
  for (const [k, p] of a.pools.entries())
    if (!(p.min <= p.initial && p.initial <= p.max))
      throw new ScenarioError(
        `scenario ${origin}: autoscale.pools[${k}]: need min ≤ initial ≤ max (got ${p.min}, ${p.initial}, ${p.max})`,
      );
  return { base, autoscale: a };
}

function parseScenarioWith(obj: Record<string, unknown>, file?: string): Scenario {
  // scenario.ts parses YAML text; hand it the same object as YAML (JSON is YAML).
  return parseScenario(JSON.stringify(obj), file);
}

export function loadAutoscaleScenario(file: string): AutoscaleScenario {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new ScenarioError(`cannot read scenario ${file}: ${(err as Error).message}; check the path`);
  }
  return parseAutoscaleScenario(text, file);
}
