/**
 * The routing brain the gateway holds, built from EndpointPickerConfig text: the scheduler, the
 * admission check (its saturation detector comes from the config), InferenceObjective priorities,
 * and what the config asks of the gateway itself (session-token header, prefix-index plugins to
 * report in metrics, precise-prefix-cache-producers to feed with KV events). Rebuilt wholesale on
 * reload; in-flight requests finish on the old one. One exception: a precise-prefix-cache-producer
 * whose name and parameters are unchanged is carried over into the new scheduler with its index, because
 * a fresh index could not learn what the engines already cache (vLLM announces a block once, when it is
 * stored, and a new subscriber gets no history).
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Admission } from "../flow/admission.ts";
import { UtilizationDetector } from "../flow/utilization-detector.ts";
import type { PluginSpec } from "../scheduler/plugin-spec.ts";
import {
  PRECISE_PREFIX_TYPE,
  type PrecisePrefixProducer,
} from "../scheduler/plugins/precise-prefix-cache-producer.ts";
import { builtinRegistry, type PluginRegistry } from "../scheduler/registry.ts";
import { createScheduler, type Scheduler } from "../scheduler/scheduler.ts";
import { preciseProducers } from "./kv-events.ts";

/**
 * The scheduler's documented default (config/examples/default.yaml, "sticky until saturated"),
 * used when no --config is given.
 */
export const DEFAULT_EPP_CONFIG_PATH = fileURLToPath(
  new URL("../../config/examples/default.yaml", import.meta.url),
);

export function defaultConfigText(): string {
  return readFileSync(DEFAULT_EPP_CONFIG_PATH, "utf8");
}

export interface Routing {
  readonly scheduler: Scheduler;
  readonly admission: Admission;
  /** InferenceObjective name → priority. */
  readonly objectives: ReadonlyMap<string, number>;
  readonly warnings: string[];
  /** Header carrying base64(endpoint id) when encoded_endpoint_header session affinity is configured. */
  readonly sessionTokenHeader: string | null;
  /** Whether session_id affinity is configured (x-session-id is read only then). */
  readonly sessionIdHeader: string | null;
  /** Prefix producers whose index size and hit ratio go into metrics. */
  readonly prefixPlugins: ReadonlyArray<{ name: string; type: string }>;
  /** precise-prefix-cache-producer instances: the gateway feeds each from the endpoints' KV events. */
  readonly precise: readonly PrecisePrefixProducer[];
  readonly configText: string;
}

const SESSION_TYPES = new Set(["session-affinity-scorer", "session-affinity-filter"]);
const PREFIX_TYPES = new Set(["approx-prefix-cache-producer", PRECISE_PREFIX_TYPE]);

/**
 * The built-in registry, except that precise-prefix-cache-producer returns the instance from `previous`
 * with the same name and identical parameters instead of building a new one.
 */
function registryKeeping(previous: readonly PrecisePrefixProducer[]): PluginRegistry {
  const registry = builtinRegistry();
  const base = registry.get(PRECISE_PREFIX_TYPE) as PluginSpec;
  const keeping: PluginSpec = {
    ...base,
    factory: (name, params, handle) => {
      const same = JSON.stringify(params);
      const old = previous.find((p) => p.typedName.name === name && JSON.stringify(p.params) === same);
      return old ?? base.factory(name, params, handle);
    },
  };
  const get = registry.get.bind(registry);
  registry.get = (type) => (type === PRECISE_PREFIX_TYPE ? keeping : get(type));
  return registry;
}

/**
 * Loads and builds; throws ConfigError (from the scheduler) with a message naming the problem.
 * `previous`: the routing being replaced (reload), whose unchanged precise producers are kept.
 */
export async function buildRouting(
  configText: string | null,
  opts: { seed?: number; previous?: Routing } = {},
): Promise<Routing> {
  const text = configText ?? defaultConfigText();
  const registry = opts.previous?.precise.length ? registryKeeping(opts.previous.precise) : undefined;
  const { scheduler, config, warnings } = await createScheduler(text, { seed: opts.seed, registry });
  const detector = scheduler.plugins.get(config.saturationDetector);
  const admission = new Admission(
    detector instanceof UtilizationDetector ? detector : new UtilizationDetector(),
  );
  let sessionTokenHeader: string | null = null;
  let sessionIdHeader: string | null = null;
  const prefixPlugins: Array<{ name: string; type: string }> = [];
  for (const p of config.plugins) {
    if (PREFIX_TYPES.has(p.type)) prefixPlugins.push({ name: p.name, type: p.type });
    if (!SESSION_TYPES.has(p.type)) continue;
    const strategy = String(p.parameters.strategy ?? "encoded_endpoint_header");
    const header = typeof p.parameters.headerName === "string" ? p.parameters.headerName.toLowerCase() : null;
    if (strategy === "encoded_endpoint_header") sessionTokenHeader = header ?? "x-session-token";
    else sessionIdHeader = header ?? "x-session-id";
  }
  return {
    scheduler,
    admission,
    objectives: new Map(Object.entries(config.objectives)),
    warnings,
    sessionTokenHeader,
    sessionIdHeader,
    prefixPlugins,
    precise: preciseProducers(scheduler),
    configText: text,
  };
}

/** Base64 of an endpoint id, as written in the session-token response header. */
export function encodeSessionToken(endpointId: string): string {
  return Buffer.from(endpointId, "utf8").toString("base64");
}

/** Decodes a session token; garbage decodes to something no endpoint is called, which is harmless. */
export function decodeSessionToken(token: string | undefined): string | undefined {
  if (!token || token.length > 512) return undefined;
  return Buffer.from(token, "base64").toString("utf8");
}
