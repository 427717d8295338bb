/**
 * P/D handler rewrites: pd-profile-handler (and its threshold-era decision rule) and the flat
 * parameters of disagg-profile-handler, to today's disagg-profile-handler with a decider plugin.
 */
import type { RawPlugin } from "../config.ts";
import { ConfigError } from "../errors.ts";
import type { Ctx, Params } from "./common.ts";
import {
  CHARS_PER_TOKEN,
  flow,
  freeName,
  hasAny,
  isRecord,
  nonNegativeInt,
  prefixRef,
  who,
} from "./common.ts";

/**
 * pd-profile-handler → disagg-profile-handler. Up to llm-d-inference-scheduler v0.5
 * (pkg/plugins/profile/pd_profile_handler.go) it decided P/D itself: `threshold` 0 always ran
 * prefill, > 0 ran it when the uncached part of the prompt was at least `threshold` characters;
 * since llm-d-router PR #531 the decision is a decider plugin named by `deciderPluginName`.
 */
export function pdProfileHandler(p: RawPlugin, ctx: Ctx): RawPlugin[] {
  const old = p.parameters;
  const known = [
    "threshold",
    "hashBlockSize",
    "decodeProfile",
    "prefillProfile",
    "prefixPluginName",
    "prefixPluginType",
    "primaryPort",
    "deciderPluginName",
    "prefixMatchInfoProducerName",
  ];
  const extra = Object.keys(old).filter((k) => !known.includes(k));
  if (extra.length > 0)
    throw new ConfigError(
      `${who(p)}: unknown parameter "${extra[0]}"; pd-profile-handler takes ${known.join(", ")}`,
    );
  const notes: string[] = [];
  const out: RawPlugin[] = [];
  let decider = typeof old.deciderPluginName === "string" ? old.deciderPluginName : undefined;
  // Between the threshold and deciderPluginName eras the one declared decider was used.
  if (decider === undefined && old.threshold === undefined && ctx.deciders.length === 1) {
    decider = ctx.deciders[0];
    notes.push(`decision by the declared decider "${decider}"`);
  }
  if (decider === undefined) {
    const threshold = nonNegativeInt(p, "threshold") ?? 0;
    if (threshold === 0) {
      decider = freeName(ctx, "always-disagg-pd-decider");
      out.push({ type: "always-disagg-pd-decider", name: decider, parameters: {} });
      notes.push(`threshold: 0 (always run prefill) → always-disagg-pd-decider "${decider}"`);
      if (hasAny(p, ["prefixPluginName", "prefixPluginType"]))
        notes.push("prefixPluginName/prefixPluginType ignored");
    } else {
      const params: Params = { nonCachedTokens: Math.ceil(threshold / CHARS_PER_TOKEN) };
      notes.push(...prefixRef({ ...old }, ctx, params));
      decider = freeName(ctx, "prefix-based-pd-decider");
      out.push({ type: "prefix-based-pd-decider", name: decider, parameters: params });
      notes.push(
        `threshold: ${threshold} characters → prefix-based-pd-decider "${decider}" {nonCachedTokens: ${params.nonCachedTokens}} (≈ the same uncached length at ${CHARS_PER_TOKEN} characters per token)`,
      );
    }
    if (old.hashBlockSize !== undefined)
      notes.push("hashBlockSize ignored (cached blocks are counted in the prefix producer's block size)");
  } else {
    for (const k of [
      "prefixPluginName",
      "prefixPluginType",
      "prefixMatchInfoProducerName",
      "threshold",
      "hashBlockSize",
    ])
      if (old[k] !== undefined) notes.push(`${k} ignored (set it on decider "${decider}")`);
  }
  if (old.primaryPort !== undefined && old.primaryPort !== 0)
    notes.push(
      `primaryPort: ${String(old.primaryPort)} ignored (kvgate routes to each endpoint's own port; data-parallel rank routing is not implemented)`,
    );
  const parameters: Params = {
    profiles: { decode: old.decodeProfile ?? "decode", prefill: old.prefillProfile ?? "prefill" },
    deciders: { prefill: decider },
  };
  ctx.warnings.push(
    `${who(p)} is deprecated (llm-d-inference-scheduler ≤ v0.5; an alias in llm-d-router); loaded as disagg-profile-handler ${flow(parameters)}${notes.map((n) => `; ${n}`).join("")} — declare that handler and the decider instead`,
  );
  return [{ ...p, type: "disagg-profile-handler", parameters }, ...out];
}

/** disagg-profile-handler's flat llm-d-router parameters (still parsed upstream) → profiles / deciders. */
export function flatDisaggParams(p: RawPlugin, ctx: Ctx): RawPlugin {
  const flat: Record<string, [string, string]> = {
    decodeProfile: ["profiles", "decode"],
    prefillProfile: ["profiles", "prefill"],
    encodeProfile: ["profiles", "encode"],
    deciderPluginName: ["deciders", "prefill"],
    prefillDeciderPluginName: ["deciders", "prefill"],
    encodeDeciderPluginName: ["deciders", "encode"],
  };
  if (!hasAny(p, Object.keys(flat))) return p;
  const params: Params = {};
  for (const [k, v] of Object.entries(p.parameters)) if (flat[k] === undefined) params[k] = v;
  const moved: string[] = [];
  for (const [k, [group, key]] of Object.entries(flat)) {
    const v = p.parameters[k];
    if (v === undefined) continue;
    params[group] = { ...(isRecord(params[group]) ? params[group] : {}), [key]: v };
    moved.push(`${k} → ${group}.${key}`);
  }
  ctx.warnings.push(
    `${who(p)}: flat parameters are deprecated (llm-d-router still parses them); loaded as ${flow(params)} (${moved.join(", ")})`,
  );
  return { ...p, parameters: params };
}
