/**
 * Flow-control policy plugins, by llm-d's type names (llm-d/llm-d-router
 * `pkg/epp/framework/plugins/flowcontrol/{fairness,ordering,usagelimits}/`):
 *   fairness (which flow of a band goes next): global-strict-fairness-policy (default),
 *     round-robin-fairness-policy, and kvgate's vtc-fairness-policy (token-weighted fair sharing,
 *     Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024; llm-d has no such policy).
 *     Its kvgate-only `holdback` keeps the top of the saturation ceiling for flows below their share
 *     of the band's in-flight requests; its `prefillReserve` (replicas, default 0 = off) keeps that
 *     many endpoints free of long prefills for flows with none in flight: while the band knows
 *     another flow, a flow that already has a long prefill pending (a dispatched prompt of at least
 *     `longPrefillTokens`, default 1,024, without its first token yet) may start another only while
 *     more than `prefillReserve` endpoints have none (prefill-reserve.ts) — so a flooding tenant
 *     prefills on at most N − prefillReserve replicas at once and another tenant's short request
 *     finds a replica whose step carries no long prefill;
 *   ordering (which request of a flow goes next): fcfs-ordering-policy (default), edf-ordering-policy
 *     (deadline = enqueue + TTL), slo-deadline-ordering-policy (deadline = received + TTFT SLO);
 *   usage limit (the saturation ceiling per band): static-usage-limit-policy (default, threshold 1.0),
 *     priority-holdback-policy (linear ceilings by rank or by value).
 * The plugin objects only carry their parameters; flow-control.ts does the work.
 */
import { z } from "zod";
import { spec } from "../scheduler/plugin-spec.ts";
import type { Plugin, TypedName } from "../scheduler/types.ts";

export const GLOBAL_STRICT = "global-strict-fairness-policy";
export const ROUND_ROBIN = "round-robin-fairness-policy";
export const VTC = "vtc-fairness-policy";
export const FCFS = "fcfs-ordering-policy";
export const EDF = "edf-ordering-policy";
export const SLO_DEADLINE = "slo-deadline-ordering-policy";
export const STATIC_USAGE = "static-usage-limit-policy";
export const PRIORITY_HOLDBACK = "priority-holdback-policy";

export type FairnessSettings =
  | { kind: "global-strict" }
  | { kind: "round-robin" }
  /**
   * Counter += promptTokenWeight·prompt tokens at dispatch, outputTokenWeight·output tokens at
   * completion. holdback: the top of the band's saturation ceiling kept for flows below their
   * share of the band's in flight (0 or absent: none). prefillReserve: endpoints kept free of long
   * prefills (prompts of at least longPrefillTokens) for flows with none pending (absent: none).
   */
  | {
      kind: "vtc";
      promptTokenWeight: number;
      outputTokenWeight: number;
      holdback?: number;
      prefillReserve?: number;
      longPrefillTokens?: number;
    };

export type OrderingKind = "fcfs" | "edf" | "slo-deadline";

export type UsageLimitSettings =
  | { kind: "static"; threshold: number }
  | { kind: "priority-holdback"; domain: "rank" | "value"; minCeiling: number; maxCeiling: number };

export type FlowPolicy =
  | { role: "fairness"; settings: FairnessSettings }
  | { role: "ordering"; settings: OrderingKind }
  | { role: "usage-limit"; settings: UsageLimitSettings };

export class FlowPolicyPlugin implements Plugin {
  readonly typedName: TypedName;
  constructor(
    type: string,
    name: string,
    readonly policy: FlowPolicy,
  ) {
    this.typedName = { type, name };
  }
}

const none = z.strictObject({});
const vtcParams = z.strictObject({
  promptTokenWeight: z.number().nonnegative().default(1),
  outputTokenWeight: z.number().nonnegative().default(2),
  holdback: z.number().min(0).max(1).optional(),
  prefillReserve: z.number().int().min(0).default(0),
  longPrefillTokens: z.number().int().positive().default(1024),
});
const staticParams = z.strictObject({ threshold: z.number().positive().default(1) });
const holdbackParams = z
  .strictObject({
    domain: z.enum(["rank", "value"]).default("rank"),
    minCeiling: z.number().positive(),
    maxCeiling: z.number().positive().default(1),
  })
  .refine((p) => p.minCeiling <= p.maxCeiling, { message: "minCeiling must be ≤ maxCeiling" });

function policySpec(
  type: string,
  summary: string,
  params: z.ZodType<Record<string, unknown>>,
  make: (p: Record<string, unknown>) => FlowPolicy,
  kvgateOnly = false,
) {
  return spec({
    type,
    stability: "beta",
    kind: "flow-policy",
    kvgateOnly,
    summary,
    params,
    factory: (name, p) => new FlowPolicyPlugin(type, name, make(p)),
  });
}

export const FLOW_POLICY_SPECS = [
  policySpec(
    GLOBAL_STRICT,
    "Flow control: one logical queue per band (best head across flows).",
    none,
    () => ({
      role: "fairness",
      settings: { kind: "global-strict" },
    }),
  ),
  policySpec(ROUND_ROBIN, "Flow control: take turns across a band's flows (by fairness id).", none, () => ({
    role: "fairness",
    settings: { kind: "round-robin" },
  })),
  policySpec(
    VTC,
    "Flow control: the least-served flow goes next, by prompt and output tokens served (VTC); holdback keeps the top of the ceiling for flows below their share; prefillReserve keeps endpoints free of a flow's second long prefill.",
    vtcParams as unknown as z.ZodType<Record<string, unknown>>,
    (p) => ({
      role: "fairness",
      settings: {
        kind: "vtc",
        promptTokenWeight: p.promptTokenWeight as number,
        outputTokenWeight: p.outputTokenWeight as number,
        ...(typeof p.holdback === "number" && p.holdback > 0 ? { holdback: p.holdback } : {}),
        ...((p.prefillReserve as number) > 0
          ? { prefillReserve: p.prefillReserve as number, longPrefillTokens: p.longPrefillTokens as number }
          : {}),
      },
    }),
    true,
  ),
  policySpec(FCFS, "Flow control: first come, first served within a flow.", none, () => ({
    role: "ordering",
    settings: "fcfs",
  })),
  policySpec(EDF, "Flow control: earliest deadline (enqueue + TTL) first within a flow.", none, () => ({
    role: "ordering",
    settings: "edf",
  })),
  policySpec(
    SLO_DEADLINE,
    "Flow control: earliest received + x-llm-d-slo-ttft-ms first; requests without an SLO last.",
    none,
    () => ({ role: "ordering", settings: "slo-deadline" }),
  ),
  policySpec(
    STATIC_USAGE,
    "Flow control: every band dispatches while pool saturation < threshold.",
    staticParams as unknown as z.ZodType<Record<string, unknown>>,
    (p) => ({ role: "usage-limit", settings: { kind: "static", threshold: p.threshold as number } }),
  ),
  policySpec(
    PRIORITY_HOLDBACK,
    "Flow control: lower bands stop at lower saturation ceilings (maxCeiling → minCeiling).",
    holdbackParams as unknown as z.ZodType<Record<string, unknown>>,
    (p) => ({
      role: "usage-limit",
      settings: {
        kind: "priority-holdback",
        domain: p.domain as "rank" | "value",
        minCeiling: p.minCeiling as number,
        maxCeiling: p.maxCeiling as number,
      },
    }),
  ),
];

/** Default-parameter policy of a type (a band may name a type no plugin declares, as llm-d's defaults do). */
export function defaultPolicy(type: string): FlowPolicy | undefined {
  const s = FLOW_POLICY_SPECS.find((x) => x.type === type);
  if (s === undefined) return undefined;
  const params = s.params.safeParse({});
  if (!params.success) return undefined;
  return (s.factory(type, params.data, { hasher: null, plugin: () => undefined }) as FlowPolicyPlugin).policy;
}

/**
 * The saturation ceiling of each band (priorities sorted high → low): a band dispatches only while
 * pool saturation < its ceiling. priority-holdback: rank c_i = max − i·(max − min)/(N − 1); value
 * c_i = min + (p_i − p_min)/(p_max − p_min)·(max − min).
 */
export function ceilings(limit: UsageLimitSettings, prioritiesDesc: readonly number[]): number[] {
  if (limit.kind === "static") return prioritiesDesc.map(() => limit.threshold);
  const { minCeiling: lo, maxCeiling: hi } = limit;
  const n = prioritiesDesc.length;
  if (n <= 1) return prioritiesDesc.map(() => hi);
  if (limit.domain === "rank") return prioritiesDesc.map((_, i) => hi - (i * (hi - lo)) / (n - 1));
  const pMax = prioritiesDesc[0];
  const pMin = prioritiesDesc[n - 1];
  return prioritiesDesc.map((p) => lo + ((p - pMin) / (pMax - pMin)) * (hi - lo));
}
