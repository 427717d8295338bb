/**
 * Configs written for earlier GIE (kubernetes-sigs/gateway-api-inference-extension, from v1.0) and
 * llm-d-inference-scheduler (now llm-d/llm-d-router, from v0.3) releases, rewritten to today's
 * plugin types and parameters before defaulting. Each rewrite adds one warning that names the old
 * shape, where it came from, and the modern equivalent to write instead. Where an old parameter
 * cannot be honoured the warning says what it does now. Old character-based sizes become tokens
 * at 4 characters per token: GIE's own estimate (`averageCharactersPerToken`), and exactly the
 * width of kvgate's tokenizer-free pseudo-tokens.
 */
import type { RawConfig, RawPlugin } from "./config.ts";
import { ConfigError } from "./errors.ts";
import type { Ctx } from "./legacy/common.ts";
import { flow, freeName, hasAny, isRecord, keysOf, prefixRef, who } from "./legacy/common.ts";
import { flatDisaggParams, pdProfileHandler } from "./legacy/pd.ts";
import { APPROX_KEYS, charBlockSize, splitApproxScorer, splitPreciseScorer } from "./legacy/prefix.ts";

/** Plain renames: old type → today's type, and the release that used the old name. */
const RENAMED: Readonly<Record<string, { to: string; source: string }>> = {
  "kv-cache-scorer": {
    to: "kv-cache-utilization-scorer",
    source: "GIE v0.4–v0.5 chart plugins-v2.yaml; renamed by GIE PR #1238 before v1.0.0",
  },
  "by-label-selector": {
    to: "label-selector-filter",
    source: "llm-d-inference-scheduler v0.3+ pkg/plugins/filter/by_label_selector.go",
  },
  "prefix-disaggregation-decider": {
    to: "prefix-based-pd-decider",
    source: "llm-d-inference-scheduler pkg/plugins/profile/prefix_disagg_decider.go",
  },
  // llm-d-inference-scheduler before v0.3 (deploy/config/*.yaml until llm-d-router PR #237, 2025-07).
  "prefix-cache": { to: "prefix-cache-scorer", source: "llm-d-inference-scheduler before v0.3" },
  "max-score": { to: "max-score-picker", source: "llm-d-inference-scheduler before v0.3" },
  "prefill-header": { to: "prefill-header-handler", source: "llm-d-inference-scheduler before v0.3" },
};

/** Old types kvgate knows but cannot load: why, and what to use instead. */
const RETIRED: Readonly<Record<string, string>> = {
  "low-queue-filter": "a GIE v0.x filter (chart default-plugins.yaml); use queue-scorer",
  "least-queue-filter": "a GIE v0.x filter (chart default-plugins.yaml); use queue-scorer",
  "least-kv-cache-filter": "a GIE v0.x filter (chart default-plugins.yaml); use kv-cache-utilization-scorer",
  "lora-affinity-filter": "a GIE v0.x filter; use lora-affinity-scorer",
  "decision-tree-filter": "a GIE v0.x filter; list filters in a scheduling profile instead",
  "kvcache-aware-scorer":
    "llm-d-inference-scheduler before v0.3; use precise-prefix-cache-producer with prefix-cache-scorer",
  "prefix-aware-scorer": "llm-d-inference-scheduler before v0.3; use prefix-cache-scorer",
  "by-labels": "llm-d-inference-scheduler before v0.3; use label-selector-filter",
};

/** Old parameter names this module accepts, by today's type, for "did you mean" suggestions. */
export const LEGACY_PARAMS: Readonly<Record<string, readonly string[]>> = {
  "prefix-cache-scorer": APPROX_KEYS,
  "approx-prefix-cache-producer": ["blockSize"],
  "no-hit-lru-scorer": ["prefixPluginName", "prefixPluginType"],
  "prefix-based-pd-decider": ["prefixPluginName", "prefixPluginType"],
  "disagg-profile-handler": ["decodeProfile", "prefillProfile", "encodeProfile", "deciderPluginName"],
};

/** Every old type name this module accepts or explains, for "did you mean" suggestions. */
export const LEGACY_TYPES: readonly string[] = [
  ...Object.keys(RENAMED),
  ...Object.keys(RETIRED),
  "by-label",
  "pd-profile-handler",
  "precise-prefix-cache-scorer",
];

const DECIDER_TYPES = ["prefix-based-pd-decider", "always-disagg-pd-decider"];

/** Rewrites legacy plugin types and parameters in place of the raw config; warns once per rewrite. */
export function upgradeLegacyConfig(raw: RawConfig, warnings: string[]): RawConfig {
  const plugins = raw.plugins.map((p) => rename(p, warnings));
  const ctx: Ctx = {
    warnings,
    taken: new Set(plugins.map((p) => p.name)),
    deciders: plugins.filter((p) => DECIDER_TYPES.includes(p.type)).map((p) => p.name),
    producerOf: new Map(),
  };
  const approxDeclared = plugins.some((p) => p.type === "approx-prefix-cache-producer");
  const splitApprox = plugins.filter((p) => p.type === "prefix-cache-scorer" && hasAny(p, APPROX_KEYS));
  const splitPrecise = plugins.filter((p) => p.type === "precise-prefix-cache-scorer");
  const out: RawPlugin[] = [];
  const produced = new Map<RawPlugin, RawPlugin>();
  for (const p of splitApprox) {
    if (approxDeclared) {
      throw new ConfigError(
        `${who(p)}: parameters ${keysOf(p, APPROX_KEYS)} belong to approx-prefix-cache-producer, which is also declared; move them to that plugin`,
      );
    }
    const name = freeName(
      ctx,
      splitApprox.length === 1 ? "approx-prefix-cache-producer" : `${p.name}-producer`,
    );
    produced.set(p, { type: "approx-prefix-cache-producer", name, parameters: {} });
    ctx.producerOf.set(p.name, name);
  }
  const preciseDeclared = plugins.filter((p) => p.type === "precise-prefix-cache-producer");
  for (const p of splitPrecise) {
    if (preciseDeclared.length === 1) {
      // As llm-d-router's alias does: bind to the declared producer, ignore the scorer's own parameters.
      produced.set(p, preciseDeclared[0]);
      ctx.producerOf.set(p.name, preciseDeclared[0].name);
      continue;
    }
    const name = freeName(
      ctx,
      splitPrecise.length === 1 ? "precise-prefix-cache-producer" : `${p.name}-producer`,
    );
    produced.set(p, { type: "precise-prefix-cache-producer", name, parameters: {} });
    ctx.producerOf.set(p.name, name);
  }
  for (const p of plugins) {
    const retired = RETIRED[p.type];
    if (retired !== undefined) throw new ConfigError(`${who(p)} is no longer supported: ${retired}`);
    const producer = produced.get(p);
    if (producer !== undefined && p.type === "prefix-cache-scorer") {
      out.push(...splitApproxScorer(p, producer, ctx));
      continue;
    }
    if (producer !== undefined && preciseDeclared.includes(producer)) {
      const scorer = { pluginRef: p.name, producer: producer.name };
      ctx.warnings.push(
        `${who(p)} is deprecated (llm-d-inference-scheduler v0.3+; an alias in llm-d-router); loaded as prefix-cache-scorer "${scorer.pluginRef}" on the declared precise-prefix-cache-producer "${scorer.producer}"${Object.keys(p.parameters).length > 0 ? "; its own parameters are ignored" : ""} — write "type: prefix-cache-scorer"`,
      );
      out.push({
        type: "prefix-cache-scorer",
        name: p.name,
        parameters: { prefixMatchInfoProducerName: producer.name },
      });
      continue;
    }
    if (producer !== undefined) {
      out.push(...splitPreciseScorer(p, producer, ctx));
      continue;
    }
    out.push(...upgradePlugin(p, ctx));
  }
  return { ...raw, plugins: out };
}

/** A plain rename keeps the plugin's name, so pluginRefs to it (often the old type) still resolve. */
function rename(p: RawPlugin, warnings: string[]): RawPlugin {
  const renamed = RENAMED[p.type];
  if (renamed === undefined) return p;
  warnings.push(
    `${who(p)} is deprecated (${renamed.source}); loaded as ${renamed.to} — write "type: ${renamed.to}"`,
  );
  return { ...p, type: renamed.to };
}

function upgradePlugin(p: RawPlugin, ctx: Ctx): RawPlugin[] {
  switch (p.type) {
    case "by-label":
      return [byLabel(p, ctx)];
    case "pd-profile-handler":
      return pdProfileHandler(p, ctx);
    case "disagg-profile-handler":
      return [flatDisaggParams(p, ctx)];
    case "approx-prefix-cache-producer":
      return [charBlockSize(p, ctx)];
    case "precise-prefix-cache-producer": {
      const tpc = p.parameters.tokenProcessorConfig;
      if (!isRecord(tpc) || tpc.blockSize === undefined) return [p];
      const { blockSize, ...rest } = tpc;
      ctx.warnings.push(
        `${who(p)}: tokenProcessorConfig.blockSize is deprecated (llm-d-kv-cache TokenProcessorConfig); loaded as tokenProcessorConfig.blockSizeTokens: ${String(blockSize)}`,
      );
      return [
        {
          ...p,
          parameters: { ...p.parameters, tokenProcessorConfig: { ...rest, blockSizeTokens: blockSize } },
        },
      ];
    }
    case "no-hit-lru-scorer":
    case "prefix-based-pd-decider": {
      if (!hasAny(p, ["prefixPluginName", "prefixPluginType"])) return [p];
      const params = { ...p.parameters };
      const notes = prefixRef(params, ctx);
      ctx.warnings.push(
        `${who(p)}: prefixPluginName/prefixPluginType are deprecated (llm-d-inference-scheduler v0.3–v0.5; unused in llm-d-router); ${notes.join("; ")}`,
      );
      return [{ ...p, parameters: params }];
    }
    default:
      return [p];
  }
}

/** by-label {label, validValues, allowsNoLabel} (llm-d-inference-scheduler v0.3+) → label-selector-filter. */
function byLabel(p: RawPlugin, ctx: Ctx): RawPlugin {
  const { label, validValues = [], allowsNoLabel = false, ...rest } = p.parameters;
  const extra = Object.keys(rest);
  if (extra.length > 0)
    throw new ConfigError(
      `${who(p)}: unknown parameter "${extra[0]}"; by-label takes label, validValues, allowsNoLabel`,
    );
  if (typeof label !== "string" || label === "")
    throw new ConfigError(`${who(p)}: parameter "label" must name the label to match`);
  if (!Array.isArray(validValues) || !validValues.every((v) => typeof v === "string"))
    throw new ConfigError(`${who(p)}: parameter "validValues" must be a list of strings`);
  if (validValues.length === 0 && allowsNoLabel !== true)
    throw new ConfigError(
      `${who(p)}: parameter "validValues" is empty, which filters out every endpoint; list the label values to keep`,
    );
  if (allowsNoLabel === true) {
    throw new ConfigError(
      `${who(p)}: allowsNoLabel: true ("${label}" in [${validValues.join(", ")}] or absent) cannot be written as a label selector; label every endpoint, or use decode-filter for llm-d.ai/role`,
    );
  }
  const parameters = { matchExpressions: [{ key: label, operator: "In", values: validValues }] };
  ctx.warnings.push(
    `${who(p)} is deprecated (llm-d-inference-scheduler v0.3+ pkg/plugins/filter/by_label.go); loaded as label-selector-filter ${flow(parameters)} — write that instead`,
  );
  return { ...p, type: "label-selector-filter", parameters };
}
