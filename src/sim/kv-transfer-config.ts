/**
 * Parses vLLM's `--kv-transfer-config` JSON for the simulated replica (vLLM vllm/config/kv_transfer.py
 * `KVTransferConfig`: its field names, defaults and extra="forbid" strictness), and the modelled
 * KV-transfer link. Only `NixlConnector` (and its `NixlPullConnector` name) is simulated; vLLM's other
 * connector names get an error saying so, unknown names vLLM's "Unsupported connector type".
 *
 * kv_load_failure_policy is a top-level KVTransferConfig field in vLLM; it is also accepted inside
 * kv_connector_extra_config (where deployment guides put it), the top-level value winning.
 */
import { randomUUID } from "node:crypto";
import { z } from "zod";
import { DEFAULT_KV_LEASE_SECONDS } from "../engine/kv-lease.ts";

export type KvRole = "kv_producer" | "kv_consumer" | "kv_both";

export interface KvTransferConfig {
  kvConnector: "NixlConnector";
  kvRole: KvRole;
  /** This engine's id (vLLM engine_id, a uuid4 unless given): the prefiller's remote_engine_id. */
  engineId: string;
  kvLoadFailurePolicy: "fail" | "recompute";
  /** kv_connector_extra_config.kv_lease_duration, seconds (vLLM v0.22+). */
  kvLeaseDuration: number;
  extra: Record<string, unknown>;
}

/** Producer role: honours do_remote_decode and holds blocks for a consumer. */
export const isProducer = (c: KvTransferConfig) => c.kvRole !== "kv_consumer";
/** Consumer role: honours do_remote_prefill and pulls KV from a producer. */
export const isConsumer = (c: KvTransferConfig) => c.kvRole !== "kv_producer";

export class KvTransferConfigError extends Error {
  override name = "KvTransferConfigError";
}

/** vLLM connector names kvgate knows but does not simulate. */
const OTHER_CONNECTORS = [
  "ExampleConnector",
  "LMCacheConnectorV1",
  "LMCacheMPConnector",
  "NixlPushConnector",
  "MultiConnector",
  "MoRIIOConnector",
  "OffloadingConnector",
  "DecodeBenchConnector",
  "MooncakeConnector",
  "MooncakeStoreConnector",
  "FlexKVConnectorV1",
  "SimpleCPUOffloadConnector",
  "P2pNcclConnector",
  "SharedStorageConnector",
];

const policy = z.enum(["recompute", "fail"]);

const schema = z.strictObject({
  kv_connector: z.string().nullable().default(null),
  engine_id: z.string().nullable().default(null),
  kv_buffer_device: z.string().default("cuda"),
  kv_buffer_size: z.number().default(1e9),
  kv_role: z.enum(["kv_producer", "kv_consumer", "kv_both"]).nullable().default(null),
  kv_rank: z.int().nullable().default(null),
  kv_parallel_size: z.int().default(1),
  kv_ip: z.string().default("127.0.0.1"),
  kv_port: z.int().default(14579),
  kv_connector_extra_config: z.record(z.string(), z.unknown()).default({}),
  kv_connector_module_path: z.string().nullable().default(null),
  enable_permute_local_kv: z.boolean().default(false),
  kv_load_failure_policy: policy.optional(),
});

const ROLES = "'kv_producer', 'kv_consumer' or 'kv_both'";

/** Parses the JSON text of `--kv-transfer-config`. Throws KvTransferConfigError saying what to fix. */
export function parseKvTransferConfig(json: string): KvTransferConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new KvTransferConfigError(
      `not valid JSON: ${(err as Error).message}; pass an object such as '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'`,
    );
  }
  const r = schema.safeParse(raw);
  if (!r.success) {
    const problems = r.error.issues.map((issue) => {
      if (issue.code === "unrecognized_keys")
        return `unknown field(s) ${issue.keys.join(", ")} (vLLM's KVTransferConfig forbids extra fields; remove them)`;
      const path = issue.path.length > 0 ? issue.path.join(".") : "(root)";
      if (path === "kv_role") return `kv_role: Input should be ${ROLES}`;
      return `${path}: ${issue.message}`;
    });
    throw new KvTransferConfigError(`${problems.join("; ")}`);
  }
  const c = r.data;
  if (c.kv_connector === null)
    throw new KvTransferConfigError('kv_connector is required; kvgate simulates "NixlConnector"');
  if (c.kv_connector !== "NixlConnector" && c.kv_connector !== "NixlPullConnector") {
    const known = OTHER_CONNECTORS.includes(c.kv_connector);
    throw new KvTransferConfigError(
      known
        ? `kv_connector ${c.kv_connector} is a vLLM connector kvgate sim-replica does not simulate; use "NixlConnector"`
        : `Unsupported connector type: ${c.kv_connector}; kvgate sim-replica simulates "NixlConnector"`,
    );
  }
  if (c.kv_role === null)
    throw new KvTransferConfigError(
      `Please specify kv_role when kv_connector is set, supported roles are ${ROLES}`,
    );
  const extra = c.kv_connector_extra_config;
  const lease = extra["kv_lease_duration"] ?? DEFAULT_KV_LEASE_SECONDS;
  if (typeof lease !== "number" || !(lease > 0) || !Number.isFinite(lease))
    throw new KvTransferConfigError(
      `kv_connector_extra_config.kv_lease_duration must be a number of seconds > 0, got ${JSON.stringify(lease)}`,
    );
  const extraPolicy = extra["kv_load_failure_policy"];
  if (extraPolicy !== undefined && !policy.safeParse(extraPolicy).success)
    throw new KvTransferConfigError(
      `kv_load_failure_policy must be "fail" or "recompute", got ${JSON.stringify(extraPolicy)}`,
    );
  return {
    kvConnector: "NixlConnector",
    kvRole: c.kv_role,
    engineId: c.engine_id ?? randomUUID(),
    kvLoadFailurePolicy:
      c.kv_load_failure_policy ?? (extraPolicy as "fail" | "recompute" | undefined) ?? "fail",
    kvLeaseDuration: lease,
    extra,
  };
}

/** The modelled KV-transfer link between a decoder and a prefiller. */
export interface KvLink {
  /** Bytes per second of one transfer. */
  bandwidth: number;
  /** Fixed cost of posting one transfer, seconds (vllm:nixl_post_time_seconds). */
  overhead: number;
  /** One-time cost of the first contact between a (decoder, prefiller) pair, seconds. */
  handshake: number;
}

/**
 * Published defaults. RDMA: ~7–11 GB/s effective per transfer (llm-d v0.5 blog, 2026-02-04: 4 GB in
 * ~360 ms over 200 Gb/s; vllm-project/vllm PR #25388: 70 MB in 9.86 ms = 7.1 GB/s, post 5.69 ms);
 * we take 8 GB/s and 5 ms. TCP fallback without RDMA: 0.5 GB/s (vllm-project/vllm#52607, pull
 * NixlConnector over cuda_ipc/TCP). Handshake: ~5 s once per pair (llm-d/llm-d
 * docs/operations/disaggregation/vllm.md).
 */
export const KV_LINK_PRESETS: Record<"rdma" | "tcp", KvLink> = {
  rdma: { bandwidth: 8e9, overhead: 0.005, handshake: 5 },
  tcp: { bandwidth: 0.5e9, overhead: 0.005, handshake: 5 },
};

/** Modelled seconds of one transfer of `bytes` (post overhead included, handshake not). */
export function transferSeconds(link: KvLink, bytes: number): number {
  return link.overhead + bytes / link.bandwidth;
}

/**
 * The side-channel address a producer advertises (vLLM VLLM_NIXL_SIDE_CHANNEL_HOST, default
 * "localhost"; VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600, plus the data-parallel rank).
 */
export function sideChannelAddress(
  env: NodeJS.ProcessEnv,
  dpRank: number,
  over: { host?: string; port?: number } = {},
): { host: string; port: number } {
  const host = over.host ?? env["VLLM_NIXL_SIDE_CHANNEL_HOST"] ?? "localhost";
  const envPort = env["VLLM_NIXL_SIDE_CHANNEL_PORT"];
  let base = 5600;
  if (envPort !== undefined) {
    base = Number(envPort);
    if (!Number.isInteger(base) || base < 0 || base > 65535)
      throw new KvTransferConfigError(`VLLM_NIXL_SIDE_CHANNEL_PORT must be a port number, got ${envPort}`);
  }
  // An explicit port 0 asks for any free port (tests); it is not offset.
  const port = over.port !== undefined ? (over.port === 0 ? 0 : over.port + dpRank) : base + dpRank;
  return { host, port };
}
