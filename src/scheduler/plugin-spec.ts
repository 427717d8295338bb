/**
 * How a plugin type is declared to the registry: its llm-d type name, stability, what it can be
 * used as, its strict parameter schema (llm-d names and defaults), the data it produces and needs,
 * and a factory. Parameters reach the factory already parsed and defaulted.
 */
import type { z } from "zod";
import type { Hasher } from "./hash.ts";
import type { DataFamily, Plugin } from "./types.ts";

export type Stability = "alpha" | "beta" | "stable";

export type PluginKind =
  | "filter"
  | "scorer"
  | "picker"
  | "producer"
  | "profile-handler"
  | "decider"
  | "saturation-detector"
  /** Refuses requests after the data producers ran, before any profile (latency-slo-admitter). */
  | "admitter"
  /** A flow-control fairness, ordering or usage-limit policy (src/flow/policies.ts). */
  | "flow-policy"
  /** A known llm-d type configured outside EndpointPickerConfig in kvgate: loads, does nothing. */
  | "ignored";

export interface PluginHandle {
  /** Shared 64-bit hasher; null only in tests that build plugins that do not hash. */
  readonly hasher: Hasher | null;
  /** Another configured plugin by name; resolves once every plugin is built. */
  plugin(name: string): Plugin | undefined;
}

/** A data dependency, satisfied by the producer instance named in `param`. */
export interface Need {
  family: DataFamily;
  /** Parameter that names the producer instance (e.g. prefixMatchInfoProducerName). */
  param: string;
  /** A required need without a producer gets the family's default producer auto-added. */
  required: boolean;
}

export interface PluginSpec<P extends Record<string, unknown> = Record<string, unknown>> {
  type: string;
  stability: Stability;
  kind: PluginKind;
  /** kvgate baselines that llm-d does not have. */
  kvgateOnly?: boolean;
  summary: string;
  params: z.ZodType<P>;
  /** Data families this plugin writes, keyed by its instance name. */
  produces?: DataFamily[];
  needs?(params: P): Need[];
  /** llm-d parameters accepted with a deprecation warning: name → what to use instead. */
  deprecatedParams?: Record<string, string>;
  /** llm-d parameters kvgate does not implement: name → why; setting one is a ConfigError. */
  unsupportedParams?: Record<string, string>;
  factory(name: string, params: P, handle: PluginHandle): Plugin;
}

/** Erases a spec's parameter type so specs of different plugins fit one list. */
export function spec<P extends Record<string, unknown>>(s: PluginSpec<P>): PluginSpec {
  return s as unknown as PluginSpec;
}
