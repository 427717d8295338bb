/**
 * The EndpointPickerConfig `flowControl` section (llm-d/llm-d-router
 * `apix/config/v1alpha1/endpointpickerconfig_types.go` FlowControlConfig, defaults from
 * `pkg/epp/flowcontrol/registry/config.go`) → FlowControlSettings. It takes effect only with the
 * `flowControl` feature gate, as in llm-d; the gate alone turns flow control on with the defaults
 * (global-strict fairness, FCFS ordering, static usage limit 1.0, per band 5000 requests and 1 GB,
 * no global limit, 60 s queue TTL). Sizes are Kubernetes quantities ("500", "1k", "10Gi"),
 * TTLs Go durations ("60s"). Policy refs name a declared plugin, or a policy type used with its
 * default parameters.
 */
import { ConfigError } from "../scheduler/errors.ts";
import { didYouMean } from "../scheduler/suggest.ts";
import { parseDuration } from "./duration.ts";
import type { BandSettings, BandTemplate, FlowControlSettings } from "./flow-control.ts";
import {
  defaultPolicy,
  FCFS,
  FLOW_POLICY_SPECS,
  type FlowPolicy,
  type FlowPolicyPlugin,
  GLOBAL_STRICT,
} from "./policies.ts";

export const FLOW_CONTROL_GATE = "flowControl";

/** The part of a declared plugin this needs (EffectivePlugin's shape). */
export interface DeclaredPlugin {
  type: string;
  name: string;
  kind: string;
  parameters: Record<string, unknown>;
}

const SECTION_KEYS = [
  "maxBytes",
  "maxRequests",
  "defaultRequestTTL",
  "noEndpointRequestTTL",
  "defaultPriorityBand",
  "defaultNegativePriorityBand",
  "priorityBands",
  "usageLimitPolicyPluginRef",
  "saturationDetector",
  "enableEviction",
];
const BAND_KEYS = ["priority", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef"];

const QUANTITY = /^(\d+(?:\.\d+)?(?:[eE]\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$/;
const FACTOR: Record<string, number> = {
  "": 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};

/** A Kubernetes quantity as a whole number (rounded up, as Quantity.Value()); null if not one. */
export function parseQuantity(v: unknown): number | null {
  if (typeof v === "number") return Number.isFinite(v) && v >= 0 ? Math.ceil(v) : null;
  if (typeof v !== "string") return null;
  const m = QUANTITY.exec(v.trim());
  if (m === null) return null;
  return Math.ceil(Number(m[1]) * FACTOR[m[2] ?? ""]);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function strictKeys(v: Record<string, unknown>, allowed: string[], where: string): void {
  for (const k of Object.keys(v))
    if (!allowed.includes(k))
      throw new ConfigError(`${where}: unknown key "${k}"; allowed: ${allowed.join(", ")}`);
}

function quantity(v: unknown, where: string): number {
  if (v === undefined || v === null) return 0;
  const q = parseQuantity(v);
  if (q === null)
    throw new ConfigError(
      `${where}: expected a count or size such as "500", "1k" or "10Gi"; got ${JSON.stringify(v)}`,
    );
  return q;
}

function duration(v: unknown, where: string, dflt: number): number {
  if (v === undefined || v === null) return dflt;
  const d = typeof v === "string" ? parseDuration(v) : null;
  if (d === null)
    throw new ConfigError(`${where}: expected a duration such as "60s" or "500ms"; got ${JSON.stringify(v)}`);
  return d;
}

/** Resolves a policy ref: a declared plugin's name, else a policy type with default parameters. */
function policyRef<R extends FlowPolicy["role"]>(
  ref: unknown,
  role: R,
  plugins: readonly DeclaredPlugin[],
  where: string,
): Extract<FlowPolicy, { role: R }> {
  if (typeof ref !== "string" || ref === "")
    throw new ConfigError(`${where}: expected the name of a ${role} policy plugin`);
  const declared = plugins.find((p) => p.name === ref);
  let policy: FlowPolicy | undefined;
  if (declared) {
    const s = FLOW_POLICY_SPECS.find((x) => x.type === declared.type);
    if (s === undefined)
      throw new ConfigError(
        declared.kind === "ignored"
          ? `${where}: "${ref}" (type ${declared.type}) is not implemented in kvgate; use ${role === "usage-limit" ? "static-usage-limit-policy or priority-holdback-policy" : "another policy"}`
          : `${where}: "${ref}" is a ${declared.type}, not a flow-control ${role} policy`,
      );
    policy = (
      s.factory(ref, declared.parameters, { hasher: null, plugin: () => undefined }) as FlowPolicyPlugin
    ).policy;
  } else {
    policy = defaultPolicy(ref);
    if (policy === undefined) {
      const names = [...plugins.map((p) => p.name), ...FLOW_POLICY_SPECS.map((s) => s.type)];
      throw new ConfigError(
        `${where}: "${ref}" names no declared plugin and no policy type; declare it under plugins.${didYouMean(ref, names)}`,
      );
    }
  }
  if (policy.role !== role)
    throw new ConfigError(`${where}: "${ref}" is ${an(policy.role)} policy; give ${an(role)} policy`);
  return policy as Extract<FlowPolicy, { role: R }>;
}

function an(role: string): string {
  return `${/^[aeiou]/.test(role) ? "an" : "a"} ${role}`;
}

function band(
  v: unknown,
  where: string,
  plugins: readonly DeclaredPlugin[],
  base: BandTemplate | null,
): BandTemplate & { priority?: number } {
  if (!isRecord(v)) throw new ConfigError(`${where}: expected a mapping with ${BAND_KEYS.join(", ")}`);
  strictKeys(v, BAND_KEYS, where);
  const out: BandTemplate & { priority?: number } = {
    maxRequests:
      v.maxRequests === undefined
        ? (base?.maxRequests ?? 0)
        : quantity(v.maxRequests, `${where}.maxRequests`),
    maxBytes: v.maxBytes === undefined ? (base?.maxBytes ?? 0) : quantity(v.maxBytes, `${where}.maxBytes`),
    fairness:
      v.fairnessPolicyRef === undefined && base
        ? base.fairness
        : policyRef(v.fairnessPolicyRef ?? GLOBAL_STRICT, "fairness", plugins, `${where}.fairnessPolicyRef`)
            .settings,
    ordering:
      v.orderingPolicyRef === undefined && base
        ? base.ordering
        : policyRef(v.orderingPolicyRef ?? FCFS, "ordering", plugins, `${where}.orderingPolicyRef`).settings,
  };
  if (v.priority !== undefined) {
    if (typeof v.priority !== "number" || !Number.isInteger(v.priority))
      throw new ConfigError(`${where}.priority: expected an integer; got ${JSON.stringify(v.priority)}`);
    out.priority = v.priority;
  }
  return out;
}

/**
 * The flow-control settings in force, or null when the gate is off (then the section, if present,
 * only warns, and admission stays llm-d's legacy one).
 */
export function resolveFlowControl(
  section: unknown,
  gates: Readonly<Record<string, boolean>>,
  plugins: readonly DeclaredPlugin[],
  detector: string,
  warnings: string[],
): FlowControlSettings | null {
  const det = plugins.find((p) => p.name === detector);
  if (det?.type === "concurrency-detector" && !gates[FLOW_CONTROL_GATE])
    throw new ConfigError(
      `saturation detector "${detector}" (concurrency-detector) counts requests in flight through flow control; add featureGates: [${FLOW_CONTROL_GATE}], or use utilization-detector`,
    );
  if (!gates[FLOW_CONTROL_GATE]) {
    if (section !== undefined && section !== null)
      warnings.push(
        `section "flowControl" has no effect without the feature gate: add featureGates: [${FLOW_CONTROL_GATE}]`,
      );
    for (const p of plugins)
      if (p.kind === "flow-policy")
        warnings.push(
          `plugin "${p.name}" (type ${p.type}) has no effect without featureGates: [${FLOW_CONTROL_GATE}]`,
        );
    return null;
  }
  const s = section ?? {};
  if (!isRecord(s)) throw new ConfigError("flowControl: expected a mapping");
  strictKeys(s, SECTION_KEYS, "flowControl");
  if (s.saturationDetector !== undefined) {
    const sd = s.saturationDetector;
    if (!isRecord(sd) || (sd.pluginRef !== undefined && typeof sd.pluginRef !== "string"))
      throw new ConfigError("flowControl.saturationDetector: expected { pluginRef: <detector plugin name> }");
    strictKeys(sd, ["pluginRef"], "flowControl.saturationDetector");
    if (sd.pluginRef !== undefined && sd.pluginRef !== detector)
      throw new ConfigError(
        `flowControl.saturationDetector.pluginRef "${sd.pluginRef}" is not the configured saturation detector ("${detector}"); name that plugin`,
      );
  }
  if (s.enableEviction === true)
    warnings.push(
      "flowControl.enableEviction: in-flight eviction is not implemented in kvgate; it has no effect",
    );
  else if (s.enableEviction !== undefined && typeof s.enableEviction !== "boolean")
    throw new ConfigError("flowControl.enableEviction: expected true or false");
  const defaultBand = band(s.defaultPriorityBand ?? {}, "flowControl.defaultPriorityBand", plugins, null);
  const defaultNegativeBand =
    s.defaultNegativePriorityBand === undefined
      ? null
      : band(s.defaultNegativePriorityBand, "flowControl.defaultNegativePriorityBand", plugins, defaultBand);
  if (s.priorityBands !== undefined && !Array.isArray(s.priorityBands))
    throw new ConfigError("flowControl.priorityBands: expected a list of {priority, maxRequests, ...}");
  const bands: BandSettings[] = [];
  for (const [i, b] of ((s.priorityBands as unknown[] | undefined) ?? []).entries()) {
    const where = `flowControl.priorityBands[${i}]`;
    const parsed = band(b, where, plugins, null);
    if (parsed.priority === undefined) throw new ConfigError(`${where}: "priority" is required`);
    if (bands.some((x) => x.priority === parsed.priority))
      throw new ConfigError(`${where}: priority ${parsed.priority} is configured twice; merge the two bands`);
    bands.push(parsed as BandSettings);
  }
  const usageLimit =
    s.usageLimitPolicyPluginRef === undefined
      ? { kind: "static" as const, threshold: 1 }
      : policyRef(
          s.usageLimitPolicyPluginRef,
          "usage-limit",
          plugins,
          "flowControl.usageLimitPolicyPluginRef",
        ).settings;
  return {
    maxRequests: quantity(s.maxRequests, "flowControl.maxRequests"),
    maxBytes: quantity(s.maxBytes, "flowControl.maxBytes"),
    defaultRequestTTL: duration(s.defaultRequestTTL, "flowControl.defaultRequestTTL", 60),
    noEndpointRequestTTL: duration(s.noEndpointRequestTTL, "flowControl.noEndpointRequestTTL", 60),
    bands,
    defaultBand,
    defaultNegativeBand,
    usageLimit,
    flowGcAfter: 300,
  };
}
