/**
 * The routing brain the gateway holds, built from EndpointPickerConfig text: the scheduler, the
 * admission check (its saturation detector comes from the config), InferenceObjective priorities,
 * and what the config asks of the gateway itself (session-token header, prefix-index plugins to
 * report in metrics). Rebuilt wholesale on reload; in-flight requests finish on the old one.
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Admission } from "../flow/admission.ts";
import { UtilizationDetector } from "../flow/utilization-detector.ts";
import { createScheduler, type Scheduler } from "../scheduler/scheduler.ts";

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
  readonly configText: string;
}

const SESSION_TYPES = new Set(["session-affinity-scorer", "session-affinity-filter"]);

/** Loads and builds; throws ConfigError (from the scheduler) with a message naming the problem. */
export async function buildRouting(
  configText: string | null,
  opts: { seed?: number } = {},
): Promise<Routing> {
  const text = configText ?? defaultConfigText();
  const { scheduler, config, warnings } = await createScheduler(text, { seed: opts.seed });
  const detector = scheduler.plugins.get(config.saturationDetector);
  const admission = new Admission(
    detector instanceof UtilizationDetector ? detector : new UtilizationDetector(),
  );
  let sessionTokenHeader: string | null = null;
  let sessionIdHeader: string | null = null;
  const prefixPlugins: Array<{ name: string; type: string }> = [];
  for (const p of config.plugins) {
    if (p.type === "approx-prefix-cache-producer") prefixPlugins.push({ name: p.name, type: p.type });
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
