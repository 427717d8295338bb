/**
 * Configs written for earlier GIE (kubernetes-sigs/gateway-api-inference-extension, from v1.0) and
 * llm-d-inference-scheduler (now llm-d/llm-d-router, from v0.3) releases, rewritten to today's
 * plugin types and parameters before defaulting. Each rewrite adds one warning that names the old
 * shape, where it came from, and the modern equivalent to write instead. Where an old parameter
 * cannot be honoured the warning says what it does now. Old character-based sizes become tokens
 * at 4 characters per token: GIE's own estimate (`averageCharactersPerToken`), and exactly the
 * width of kvgate's tokenizer-free pseudo-tokens.
 */
import { stringify } from "yaml";
import type { RawConfig, RawPlugin } from "./config.ts";
import { ConfigError } from "./errors.ts";
import { BYTES_PER_TOKEN as CHARS_PER_TOKEN } from "./plugins/prefix/hashing.ts";
import { MIN_BLOCK_SIZE_TOKENS } from "./plugins/prefix/producer.ts";

type Params = Record<string, unknown>;

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
};

/** Old types kvgate knows but cannot load: why, and what to use instead. */
const RETIRED: Readonly<Record<string, string>> = {
  "low-queue-filter": "a GIE v0.x filter (chart default-plugins.yaml); use queue-scorer",
  "least-queue-filter": "a GIE v0.x filter (chart default-plugins.yaml); use queue-scorer",
  "least-kv-cache-filter": "a GIE v0.x filter (chart default-plugins.yaml); use kv-cache-utilization-scorer",
  "lora-affinity-filter": "a GIE v0.x filter; LoRA-aware routing is not implemented in kvgate",
  "decision-tree-filter": "a GIE v0.x filter; list filters in a scheduling profile instead",
  "kvcache-aware-scorer":
    "llm-d-inference-scheduler before v0.3; use precise-prefix-cache-producer with prefix-cache-scorer",
  "prefix-aware-scorer": "llm-d-inference-scheduler before v0.3; use prefix-cache-scorer",
  "by-labels": "llm-d-inference-scheduler before v0.3; use label-selector-filter",
};

/** Parameters of the approximate prefix index that sat on prefix-cache-scorer before the producer split. */
const APPROX_KEYS = [
  "hashBlockSize",
  "blockSize",
  "blockSizeTokens",
  "autoTune",
  "maxPrefixBlocksToMatch",
  "maxPrefixTokensToMatch",
  "lruCapacityPerServer",
];

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

const DECIDER_TYPES = [
  "prefix-based-pd-decider",
  "always-disagg-pd-decider",
  "prefix-disaggregation-decider",
];

interface Ctx {
  warnings: string[];
  taken: Set<string>;
  /** Names of the decider plugins the config declares. */
  deciders: string[];
  /** Old prefix plugin name → the producer now holding its index (for prefixPluginName). */
  producerOf: Map<string, string>;
}

/** Rewrites legacy plugin types and parameters in place of the raw config; warns once per rewrite. */
export function upgradeLegacyConfig(raw: RawConfig, warnings: string[]): RawConfig {
  const ctx: Ctx = {
    warnings,
    taken: new Set(raw.plugins.map((p) => p.name)),
    deciders: raw.plugins.filter((p) => DECIDER_TYPES.includes(p.type)).map((p) => p.name),
    producerOf: new Map(),
  };
  const approxDeclared = raw.plugins.some((p) => p.type === "approx-prefix-cache-producer");
  const splitApprox = raw.plugins.filter((p) => p.type === "prefix-cache-scorer" && hasAny(p, APPROX_KEYS));
  const splitPrecise = raw.plugins.filter((p) => p.type === "precise-prefix-cache-scorer");
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
  for (const p of splitPrecise) {
    const name = freeName(
      ctx,
      splitPrecise.length === 1 ? "precise-prefix-cache-producer" : `${p.name}-producer`,
    );
    produced.set(p, { type: "precise-prefix-cache-producer", name, parameters: {} });
    ctx.producerOf.set(p.name, name);
  }
  for (const p of raw.plugins) {
    const retired = RETIRED[p.type];
    if (retired !== undefined) throw new ConfigError(`${who(p)} is no longer supported: ${retired}`);
    const producer = produced.get(p);
    if (producer !== undefined && p.type === "prefix-cache-scorer") {
      out.push(...splitApproxScorer(p, producer, ctx));
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

function upgradePlugin(p: RawPlugin, ctx: Ctx): RawPlugin[] {
  const renamed = RENAMED[p.type];
  if (renamed !== undefined) {
    const params = { ...p.parameters };
    const notes = p.type === "prefix-disaggregation-decider" ? prefixRef(params, ctx) : [];
    ctx.warnings.push(
      `${who(p)} is deprecated (${renamed.source}); loaded as ${renamed.to}${notes.map((n) => `; ${n}`).join("")} — write "type: ${renamed.to}"`,
    );
    return [{ ...p, type: renamed.to, parameters: params }];
  }
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

/**
 * prefix-cache-scorer with index parameters, as GIE v1.0 (`hashBlockSize`, characters), GIE after
 * PR #1888 (`autoTune`, `blockSize` in characters) and later GIE / llm-d-router before the
 * approx-prefix-cache-producer split (`blockSizeTokens`) configured it: the scorer stays, the index
 * parameters move to a producer, translated so the same prompt prefix and KV capacity are covered.
 */
function splitApproxScorer(p: RawPlugin, producer: RawPlugin, ctx: Ctx): RawPlugin[] {
  const old = p.parameters;
  const scorerParams: Params = {};
  for (const [k, v] of Object.entries(old)) if (!APPROX_KEYS.includes(k)) scorerParams[k] = v;
  scorerParams.prefixMatchInfoProducerName = producer.name;
  const next: Params = {};
  const notes: string[] = [];
  const chars = positiveInt(p, old.hashBlockSize === undefined ? "blockSize" : "hashBlockSize");
  if (old.hashBlockSize !== undefined && old.blockSize !== undefined)
    notes.push("blockSize ignored (hashBlockSize given)");
  const givenTokens = positiveInt(p, "blockSizeTokens");
  if (old.autoTune !== undefined) next.autoTune = old.autoTune;
  else if (old.hashBlockSize !== undefined) {
    next.autoTune = false;
    notes.push("autoTune: false (GIE v1.0 used the configured sizes as given)");
  }
  /** Tokens per block in the old config: the unit of maxPrefixBlocksToMatch and lruCapacityPerServer. */
  let oldBlockTokens = 16;
  if (givenTokens !== undefined) {
    next.blockSizeTokens = givenTokens;
    oldBlockTokens = givenTokens;
    if (chars !== undefined) notes.push(`${charKey(old)} ignored (blockSizeTokens given)`);
  } else if (chars !== undefined) {
    oldBlockTokens = chars / CHARS_PER_TOKEN;
    next.blockSizeTokens = Math.max(1, Math.ceil(oldBlockTokens));
    notes.push(`${charKey(old)}: ${chars} characters → blockSizeTokens: ${next.blockSizeTokens}`);
  }
  if (old.maxPrefixTokensToMatch !== undefined) next.maxPrefixTokensToMatch = old.maxPrefixTokensToMatch;
  const maxBlocks = nonNegativeInt(p, "maxPrefixBlocksToMatch");
  if (maxBlocks !== undefined && old.maxPrefixTokensToMatch === undefined) {
    next.maxPrefixTokensToMatch = Math.ceil(maxBlocks * oldBlockTokens);
    notes.push(
      `maxPrefixBlocksToMatch: ${maxBlocks} → maxPrefixTokensToMatch: ${next.maxPrefixTokensToMatch} (the same prefix length)`,
    );
  } else if (maxBlocks !== undefined)
    notes.push("maxPrefixBlocksToMatch ignored (maxPrefixTokensToMatch given)");
  const lru = positiveInt(p, "lruCapacityPerServer");
  if (lru !== undefined) {
    const newBlock = Math.max(Number(next.blockSizeTokens ?? 16), MIN_BLOCK_SIZE_TOKENS);
    next.lruCapacityPerServer = Math.max(1, Math.ceil((lru * oldBlockTokens) / newBlock));
    if (next.lruCapacityPerServer !== lru) {
      notes.push(
        `lruCapacityPerServer: ${lru} blocks of ${oldBlockTokens} tokens → ${next.lruCapacityPerServer} blocks of ${newBlock} (kvgate's blocks are at least ${MIN_BLOCK_SIZE_TOKENS} tokens)`,
      );
    }
  }
  producer.parameters = next;
  ctx.warnings.push(
    `${who(p)}: index parameters ${keysOf(p, APPROX_KEYS)} on the scorer are deprecated (GIE before the producer split); loaded as approx-prefix-cache-producer "${producer.name}" ${flow(next)}${notes.map((n) => `; ${n}`).join("")} — declare "- type: approx-prefix-cache-producer" with those parameters`,
  );
  return [{ ...p, parameters: scorerParams }, producer];
}

/**
 * approx-prefix-cache-producer's deprecated `blockSize` is in characters (llm-d-router
 * approximateprefix config): without blockSizeTokens it becomes blockSizeTokens at 4 characters
 * per token; with it, it is ignored, as upstream does.
 */
function charBlockSize(p: RawPlugin, ctx: Ctx): RawPlugin {
  const chars = positiveInt(p, "blockSize");
  if (chars === undefined) return p;
  const { blockSize: _, ...params } = p.parameters;
  if (params.blockSizeTokens !== undefined) {
    ctx.warnings.push(
      `${who(p)}: parameter "blockSize" is deprecated and ignored (blockSizeTokens given); remove it`,
    );
    return { ...p, parameters: params };
  }
  params.blockSizeTokens = Math.max(1, Math.ceil(chars / CHARS_PER_TOKEN));
  ctx.warnings.push(
    `${who(p)}: parameter "blockSize" (characters) is deprecated; loaded as blockSizeTokens: ${params.blockSizeTokens} (${chars} characters at ${CHARS_PER_TOKEN} per token) — write that instead`,
  );
  return { ...p, parameters: params };
}

/**
 * precise-prefix-cache-scorer (llm-d-inference-scheduler v0.3+, a deprecated alias in llm-d-router):
 * its index becomes precise-prefix-cache-producer, its scoring a prefix-cache-scorer of the same name.
 */
function splitPreciseScorer(p: RawPlugin, producer: RawPlugin, ctx: Ctx): RawPlugin[] {
  const next: Params = {};
  const notes: string[] = [];
  const params = { ...p.parameters };
  const indexer = params.indexerConfig;
  if (
    isRecord(indexer) &&
    indexer.tokenProcessorConfig !== undefined &&
    params.tokenProcessorConfig === undefined
  ) {
    params.tokenProcessorConfig = indexer.tokenProcessorConfig;
    notes.push("indexerConfig.tokenProcessorConfig → tokenProcessorConfig");
  }
  for (const [k, v] of Object.entries(params)) {
    if (k === "indexerConfig") {
      notes.push(
        "indexerConfig ignored (kvgate keeps an in-memory index sized by maxIndexEntries and tokenizes in the gateway)",
      );
    } else if (k === "speculativeTTL" && typeof v === "number") {
      next.speculativeTTL = `${v / 1e6}ms`;
      notes.push(`speculativeTTL: ${v} (nanoseconds) → "${next.speculativeTTL}"`);
    } else if (k === "tokenProcessorConfig" && isRecord(v)) {
      const { blockSize, ...rest } = v;
      next.tokenProcessorConfig = blockSize === undefined ? rest : { ...rest, blockSizeTokens: blockSize };
      if (blockSize !== undefined) notes.push("tokenProcessorConfig.blockSize → blockSizeTokens");
    } else if (k === "kvEventsConfig" && isRecord(v)) {
      const { zmqEndpoint, concurrency, discoverPods, ...rest } = v;
      next.kvEventsConfig = rest;
      if (zmqEndpoint !== undefined)
        notes.push(
          `kvEventsConfig.zmqEndpoint ignored (kvgate binds no socket; it subscribes to each endpoint's publisher on podDiscoveryConfig.socketPort)`,
        );
      if (concurrency !== undefined) notes.push("kvEventsConfig.concurrency ignored (one event loop)");
      if (discoverPods === false)
        notes.push("kvEventsConfig.discoverPods: false ignored (kvgate always subscribes per endpoint)");
    } else next[k] = v;
  }
  producer.parameters = next;
  ctx.warnings.push(
    `${who(p)} is deprecated (llm-d-inference-scheduler v0.3+; an alias in llm-d-router); loaded as precise-prefix-cache-producer "${producer.name}" ${flow(next)} + prefix-cache-scorer "${p.name}"${notes.map((n) => `; ${n}`).join("")} — declare those two plugins instead`,
  );
  return [
    { type: "prefix-cache-scorer", name: p.name, parameters: { prefixMatchInfoProducerName: producer.name } },
    producer,
  ];
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

/**
 * pd-profile-handler → disagg-profile-handler. Up to llm-d-inference-scheduler v0.5
 * (pkg/plugins/profile/pd_profile_handler.go) it decided P/D itself: `threshold` 0 always ran
 * prefill, > 0 ran it when the uncached part of the prompt was at least `threshold` characters;
 * since llm-d-router PR #531 the decision is a decider plugin named by `deciderPluginName`.
 */
function pdProfileHandler(p: RawPlugin, ctx: Ctx): RawPlugin[] {
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
function flatDisaggParams(p: RawPlugin, ctx: Ctx): RawPlugin {
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

/**
 * prefixPluginName / prefixPluginType (which prefix plugin's state to read) → the producer of a
 * split scorer, as prefixMatchInfoProducerName on `target`; otherwise dropped (kvgate resolves the
 * one producer itself). Removes both keys from `params`; returns notes for the warning.
 */
function prefixRef(params: Params, ctx: Ctx, target: Params = params): string[] {
  const name = params.prefixPluginName;
  const had = "prefixPluginName" in params || "prefixPluginType" in params;
  delete params.prefixPluginName;
  delete params.prefixPluginType;
  if (!had) return [];
  const producer = typeof name === "string" ? ctx.producerOf.get(name) : undefined;
  if (producer !== undefined) {
    target.prefixMatchInfoProducerName = producer;
    return [`prefixPluginName "${String(name)}" → prefixMatchInfoProducerName "${producer}"`];
  }
  return [
    "prefixPluginName/prefixPluginType ignored (the prefix producer is found by prefixMatchInfoProducerName)",
  ];
}

function who(p: RawPlugin): string {
  return `plugin "${p.name}" (type ${p.type})`;
}

function hasAny(p: RawPlugin, keys: readonly string[]): boolean {
  return keys.some((k) => p.parameters[k] !== undefined);
}

function keysOf(p: RawPlugin, keys: readonly string[]): string {
  return keys.filter((k) => p.parameters[k] !== undefined).join(", ");
}

function charKey(old: Params): string {
  return old.hashBlockSize !== undefined ? "hashBlockSize" : "blockSize";
}

function freeName(ctx: Ctx, base: string): string {
  let name = base;
  for (let i = 2; ctx.taken.has(name); i++) name = `${base}-${i}`;
  ctx.taken.add(name);
  return name;
}

function positiveInt(p: RawPlugin, key: string): number | undefined {
  const v = p.parameters[key];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
    throw new ConfigError(
      `${who(p)}: parameter "${key}" must be a positive integer; got ${JSON.stringify(v)}`,
    );
  return v;
}

function nonNegativeInt(p: RawPlugin, key: string): number | undefined {
  const v = p.parameters[key];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0)
    throw new ConfigError(
      `${who(p)}: parameter "${key}" must be a non-negative integer; got ${JSON.stringify(v)}`,
    );
  return v;
}

function flow(v: unknown): string {
  return stringify(v, { collectionStyle: "flow", lineWidth: 0 }).trim();
}

function isRecord(v: unknown): v is Params {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
