/**
 * EndpointPickerConfig loading (llm-d/llm-d-router@ebab6879
 * apix/config/v1alpha1/endpointpickerconfig_types.go): YAML text → a
 * structurally checked RawConfig, strictly (unknown keys, unknown plugin types, bad parameters and
 * dangling references are ConfigErrors naming the culprit). Older GIE / llm-d plugin names and
 * parameters are rewritten to today's by legacy-config.ts, with a warning each. Defaulting is done
 * in one place, effectiveConfig() in defaults.ts. Sections kvgate does not implement load with a
 * warning. `flowControl` (with the flowControl feature gate) is resolved by src/flow/flow-config.ts.
 */
import { parseAllDocuments } from "yaml";
import type { EffectiveConfig } from "./defaults.ts";
import { effectiveConfig } from "./defaults.ts";
import { ConfigError } from "./errors.ts";
import { upgradeLegacyConfig } from "./legacy-config.ts";
import { parseObjective } from "./objectives.ts";
import type { PluginRegistry } from "./registry.ts";
import { builtinRegistry } from "./registry.ts";

export const API_VERSION = "llm-d.ai/v1alpha1";
/** llm-d-router loads both (its e2e configs and guides now use v1; the field layout kvgate reads is the same). */
export const API_VERSIONS = ["llm-d.ai/v1", API_VERSION];
export const LEGACY_API_VERSION = "inference.networking.x-k8s.io/v1alpha1";
export const KIND = "EndpointPickerConfig";

/** Accepted so llm-d configs load unchanged, but not acted on: each yields a warning. */
export const IGNORED_SECTIONS = ["dataLayer", "requestHandler", "parser"];
const TOP_LEVEL = [
  "apiVersion",
  "kind",
  "featureGates",
  "plugins",
  "schedulingProfiles",
  "flowControl",
  "saturationDetector",
  ...IGNORED_SECTIONS,
];
/** Feature gates kvgate knows; others warn. */
const KNOWN_GATES: Record<string, string | null> = {
  flowControl: null,
  haPopulateNonLeaderDatastore: null,
};

export interface RawPlugin {
  type: string;
  name: string;
  parameters: Record<string, unknown>;
}

export interface RawProfile {
  name: string;
  plugins: { pluginRef: string; weight?: number }[];
}

export interface RawConfig {
  apiVersion: string;
  featureGates: Record<string, boolean>;
  plugins: RawPlugin[];
  schedulingProfiles: RawProfile[] | null;
  objectives: Record<string, number>;
  /** The flowControl section as written (resolved in effectiveConfig), undefined when absent. */
  flowControl?: unknown;
  /** Deprecated top-level saturationDetector.pluginRef (llm-d: use flowControl.saturationDetector). */
  saturationDetectorRef?: string;
}

export interface LoadedConfig {
  config: EffectiveConfig;
  warnings: string[];
}

/** Parses, validates and defaults an EndpointPickerConfig (plus optional InferenceObjective docs). */
export function loadConfig(text: string, registry: PluginRegistry = builtinRegistry()): LoadedConfig {
  const warnings: string[] = [];
  const raw = upgradeLegacyConfig(parseConfigText(text, warnings), warnings);
  const config = effectiveConfig(raw, registry, warnings);
  return { config, warnings };
}

export function parseConfigText(text: string, warnings: string[]): RawConfig {
  const docs = parseAllDocuments(text);
  if (!Array.isArray(docs)) throw new ConfigError("config: expected YAML documents");
  let epc: Record<string, unknown> | null = null;
  const objectives: Record<string, number> = {};
  docs.forEach((d, i) => {
    const where = `config document ${i + 1}`;
    if (d.errors.length > 0)
      throw new ConfigError(`${where}: invalid YAML: ${d.errors[0].message}; fix the YAML at the line shown`);
    let v: unknown;
    try {
      v = d.toJS();
    } catch (err) {
      // yaml throws (not reports) an alias to an anchor that is not set, e.g. `apiVersion: *x`.
      throw new ConfigError(
        `${where}: invalid YAML: ${(err as Error).message}; quote a value that starts with * or &`,
      );
    }
    if (v === null || v === undefined) return;
    if (!isRecord(v)) throw new ConfigError(`${where}: expected a mapping at the top level`);
    if (v.kind === "InferenceObjective") {
      const [name, priority] = parseObjective(v, where);
      if (name in objectives)
        throw new ConfigError(`${where}: InferenceObjective "${name}" is defined twice`);
      objectives[name] = priority;
      return;
    }
    if (epc !== null) throw new ConfigError(`${where}: a second EndpointPickerConfig; give exactly one`);
    epc = v;
  });
  if (epc === null)
    throw new ConfigError(
      `config: no EndpointPickerConfig document found; add one with apiVersion: ${API_VERSION} and kind: ${KIND} (config/examples/default.yaml is one)`,
    );
  return { ...parseEndpointPickerConfig(epc, warnings), objectives };
}

function parseEndpointPickerConfig(
  doc: Record<string, unknown>,
  warnings: string[],
): Omit<RawConfig, "objectives"> {
  for (const k of Object.keys(doc)) {
    if (!TOP_LEVEL.includes(k)) {
      throw new ConfigError(
        `EndpointPickerConfig: unknown top-level key "${k}"; allowed keys: ${TOP_LEVEL.join(", ")}`,
      );
    }
  }
  let apiVersion = doc.apiVersion;
  if (apiVersion === undefined && doc.kind === undefined) {
    warnings.push(`apiVersion and kind missing; assuming ${API_VERSION} ${KIND}`);
    apiVersion = API_VERSION;
  } else {
    if (doc.kind !== KIND)
      throw new ConfigError(`EndpointPickerConfig: kind must be "${KIND}"; got ${JSON.stringify(doc.kind)}`);
    if (apiVersion === LEGACY_API_VERSION) {
      warnings.push(`apiVersion ${LEGACY_API_VERSION} is deprecated; use ${API_VERSION}`);
    } else if (!API_VERSIONS.includes(apiVersion as string)) {
      throw new ConfigError(
        `EndpointPickerConfig: apiVersion must be "llm-d.ai/v1" or "${API_VERSION}" (or legacy "${LEGACY_API_VERSION}"); got ${JSON.stringify(apiVersion)}`,
      );
    }
  }
  for (const s of IGNORED_SECTIONS) {
    if (doc[s] !== undefined)
      warnings.push(`section "${s}" is accepted but not implemented by kvgate; it has no effect`);
  }
  const out: Omit<RawConfig, "objectives"> = {
    apiVersion: apiVersion as string,
    featureGates: parseFeatureGates(doc.featureGates, warnings),
    plugins: parsePlugins(doc.plugins),
    schedulingProfiles: doc.schedulingProfiles === undefined ? null : parseProfiles(doc.schedulingProfiles),
  };
  if (doc.flowControl !== undefined) out.flowControl = doc.flowControl;
  const sd = doc.saturationDetector;
  if (sd !== undefined && sd !== null) {
    if (
      !isRecord(sd) ||
      Object.keys(sd).some((k) => k !== "pluginRef") ||
      typeof (sd.pluginRef ?? "") !== "string"
    )
      throw new ConfigError("saturationDetector: expected { pluginRef: <saturation detector plugin name> }");
    if (typeof sd.pluginRef === "string" && sd.pluginRef !== "") out.saturationDetectorRef = sd.pluginRef;
  }
  return out;
}

function parseFeatureGates(v: unknown, warnings: string[]): Record<string, boolean> {
  const gates: Record<string, boolean> = {};
  if (v === undefined || v === null) return gates;
  if (!Array.isArray(v))
    throw new ConfigError('featureGates: expected a list of gate names (e.g. ["flowControl"])');
  for (const g of v) {
    if (typeof g !== "string" || g === "")
      throw new ConfigError(`featureGates: each entry must be a string; got ${JSON.stringify(g)}`);
    const [name, value] = g.split("=", 2);
    if (value !== undefined && value !== "true" && value !== "false") {
      throw new ConfigError(`featureGates: "${g}": value must be true or false`);
    }
    gates[name] = value !== "false";
    if (!(name in KNOWN_GATES)) warnings.push(`featureGates: unknown gate "${name}" has no effect in kvgate`);
    else if (gates[name] && KNOWN_GATES[name] !== null)
      warnings.push(`featureGates: ${name}: ${KNOWN_GATES[name]}`);
  }
  return gates;
}

function parsePlugins(v: unknown): RawPlugin[] {
  if (v === undefined || v === null) {
    throw new ConfigError(
      "EndpointPickerConfig: no plugins; declare at least one (see config/examples/default.yaml)",
    );
  }
  if (!Array.isArray(v)) throw new ConfigError("plugins: expected a list of {type, name?, parameters?}");
  const seen = new Set<string>();
  return v.map((p, i) => {
    if (!isRecord(p)) throw new ConfigError(`plugins[${i}]: expected a mapping with "type"`);
    for (const k of Object.keys(p)) {
      if (k !== "type" && k !== "name" && k !== "parameters") {
        throw new ConfigError(`plugins[${i}]: unknown key "${k}"; allowed: type, name, parameters`);
      }
    }
    if (typeof p.type !== "string" || p.type === "")
      throw new ConfigError(`plugins[${i}]: "type" is required`);
    if (p.name !== undefined && (typeof p.name !== "string" || p.name === "")) {
      throw new ConfigError(`plugins[${i}] (type ${p.type}): "name" must be a non-empty string`);
    }
    const name = (p.name as string | undefined) ?? p.type;
    if (seen.has(name)) {
      throw new ConfigError(
        `plugins[${i}]: plugin name "${name}" is used twice; give each instance a distinct "name"`,
      );
    }
    seen.add(name);
    const params = p.parameters ?? {};
    if (!isRecord(params))
      throw new ConfigError(`plugin "${name}" (type ${p.type}): "parameters" must be a mapping`);
    return { type: p.type, name, parameters: params };
  });
}

function parseProfiles(v: unknown): RawProfile[] {
  if (!Array.isArray(v)) throw new ConfigError("schedulingProfiles: expected a list of {name, plugins}");
  const seen = new Set<string>();
  return v.map((p, i) => {
    if (!isRecord(p))
      throw new ConfigError(`schedulingProfiles[${i}]: expected a mapping with name and plugins`);
    for (const k of Object.keys(p)) {
      if (k !== "name" && k !== "plugins") {
        throw new ConfigError(`schedulingProfiles[${i}]: unknown key "${k}"; allowed: name, plugins`);
      }
    }
    if (typeof p.name !== "string" || p.name === "")
      throw new ConfigError(`schedulingProfiles[${i}]: "name" is required`);
    const name = p.name;
    if (seen.has(name)) throw new ConfigError(`schedulingProfiles: profile "${name}" is defined twice`);
    seen.add(name);
    const refs = p.plugins ?? [];
    if (!Array.isArray(refs))
      throw new ConfigError(`profile "${name}": "plugins" must be a list of {pluginRef, weight?}`);
    return {
      name,
      plugins: refs.map((r, j) => {
        if (!isRecord(r))
          throw new ConfigError(`profile "${name}": plugins[${j}] must be a mapping with pluginRef`);
        for (const k of Object.keys(r)) {
          if (k !== "pluginRef" && k !== "weight") {
            throw new ConfigError(
              `profile "${name}": plugins[${j}]: unknown key "${k}"; allowed: pluginRef, weight`,
            );
          }
        }
        if (typeof r.pluginRef !== "string" || r.pluginRef === "") {
          throw new ConfigError(`profile "${name}": plugins[${j}]: "pluginRef" is required`);
        }
        if (r.weight !== undefined && typeof r.weight !== "number") {
          throw new ConfigError(
            `profile "${name}": plugin "${r.pluginRef}": weight must be a number; got ${JSON.stringify(r.weight)}`,
          );
        }
        return r.weight === undefined
          ? { pluginRef: r.pluginRef }
          : { pluginRef: r.pluginRef, weight: r.weight };
      }),
    };
  });
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
