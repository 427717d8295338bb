/**
 * The simulated replica's CPU KV offload settings, as vLLM takes them: `--kv-offloading-size <GiB>`
 * with `--kv-offloading-backend native` (vllm/config/cache.py; vllm/config/vllm.py maps it to
 * kv_connector "OffloadingConnector" with kv_connector_extra_config.cpu_bytes_to_use = size × 2^30),
 * or an explicit `--kv-transfer-config` naming the OffloadingConnector, whose
 * kv_connector_extra_config may set `cpu_bytes_to_use`, `block_size` (the offload chunk, a multiple
 * of the GPU block size) and `self_describing_kv_events`. The lmcache backend is not simulated.
 */
import type { OffloadConfig } from "../engine/types.ts";

export class KvOffloadConfigError extends Error {
  override name = "KvOffloadConfigError";
}

/** vLLM's --kv-offloading-backend values. */
export type KvOffloadingBackend = "native" | "lmcache";

/**
 * The tier of `--kv-offloading-size` GiB (the total across TP ranks, as in vLLM), or null without a
 * size (vLLM ignores the backend then). `bandwidth` (bytes/s) overrides both host-link directions.
 */
export function offloadFromFlags(
  sizeGiB: number | undefined,
  backend: KvOffloadingBackend | undefined,
  bandwidth?: number,
): OffloadConfig | null {
  if (sizeGiB === undefined) return null;
  if (!(sizeGiB > 0) || !Number.isFinite(sizeGiB))
    throw new KvOffloadConfigError(`--kv-offloading-size must be a number of GiB > 0, got ${sizeGiB}`);
  const b = backend ?? "native";
  if (b === "lmcache")
    throw new KvOffloadConfigError(
      "--kv-offloading-backend lmcache is not simulated; use native (vLLM's OffloadingConnector)",
    );
  if (b !== "native")
    throw new KvOffloadConfigError(`--kv-offloading-backend must be native or lmcache, got ${String(b)}`);
  return withBandwidth({ cpuBytes: sizeGiB * 2 ** 30 }, bandwidth);
}

/**
 * The tier an OffloadingConnector `--kv-transfer-config` describes (its JSON already parsed), or
 * null when it names another connector. Throws KvOffloadConfigError saying what to fix.
 */
export function offloadFromTransferConfig(raw: unknown, bandwidth?: number): OffloadConfig | null {
  if (typeof raw !== "object" || raw === null) return null;
  const c = raw as Record<string, unknown>;
  if (c["kv_connector"] !== "OffloadingConnector") return null;
  const extra = (c["kv_connector_extra_config"] ?? {}) as Record<string, unknown>;
  if (typeof extra !== "object" || extra === null || Array.isArray(extra))
    throw new KvOffloadConfigError("kv_connector_extra_config must be an object");
  const bytes = extra["cpu_bytes_to_use"];
  if (typeof bytes !== "number" || !(bytes > 0))
    throw new KvOffloadConfigError(
      "cpu_bytes_to_use must be specified in kv_connector_extra_config (bytes of host memory, e.g. 107374182400 for 100 GiB)",
    );
  const out: OffloadConfig = { cpuBytes: bytes };
  const bs = extra["block_size"];
  if (bs !== undefined) {
    if (typeof bs !== "number" || !Number.isInteger(bs) || bs <= 0)
      throw new KvOffloadConfigError(
        `kv_connector_extra_config.block_size must be a positive integer (tokens), got ${JSON.stringify(bs)}`,
      );
    out.chunkTokens = bs;
  }
  const sd = extra["self_describing_kv_events"];
  if (sd !== undefined) {
    if (typeof sd !== "boolean")
      throw new KvOffloadConfigError(
        `kv_connector_extra_config.self_describing_kv_events must be true or false, got ${JSON.stringify(sd)}`,
      );
    out.selfDescribingEvents = sd;
  }
  return withBandwidth(out, bandwidth);
}

function withBandwidth(c: OffloadConfig, bandwidth: number | undefined): OffloadConfig {
  if (bandwidth === undefined) return c;
  if (!(bandwidth > 0) || !Number.isFinite(bandwidth))
    throw new KvOffloadConfigError(`--kv-offloading-bandwidth must be a number > 0 (GB/s), got ${bandwidth}`);
  return { ...c, loadBandwidth: bandwidth, storeBandwidth: bandwidth };
}
