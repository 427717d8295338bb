/**
 * The one place defaults are applied: RawConfig → EffectiveConfig, the config that actually runs,
 * printable with printConfig(). In order (llm-d's defaulting, llm-d/llm-d-router@ebab6879
 * docs/architecture.md):
 *   1. every plugin's parameters parsed strictly, with llm-d defaults filled in;
 *   2. each consumer's producer resolved (e.g. prefix-cache-scorer → approx-prefix-cache-producer),
 *      auto-adding the family's default producer when a required one is missing;
 *   3. no schedulingProfiles → one `default` profile with every declared filter, scorer and picker;
 *   4. per profile: scorer weight 1 unless given; no picker → max-score-picker;
 *   5. no profile handler → single-profile-handler; no saturation detector → utilization-detector.
 */
import { stringify } from "yaml";
import type { ZodError } from "zod";
import { resolveFlowControl } from "../flow/flow-config.ts";
import type { FlowControlSettings } from "../flow/flow-control.ts";
import type { RawConfig, RawPlugin } from "./config.ts";
import { ConfigError } from "./errors.ts";
import { LEGACY_PARAMS, LEGACY_TYPES } from "./legacy-config.ts";
import type { Need, PluginKind, PluginSpec } from "./plugin-spec.ts";
import type { PluginRegistry } from "./registry.ts";
import { didYouMean } from "./suggest.ts";
import { allowedKeys } from "./zod-keys.ts";

export interface EffectivePlugin {
  type: string;
  name: string;
  kind: PluginKind;
  parameters: Record<string, unknown>;
  /** "auto" when added by defaulting. */
  origin: "declared" | "auto";
}

export interface EffectiveProfile {
  name: string;
  plugins: { pluginRef: string; weight?: number }[];
}

export interface EffectiveConfig {
  apiVersion: string;
  kind: "EndpointPickerConfig";
  featureGates: Record<string, boolean>;
  plugins: EffectivePlugin[];
  schedulingProfiles: EffectiveProfile[];
  /** Name of the profile-handler plugin. */
  profileHandler: string;
  /** Name of the saturation-detector plugin (used by admission). */
  saturationDetector: string;
  /** InferenceObjective name → priority. */
  objectives: Record<string, number>;
  /** Flow control in force (the flowControl gate on), else null: legacy admission. */
  flowControl: FlowControlSettings | null;
}

const PROFILE_KINDS: PluginKind[] = ["filter", "scorer", "picker", "saturation-detector", "producer"];

export function effectiveConfig(
  raw: RawConfig,
  registry: PluginRegistry,
  warnings: string[],
): EffectiveConfig {
  const plugins = raw.plugins.map((p) => parsePlugin(p, registry, "declared", warnings));
  const byName = new Map(plugins.map((p) => [p.name, p]));
  const add = (type: string, why: string): EffectivePlugin => {
    const existing = byName.get(type);
    if (existing !== undefined) {
      throw new ConfigError(
        `plugin "${type}" is of type ${existing.type}, but ${why} needs a ${type} named "${type}"`,
      );
    }
    const p = parsePlugin({ type, name: type, parameters: {} }, registry, "auto", warnings);
    plugins.push(p);
    byName.set(p.name, p);
    return p;
  };

  const claimed = claimedProducers(plugins, registry);
  resolveNeeds(plugins, byName, registry, add, true, claimed);
  resolveNeeds(plugins, byName, registry, add, false, claimed);

  let profiles = raw.schedulingProfiles;
  if (profiles === null || profiles.length === 0) {
    const members = plugins.filter((p) => p.kind === "filter" || p.kind === "scorer" || p.kind === "picker");
    if (members.filter((p) => p.kind === "picker").length > 1) {
      throw new ConfigError(
        "no schedulingProfiles, and several pickers are declared: the default profile can hold only one; declare schedulingProfiles (llm-d/llm-d#1227)",
      );
    }
    profiles = [{ name: "default", plugins: members.map((p) => ({ pluginRef: p.name })) }];
  }

  const used = new Set<string>();
  const schedulingProfiles = profiles.map((prof) => {
    const refs: EffectiveProfile["plugins"] = [];
    let picker: string | null = null;
    for (const r of prof.plugins) {
      const p = byName.get(r.pluginRef);
      const where = `profile "${prof.name}": pluginRef "${r.pluginRef}"`;
      if (p === undefined)
        throw new ConfigError(
          `${where} names no plugin; declare it under plugins or fix the name.${didYouMean(r.pluginRef, byName.keys())}`,
        );
      if (!PROFILE_KINDS.includes(p.kind)) {
        throw new ConfigError(
          `${where} is a ${p.kind} (type ${p.type}); profiles hold only filters, scorers and one picker`,
        );
      }
      if (refs.some((x) => x.pluginRef === r.pluginRef)) throw new ConfigError(`${where} is listed twice`);
      used.add(p.name);
      if (p.kind === "producer") {
        if (r.weight !== undefined)
          throw new ConfigError(`${where}: weight applies only to scorers; ${p.type} is a producer`);
        warnings.push(
          `${where}: producers run once per request for every profile; listing one in a profile has no effect`,
        );
        continue;
      }
      if (p.kind === "picker") {
        if (picker !== null) {
          throw new ConfigError(
            `profile "${prof.name}": two pickers ("${picker}" and "${p.name}"); keep exactly one`,
          );
        }
        picker = p.name;
      }
      if (p.kind !== "scorer") {
        if (r.weight !== undefined)
          throw new ConfigError(`${where}: weight applies only to scorers; ${p.type} is a ${p.kind}`);
        refs.push({ pluginRef: r.pluginRef });
        continue;
      }
      const w = r.weight ?? 1;
      if (!Number.isFinite(w) || w <= 0) {
        throw new ConfigError(
          `${where}: weight must be a positive number; got ${w} (remove the scorer to disable it)`,
        );
      }
      refs.push({ pluginRef: r.pluginRef, weight: w });
    }
    if (picker === null) {
      const p =
        byName.get("max-score-picker") ?? add("max-score-picker", `profile "${prof.name}" (no picker)`);
      if (p.kind !== "picker")
        throw new ConfigError(`plugin "max-score-picker" is not a picker (type ${p.type})`);
      refs.push({ pluginRef: p.name });
      used.add(p.name);
    }
    return { name: prof.name, plugins: refs };
  });

  for (const p of plugins) {
    if ((p.kind === "filter" || p.kind === "scorer" || p.kind === "picker") && !used.has(p.name)) {
      warnings.push(`plugin "${p.name}" (type ${p.type}) is in no scheduling profile; it has no effect`);
    }
  }

  const profileHandler = pickOne(plugins, "profile-handler", () =>
    add("single-profile-handler", "the scheduler"),
  );
  checkHandler(profileHandler, schedulingProfiles, byName);
  const saturationDetector = pickOne(plugins, "saturation-detector", () =>
    add("utilization-detector", "admission"),
  );
  if (raw.saturationDetectorRef !== undefined && raw.saturationDetectorRef !== saturationDetector.name)
    throw new ConfigError(
      `saturationDetector.pluginRef "${raw.saturationDetectorRef}" is not the configured saturation detector ("${saturationDetector.name}"); name that plugin`,
    );
  const flowControl = resolveFlowControl(
    raw.flowControl,
    raw.featureGates,
    plugins,
    saturationDetector.name,
    warnings,
  );

  return {
    apiVersion: raw.apiVersion,
    kind: "EndpointPickerConfig",
    featureGates: raw.featureGates,
    plugins,
    schedulingProfiles,
    profileHandler: profileHandler.name,
    saturationDetector: saturationDetector.name,
    objectives: raw.objectives,
    flowControl,
  };
}

function parsePlugin(
  p: RawPlugin,
  registry: PluginRegistry,
  origin: "declared" | "auto",
  warnings: string[],
): EffectivePlugin {
  const s = registry.get(p.type);
  const who = `plugin "${p.name}" (type ${p.type})`;
  const ignored = registry.ignored(p.type);
  if (s === undefined && ignored !== undefined) {
    warnings.push(`${who} is accepted but has no effect: ${ignored}`);
    return { type: p.type, name: p.name, kind: "ignored", parameters: p.parameters, origin };
  }
  if (s === undefined) {
    const why = registry.unimplemented(p.type);
    if (why !== undefined) throw new ConfigError(`${who} is not implemented in kvgate: ${why}`);
    throw new ConfigError(
      `${who}: unknown plugin type.${didYouMean(p.type, [...registry.knownTypes(), ...LEGACY_TYPES])} Known types: ${registry.types().join(", ")}`,
    );
  }
  for (const k of Object.keys(p.parameters)) {
    const unsupported = s.unsupportedParams?.[k];
    if (unsupported !== undefined)
      throw new ConfigError(`${who}: parameter "${k}" is not supported: ${unsupported}`);
    const replacement = s.deprecatedParams?.[k];
    if (replacement !== undefined)
      warnings.push(`${who}: parameter "${k}" is deprecated; use ${replacement}`);
  }
  const r = s.params.safeParse(p.parameters);
  if (!r.success) throw new ConfigError(`${who}: ${formatIssues(r.error, s, p.parameters)}`);
  return { type: p.type, name: p.name, kind: s.kind, parameters: { ...r.data }, origin };
}

function formatIssues(e: ZodError, s: PluginSpec, input: unknown): string {
  return e.issues
    .map((i) => {
      if (i.code === "unrecognized_keys") {
        const known = allowedKeys(s.params, i.path, input);
        if (i.path.length === 0) known.push(...Object.keys(s.deprecatedParams ?? {}));
        const legacy = i.path.length === 0 ? (LEGACY_PARAMS[s.type] ?? []) : [];
        const hints = i.keys.map((k) => didYouMean(k, [...known, ...legacy])).join("");
        return `unknown parameter${i.keys.length > 1 ? "s" : ""} ${i.keys.map((k) => `"${[...i.path, k].join(".")}"`).join(", ")}.${hints} Known: ${known.join(", ") || "none"}`;
      }
      const path = i.path.length > 0 ? `parameter "${i.path.join(".")}": ` : "";
      return `${path}${i.message}`;
    })
    .join("; ");
}

/** Producers some consumer names explicitly in the config as written. */
function claimedProducers(plugins: EffectivePlugin[], registry: PluginRegistry): Set<string> {
  const out = new Set<string>();
  for (const p of plugins)
    for (const n of registry.get(p.type)?.needs?.(p.parameters) ?? []) {
      const set = p.parameters[n.param];
      if (typeof set === "string") out.add(set);
    }
  return out;
}

/**
 * Points each consumer at its producer. A consumer that names none gets, as in llm-d (whose unnamed
 * consumers read the data key of the default producer's name), the producer named after the default
 * producer's type if declared; else the one producer no other consumer names; several such is an
 * error; when every producer is named by another consumer (llm-d's tiered-prefix-cache guide: a GPU
 * and a CPU approx producer, each with its scorer, plus an unnamed no-hit-lru-scorer) or there is
 * none, a required need auto-adds the default producer, as llm-d auto-spawns it.
 */
function resolveNeeds(
  plugins: EffectivePlugin[],
  byName: Map<string, EffectivePlugin>,
  registry: PluginRegistry,
  add: (type: string, why: string) => EffectivePlugin,
  required: boolean,
  claimed: ReadonlySet<string>,
): void {
  for (let i = 0; i < plugins.length; i++) {
    const p = plugins[i];
    const needs: Need[] = registry.get(p.type)?.needs?.(p.parameters) ?? [];
    for (const n of needs) {
      if (n.required !== required) continue;
      const who = `plugin "${p.name}" (type ${p.type})`;
      const set = p.parameters[n.param];
      if (typeof set === "string") {
        const prod = byName.get(set);
        if (prod === undefined || !registry.get(prod.type)?.produces?.includes(n.family)) {
          throw new ConfigError(
            `${who}: parameter "${n.param}": "${set}" is not a plugin producing ${n.family}`,
          );
        }
        continue;
      }
      const producers = plugins.filter((q) => registry.get(q.type)?.produces?.includes(n.family));
      const dflt = registry.defaultProducer(n.family);
      const named = producers.find((q) => q.name === dflt && q.type === dflt);
      if (named !== undefined) {
        p.parameters[n.param] = named.name;
        continue;
      }
      const free = producers.filter((q) => !claimed.has(q.name));
      if (free.length > 1) {
        throw new ConfigError(
          `${who}: several plugins produce ${n.family} (${free.map((q) => q.name).join(", ")}); set parameter "${n.param}" to one of them`,
        );
      }
      if (free.length === 1) p.parameters[n.param] = free[0].name;
      else if (required) p.parameters[n.param] = add(dflt, who).name;
    }
  }
}

function pickOne(
  plugins: EffectivePlugin[],
  kind: PluginKind,
  fallback: () => EffectivePlugin,
): EffectivePlugin {
  const found = plugins.filter((p) => p.kind === kind);
  if (found.length > 1) {
    throw new ConfigError(
      `several ${kind} plugins declared (${found.map((p) => p.name).join(", ")}); keep exactly one`,
    );
  }
  return found[0] ?? fallback();
}

function checkHandler(
  h: EffectivePlugin,
  profiles: EffectiveProfile[],
  byName: Map<string, EffectivePlugin>,
): void {
  const names = profiles.map((p) => p.name);
  if (h.type === "single-profile-handler" && names.length !== 1) {
    throw new ConfigError(
      `single-profile-handler runs exactly one profile, but ${names.length} are defined (${names.join(", ")}); declare a disagg-profile-handler or keep one profile`,
    );
  }
  if (h.type !== "disagg-profile-handler") return;
  const params = h.parameters as {
    profiles: Record<string, string>;
    deciders: Record<string, string | undefined>;
  };
  const who = `plugin "${h.name}" (type ${h.type})`;
  if (!names.includes(params.profiles.decode)) {
    throw new ConfigError(
      `${who}: decode profile "${params.profiles.decode}" is not among schedulingProfiles (${names.join(", ")})`,
    );
  }
  const decider = params.deciders.prefill;
  if (decider === undefined) return;
  if (!names.includes(params.profiles.prefill)) {
    throw new ConfigError(
      `${who}: prefill profile "${params.profiles.prefill}" is not among schedulingProfiles (${names.join(", ")})`,
    );
  }
  const d = byName.get(decider);
  if (d === undefined || d.kind !== "decider") {
    throw new ConfigError(
      `${who}: parameter "deciders.prefill": "${decider}" is not a declared decider plugin`,
    );
  }
}

/** The effective config as YAML, e.g. for `kvgate config print`. */
export function printConfig(c: EffectiveConfig): string {
  return stringify(c);
}
