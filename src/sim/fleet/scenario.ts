/**
 * Fleet-simulator scenario files (scenarios/*.yaml): the fleet, the router configs to compare, the
 * workload and the timing of the gateway's view. Parsed strictly with zod — unknown fields,
 * wrong types and impossible numbers are errors naming the field — then resolved: the profile
 * loaded, router configs read (paths are relative to the scenario file), the workload spec
 * resolved and defaults applied in one place.
 */
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parse as parseYaml, stringify as toYaml } from "yaml";
import { z } from "zod";
import {
  resolveWorkloadSpec,
  type WorkloadSpec,
  WorkloadSpecError,
  WorkloadSpecInputSchema,
} from "../../bench/workloads/spec.ts";
import type { BlockHashAlgo } from "../../engine/engine.ts";
import { loadProfile } from "../profiles.ts";
import type { FleetConfig } from "./replica.ts";

export class ScenarioError extends Error {
  override name = "ScenarioError";
}

const posInt = z.number().int().positive();

const FleetSchema = z.strictObject({
  replicas: posInt,
  /** Built-in profile name or a YAML path (relative to the scenario file). */
  profile: z.string().min(1),
  /** KV capacity per replica in tokens (vLLM's figure, e.g. 307,328); default: the profile's. */
  kvTokens: posInt.optional(),
  /** GPU blocks per replica including the null block (vLLM --num-gpu-blocks-override). */
  numGpuBlocks: z.number().int().min(2).optional(),
  blockSize: posInt.optional(),
  maxNumSeqs: posInt.optional(),
  maxNumBatchedTokens: posInt.optional(),
  maxModelLen: posInt.optional(),
  labels: z.record(z.string(), z.string()).optional(),
});

const RouterSchema = z.strictObject({
  name: z.string().regex(/^[A-Za-z0-9._-]+$/, "must be letters, digits, '.', '_' or '-'"),
  /** Path to an EndpointPickerConfig YAML (relative to the scenario file), or the config inline. */
  config: z.union([z.string().min(1), z.record(z.string(), z.unknown())]),
});

export const ScenarioSchema = z.strictObject({
  name: z.string().min(1),
  description: z.string().optional(),
  seed: z.number().int().nonnegative(),
  fleet: FleetSchema,
  routers: z.array(RouterSchema).min(1),
  workload: WorkloadSpecInputSchema,
  /** Metric scrape period of the gateway's data layer, ms (default 100). */
  scrapeIntervalMs: z.number().finite().positive().optional(),
  /** Gateway decision → replica receives the request, ms (default 0). */
  gatewayDelayMs: z.number().finite().nonnegative().optional(),
  /**
   * The router tokenizes prompts (RequestFacts.tokenIds); default false: it hashes prompt bytes.
   * A router with a precise prefix producer is always given token ids (it keys requests by them).
   */
  routerTokenizer: z.boolean().optional(),
  /**
   * Engine block hash: "fast64" (default) or vLLM's "sha256_cbor". Routing never depends on it: the
   * precise prefix index keys blocks by their token ids and maps engine hashes only for removals.
   */
  blockHash: z.enum(["fast64", "sha256_cbor"]).optional(),
  /**
   * Record KV events in every run's engines (default false). A router with a precise prefix
   * producer turns them on for its own run regardless.
   */
  kvEvents: z.boolean().optional(),
  /** A step's end → its KV events reach a precise prefix index, ms (default 5). */
  kvEventsDelayMs: z.number().finite().nonnegative().optional(),
});
export type ScenarioInput = z.infer<typeof ScenarioSchema>;

export interface RouterSpec {
  name: string;
  /** EndpointPickerConfig YAML text. */
  configText: string;
  /** Where the config came from: a resolved path, or "inline". */
  source: string;
}

/** A scenario with every default applied and every file read. */
export interface Scenario {
  name: string;
  description: string;
  seed: number;
  /** The scenario file, or "(inline)". */
  origin: string;
  fleet: FleetConfig;
  /** KV capacity per replica in tokens (numGpuBlocks − 1 blocks). */
  kvTokens: number;
  routers: RouterSpec[];
  workload: WorkloadSpec;
  /** Trace text for trace workloads (options.path, read relative to the scenario file). */
  traceText?: string;
  scrapeInterval: number;
  gatewayDelay: number;
  routerTokenizer: boolean;
  /** Seconds from a step's end to its KV events reaching a precise prefix index. */
  kvEventsDelay: number;
}

function fail(origin: string, path: string, message: string): never {
  throw new ScenarioError(`scenario ${origin}: ${path ? `${path}: ` : ""}${message}`);
}

function zodFail(origin: string, e: z.ZodError): never {
  const i = e.issues[0];
  let path = i.path
    .map((k, n) => (typeof k === "number" ? `[${k}]` : n === 0 ? String(k) : `.${String(k)}`))
    .join("");
  let message = i.message;
  if (i.code === "unrecognized_keys") {
    const key = i.keys[0];
    path = path ? `${path}.${key}` : key;
    message = "unknown field";
  }
  return fail(origin, path, message);
}

/** Parses and resolves a scenario's YAML text; `file` anchors relative paths. Throws ScenarioError. */
export function parseScenario(text: string, file?: string): Scenario {
  const origin = file ?? "(inline)";
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    return fail(origin, "", `invalid YAML: ${(err as Error).message}`);
  }
  const parsed = ScenarioSchema.safeParse(raw ?? {});
  if (!parsed.success) return zodFail(origin, parsed.error);
  return resolveScenario(parsed.data, origin, file === undefined ? process.cwd() : dirname(resolve(file)));
}

/** Reads and parses a scenario file. */
export function loadScenario(file: string): Scenario {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new ScenarioError(`cannot read scenario ${file}: ${(err as Error).message}`);
  }
  return parseScenario(text, file);
}

function resolveScenario(s: ScenarioInput, origin: string, dir: string): Scenario {
  const f = s.fleet;
  let profile: ReturnType<typeof loadProfile>;
  try {
    profile = loadProfile(f.profile, { cwd: dir });
  } catch (err) {
    return fail(origin, "fleet.profile", (err as Error).message);
  }
  if (f.kvTokens !== undefined && f.numGpuBlocks !== undefined)
    fail(origin, "fleet.numGpuBlocks", "give kvTokens or numGpuBlocks, not both");
  const blockSize = f.blockSize ?? 16;
  const numGpuBlocks = f.numGpuBlocks ?? Math.floor((f.kvTokens ?? profile.kvCapacityTokens) / blockSize) + 1;
  if (numGpuBlocks < 2) fail(origin, "fleet.kvTokens", `holds no full block of ${blockSize} tokens`);
  const maxModelLen = f.maxModelLen ?? profile.defaults.maxModelLen;
  if (Math.ceil(maxModelLen / blockSize) > numGpuBlocks - 1)
    fail(
      origin,
      "fleet.maxModelLen",
      `${maxModelLen} tokens do not fit the KV cache (${(numGpuBlocks - 1) * blockSize} tokens); lower it or raise kvTokens`,
    );
  const names = new Set<string>();
  const routers = s.routers.map((r, i): RouterSpec => {
    if (names.has(r.name)) fail(origin, `routers[${i}].name`, `duplicate router name "${r.name}"`);
    names.add(r.name);
    if (typeof r.config !== "string") return { name: r.name, configText: toYaml(r.config), source: "inline" };
    const path = resolve(dir, r.config);
    try {
      return { name: r.name, configText: readFileSync(path, "utf8"), source: path };
    } catch (err) {
      return fail(origin, `routers[${i}].config`, `cannot read ${path}: ${(err as Error).message}`);
    }
  });
  let workload: WorkloadSpec;
  try {
    workload = resolveWorkloadSpec({ seed: s.seed, ...s.workload });
  } catch (err) {
    if (err instanceof WorkloadSpecError || err instanceof RangeError)
      return fail(origin, "workload", err.message);
    throw err;
  }
  let traceText: string | undefined;
  if (workload.workload === "trace") {
    const p = workload.options["path"];
    if (typeof p !== "string")
      fail(origin, "workload.options.path", "a trace workload needs a trace file path");
    try {
      traceText = readFileSync(resolve(dir, p as string), "utf8");
    } catch (err) {
      fail(origin, "workload.options.path", (err as Error).message);
    }
  }
  const blockHash: BlockHashAlgo = s.blockHash ?? "fast64";
  return {
    name: s.name,
    description: s.description ?? "",
    seed: s.seed,
    origin,
    fleet: {
      replicas: f.replicas,
      profile,
      model: profile.model.name,
      blockSize,
      numGpuBlocks,
      maxNumSeqs: f.maxNumSeqs ?? profile.defaults.maxNumSeqs,
      maxNumBatchedTokens: f.maxNumBatchedTokens ?? profile.defaults.maxNumBatchedTokens,
      maxModelLen,
      labels: f.labels ?? {},
      blockHashAlgo: blockHash,
      enableKvCacheEvents: s.kvEvents ?? false,
    },
    kvTokens: (numGpuBlocks - 1) * blockSize,
    routers,
    workload,
    ...(traceText !== undefined ? { traceText } : {}),
    scrapeInterval: (s.scrapeIntervalMs ?? 100) / 1000,
    gatewayDelay: (s.gatewayDelayMs ?? 0) / 1000,
    routerTokenizer: s.routerTokenizer ?? false,
    kvEventsDelay: (s.kvEventsDelayMs ?? 5) / 1000,
  };
}
