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
import { parseSlo, type Slo } from "../../bench/slo.ts";
import {
  resolveWorkloadSpec,
  type WorkloadSpec,
  WorkloadSpecError,
  WorkloadSpecInputSchema,
} from "../../bench/workloads/spec.ts";
import { ROLE_LABEL } from "../../scheduler/plugins/filters/labels.ts";
import { REGION_LABEL } from "../../scheduler/plugins/filters/locality.ts";
import { allowedSuffix } from "../../scheduler/zod-keys.ts";
import { loadProfile } from "../profiles.ts";
import { type KvLinkConfig, kvLinkConfig } from "./kv-link.ts";
import { type LocalityConfig, LocalitySchema, resolveLocality } from "./locality.ts";
import type { FleetConfig } from "./replica.ts";
import { SharedStorageSchema, sharedStorageConfig } from "./shared-storage.ts";

export class ScenarioError extends Error {
  override name = "ScenarioError";
}

const posInt = z.number().int().positive();

/** What one pool of identical replicas may set (a single-pool fleet sets it at the top). */
const poolFields = {
  replicas: posInt,
  /** Built-in profile name or a YAML path (relative to the scenario file). */
  profile: z.string().min(1),
  /** KV capacity per replica in tokens (vLLM's figure, e.g. 307,328); default: the profile's. */
  kvTokens: posInt.optional(),
  /** GPU blocks per replica including the null block (vLLM --num-gpu-blocks-override). */
  numGpuBlocks: z.number().int().min(2).optional(),
  maxNumSeqs: posInt.optional(),
  maxNumBatchedTokens: posInt.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  /** CPU KV offload tier per replica, GiB (vLLM --kv-offloading-size, native OffloadingConnector). */
  kvOffloadingSize: z.number().finite().positive().optional(),
  /** Its host↔device bandwidth per direction, GB/s (default 50). */
  kvOffloadingBandwidthGBps: z.number().finite().positive().optional(),
  /** Its offload chunk in tokens (kv_connector_extra_config.block_size; default blockSize). */
  kvOffloadingBlockSize: posInt.optional(),
};

/** One pool of a P/D fleet; `role` sets the replicas' llm-d.ai/role label. */
const PoolSchema = z.strictObject({
  role: z.enum(["prefill", "decode", "prefill-decode"]).optional(),
  ...poolFields,
});

/**
 * The fleet: one pool of identical replicas (replicas, profile, …) or `pools`, each with its own
 * count, profile and role; the fleet-wide fields (blockSize, maxModelLen, and the pool fields as
 * defaults) apply to every pool.
 */
const FleetSchema = z.strictObject({
  ...poolFields,
  replicas: posInt.optional(),
  profile: z.string().min(1).optional(),
  blockSize: posInt.optional(),
  maxModelLen: posInt.optional(),
  pools: z.array(PoolSchema).min(1).optional(),
  /** A shared-storage tier behind every replica's CPU tier (shared-storage.ts); needs kvOffloadingSize. */
  sharedStorage: SharedStorageSchema.optional(),
});

/** The KV link between prefill and decode pools (kv-link.ts); defaults per transport. */
const KvLinkSchema = z.strictObject({
  transport: z.enum(["rdma", "tcp"]).optional(),
  bandwidthGBps: z.number().finite().positive().optional(),
  overheadMs: z.number().finite().nonnegative().optional(),
  handshakeS: z.number().finite().nonnegative().optional(),
});

const RouterSchema = z.strictObject({
  name: z.string().regex(/^[A-Za-z0-9._-]+$/, "must be letters, digits, '.', '_' or '-'"),
  /** Path to an EndpointPickerConfig YAML (relative to the scenario file), or the config inline. */
  config: z.union([z.string().min(1), z.record(z.string(), z.unknown())]),
  /** This run's own fleet instead of the scenario's (to compare fleets, e.g. aggregated vs P/D). */
  fleet: FleetSchema.optional(),
  /** This run's KV link instead of the scenario's (to compare transports). */
  kvLink: KvLinkSchema.optional(),
  /**
   * Several gateway replicas, each its own scheduler, requests round-robin across them; `sync`
   * shares their routing state as `kvgate serve --nats` does (syncDelayMs from a batch's take to
   * its merge on the peers; syncIntervalMs between a gateway's batches, the live default 20).
   */
  gateways: z
    .strictObject({
      replicas: posInt,
      sync: z.boolean().default(false),
      syncDelayMs: z.number().finite().nonnegative().default(1),
      syncIntervalMs: z.number().finite().positive().default(20),
    })
    .optional(),
});

export const ScenarioSchema = z.strictObject({
  name: z.string().min(1),
  description: z.string().optional(),
  seed: z.number().int().nonnegative(),
  fleet: FleetSchema,
  routers: z.array(RouterSchema).min(1),
  workload: WorkloadSpecInputSchema,
  /** The KV link of P/D fleets (default: RDMA's published figures). */
  kvLink: KvLinkSchema.optional(),
  /** Goodput objectives, as `kvgate bench --slo` takes them: "ttft=2,tpot=50ms". */
  slo: z.string().min(1).optional(),
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
  /** Regions: each one's traffic and the round trips between them (locality.ts). */
  locality: LocalitySchema.optional(),
});
export type ScenarioInput = z.infer<typeof ScenarioSchema>;

export interface RouterSpec {
  name: string;
  /** The pools this run's fleet is made of (the scenario's unless the router sets its own). */
  pools: FleetConfig[];
  kvLink: KvLinkConfig;
  /** EndpointPickerConfig YAML text. */
  configText: string;
  /** Where the config came from: a resolved path, or "inline". */
  source: string;
  /** Gateway replicas (default 1) and their sync (null: none). */
  gateways?: { replicas: number; sync: { delay: number; interval: number } | null };
}

/** A scenario with every default applied and every file read. */
export interface Scenario {
  name: string;
  description: string;
  seed: number;
  /** The routers' seed when set apart from `seed` (ScenarioOverrides.routerSeed); else `seed`. */
  routerSeed?: number;
  /** The factor its fleet and load were multiplied by (scale.ts, kvgate simulate --scale), when not 1. */
  scale?: number;
  /** The scenario file, or "(inline)". */
  origin: string;
  /** The scenario's fleet: its first pool (the whole fleet when it has one pool). */
  fleet: FleetConfig;
  /** The scenario's fleet, pool by pool. */
  pools: FleetConfig[];
  slo?: Slo;
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
  locality?: LocalityConfig;
}

function fail(origin: string, path: string, message: string): never {
  throw new ScenarioError(`scenario ${origin}: ${path ? `${path}: ` : ""}${message}`);
}

/** Fails with the first issue; an unknown field lists the keys allowed beside it (read along `input`). */
function zodFail(origin: string, e: z.ZodError, input: unknown): never {
  const i = e.issues[0];
  let path = i.path
    .map((k, n) => (typeof k === "number" ? `[${k}]` : n === 0 ? String(k) : `.${String(k)}`))
    .join("");
  let message = i.message;
  if (i.code === "unrecognized_keys") {
    const key = i.keys[0];
    path = path ? `${path}.${key}` : key;
    message = `unknown field${allowedSuffix(ScenarioSchema, i.path, input)}`;
  }
  return fail(origin, path, message);
}

/** What `kvgate simulate` may change in a scenario from its command line. */
export interface ScenarioOverrides {
  /** Replaces the scenario's seed and its workload's (regions without a seed of their own follow it). */
  seed?: number;
  /**
   * Seeds the routers' own random draws (tie-breaks, random picks) apart from the scenario's seed:
   * the same traffic and engines, with other placement draws.
   */
  routerSeed?: number;
}

/** Parses and resolves a scenario's YAML text; `file` anchors relative paths. Throws ScenarioError. */
export function parseScenario(text: string, file?: string, overrides: ScenarioOverrides = {}): Scenario {
  const origin = file ?? "(inline)";
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    return fail(origin, "", `invalid YAML: ${(err as Error).message}`);
  }
  const parsed = ScenarioSchema.safeParse(raw ?? {});
  if (!parsed.success) return zodFail(origin, parsed.error, raw ?? {});
  if (overrides.seed !== undefined) {
    parsed.data.seed = overrides.seed;
    (parsed.data.workload as { seed?: number }).seed = overrides.seed;
  }
  const sc = resolveScenario(
    parsed.data,
    origin,
    file === undefined ? process.cwd() : dirname(resolve(file)),
  );
  return overrides.routerSeed === undefined ? sc : { ...sc, routerSeed: overrides.routerSeed };
}

/** Reads and parses a scenario file. */
export function loadScenario(file: string, overrides: ScenarioOverrides = {}): Scenario {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new ScenarioError(`cannot read scenario ${file}: ${(err as Error).message}; check the path`);
  }
  return parseScenario(text, file, overrides);
}

type FleetInput = z.infer<typeof FleetSchema>;
type LinkInput = z.infer<typeof KvLinkSchema>;

function resolveLink(origin: string, path: string, l: LinkInput | undefined, base?: LinkInput): KvLinkConfig {
  const m = { ...base, ...l };
  try {
    return kvLinkConfig(m.transport ?? "rdma", m);
  } catch (err) {
    return fail(origin, path, (err as Error).message);
  }
}

/** A fleet's pools, every default applied and checked; `path` names the fleet in errors. */
function resolvePools(
  origin: string,
  path: string,
  f: FleetInput,
  dir: string,
  s: ScenarioInput,
): FleetConfig[] {
  const inputs = f.pools ?? [{ replicas: f.replicas, profile: f.profile }];
  if (f.pools !== undefined && (f.replicas !== undefined || f.profile !== undefined))
    fail(origin, `${path}.pools`, "give pools or replicas and profile, not both");
  const blockSize = f.blockSize ?? 16;
  const models = new Set<string>();
  const pools = inputs.map((pool, k): FleetConfig => {
    const at = f.pools ? `${path}.pools[${k}]` : path;
    const p = { ...f, ...pool };
    if (p.replicas === undefined) return fail(origin, `${at}.replicas`, "required");
    if (p.profile === undefined) return fail(origin, `${at}.profile`, "required");
    let profile: ReturnType<typeof loadProfile>;
    try {
      profile = loadProfile(p.profile, { cwd: dir });
    } catch (err) {
      return fail(origin, `${at}.profile`, (err as Error).message);
    }
    models.add(profile.model.name);
    if (p.kvTokens !== undefined && p.numGpuBlocks !== undefined)
      fail(origin, `${at}.numGpuBlocks`, "give kvTokens or numGpuBlocks, not both");
    const numGpuBlocks =
      p.numGpuBlocks ?? Math.floor((p.kvTokens ?? profile.kvCapacityTokens) / blockSize) + 1;
    if (numGpuBlocks < 2) fail(origin, `${at}.kvTokens`, `holds no full block of ${blockSize} tokens`);
    const maxModelLen = f.maxModelLen ?? profile.defaults.maxModelLen;
    if (Math.ceil(maxModelLen / blockSize) > numGpuBlocks - 1)
      fail(
        origin,
        `${path}.maxModelLen`,
        `${maxModelLen} tokens do not fit the KV cache (${(numGpuBlocks - 1) * blockSize} tokens); lower it or raise kvTokens`,
      );
    const role = "role" in pool ? pool.role : undefined;
    if (p.kvOffloadingBlockSize !== undefined && p.kvOffloadingBlockSize % blockSize !== 0)
      fail(origin, `${at}.kvOffloadingBlockSize`, `must be a multiple of blockSize ${blockSize}`);
    if (
      p.kvOffloadingSize === undefined &&
      (p.kvOffloadingBlockSize ?? p.kvOffloadingBandwidthGBps) !== undefined
    )
      fail(
        origin,
        `${at}.kvOffloadingSize`,
        "required with kvOffloadingBlockSize or kvOffloadingBandwidthGBps",
      );
    if (f.sharedStorage !== undefined && p.kvOffloadingSize === undefined)
      fail(
        origin,
        `${at}.kvOffloadingSize`,
        "required with sharedStorage: storage is the CPU tier's secondary tier (llm-d's CPU + filesystem tiering)",
      );
    const bw = p.kvOffloadingBandwidthGBps;
    const kvOffload =
      p.kvOffloadingSize === undefined
        ? undefined
        : {
            cpuBytes: p.kvOffloadingSize * 2 ** 30,
            ...(p.kvOffloadingBlockSize !== undefined && { chunkTokens: p.kvOffloadingBlockSize }),
            ...(bw !== undefined && { loadBandwidth: bw * 1e9, storeBandwidth: bw * 1e9 }),
          };
    return {
      replicas: p.replicas,
      profile,
      model: profile.model.name,
      blockSize,
      numGpuBlocks,
      maxNumSeqs: p.maxNumSeqs ?? profile.defaults.maxNumSeqs,
      maxNumBatchedTokens: p.maxNumBatchedTokens ?? profile.defaults.maxNumBatchedTokens,
      maxModelLen,
      labels: { ...(p.labels ?? {}), ...(role !== undefined ? { [ROLE_LABEL]: role } : {}) },
      blockHashAlgo: s.blockHash ?? "fast64",
      enableKvCacheEvents: s.kvEvents ?? false,
      ...(kvOffload !== undefined && { kvOffload }),
      ...(f.sharedStorage !== undefined && { sharedStorage: sharedStorageConfig(f.sharedStorage) }),
    };
  });
  if (models.size > 1)
    fail(
      origin,
      `${path}.pools`,
      `every pool must serve one model; got ${[...models].join(", ")}; give every pool a profile of the same model`,
    );
  return pools;
}

function resolveScenario(s: ScenarioInput, origin: string, dir: string): Scenario {
  const pools = resolvePools(origin, "fleet", s.fleet, dir, s);
  const link = resolveLink(origin, "kvLink", s.kvLink);
  const names = new Set<string>();
  const routers = s.routers.map((r, i): RouterSpec => {
    if (names.has(r.name))
      fail(origin, `routers[${i}].name`, `duplicate router name "${r.name}"; give each router its own name`);
    names.add(r.name);
    const g = r.gateways;
    const own = {
      pools: r.fleet ? resolvePools(origin, `routers[${i}].fleet`, r.fleet, dir, s) : pools,
      kvLink: r.kvLink ? resolveLink(origin, `routers[${i}].kvLink`, r.kvLink, s.kvLink) : link,
      ...(g
        ? {
            gateways: {
              replicas: g.replicas,
              sync: g.sync ? { delay: g.syncDelayMs / 1000, interval: g.syncIntervalMs / 1000 } : null,
            },
          }
        : {}),
    };
    if (own.pools[0].model !== pools[0].model)
      fail(
        origin,
        `routers[${i}].fleet`,
        `serves ${own.pools[0].model}, the scenario's fleet ${pools[0].model}; give this fleet profiles of ${pools[0].model}`,
      );
    if (typeof r.config !== "string")
      return { name: r.name, ...own, configText: toYaml(r.config), source: "inline" };
    const path = resolve(dir, r.config);
    try {
      return { name: r.name, ...own, configText: readFileSync(path, "utf8"), source: path };
    } catch (err) {
      return fail(origin, `routers[${i}].config`, `cannot read ${path}: ${(err as Error).message}`);
    }
  });
  let slo: Slo | undefined;
  if (s.slo !== undefined)
    try {
      slo = parseSlo(s.slo);
    } catch (err) {
      fail(origin, "slo", (err as Error).message);
    }
  let workload: WorkloadSpec;
  try {
    workload = resolveWorkloadSpec({ seed: s.seed, ...s.workload });
  } catch (err) {
    if (err instanceof WorkloadSpecError || err instanceof RangeError)
      return fail(origin, "workload", err.message);
    throw err;
  }
  let locality: LocalityConfig | undefined;
  if (s.locality !== undefined) {
    const label = s.locality.label ?? REGION_LABEL;
    const regions = routers.flatMap((r) => r.pools.map((p) => p.labels[label]));
    try {
      locality = resolveLocality(s.locality, regions);
    } catch (err) {
      fail(origin, "locality", (err as Error).message);
    }
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
  return {
    name: s.name,
    description: s.description ?? "",
    seed: s.seed,
    origin,
    fleet: pools[0],
    pools,
    ...(slo !== undefined ? { slo } : {}),
    kvTokens: (pools[0].numGpuBlocks - 1) * pools[0].blockSize,
    routers,
    workload,
    ...(traceText !== undefined ? { traceText } : {}),
    scrapeInterval: (s.scrapeIntervalMs ?? 100) / 1000,
    gatewayDelay: (s.gatewayDelayMs ?? 0) / 1000,
    routerTokenizer: s.routerTokenizer ?? false,
    kvEventsDelay: (s.kvEventsDelayMs ?? 5) / 1000,
    ...(locality !== undefined ? { locality } : {}),
  };
}
