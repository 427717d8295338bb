/**
 * Settings of one simulated vLLM replica and their resolution into a complete, checked option set:
 * defaults come from the profile (max-num-seqs, max-num-batched-tokens, max-model-len, GPU blocks),
 * every number is checked, and errors name the vLLM-style flag they belong to. Shared by the CLI
 * (`kvgate sim-replica`) and tests that start a replica in-process.
 */
import { numGpuBlocksFor, type Profile } from "../engine/profile.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import type { EngineConfig, OffloadConfig } from "../engine/types.ts";
import { checkFaultOptions, type FaultOptions, NO_FAULTS } from "./faults.ts";
import { type KvEventsConfig, parseKvEventsConfig } from "./kv-events-config.ts";
import {
  type KvOffloadingBackend,
  offloadFromFlags,
  offloadFromTransferConfig,
} from "./kv-offload-config.ts";
import {
  KV_LINK_PRESETS,
  type KvLink,
  type KvTransferConfig,
  parseKvTransferConfig,
  sideChannelAddress,
} from "./kv-transfer-config.ts";
import { LoraOptionError, type LoraOptions, type LoraSettings, resolveLora } from "./lora-config.ts";
import { DEFAULT_PROFILE, loadProfile } from "./profiles.ts";

/** A bad setting; `flag` is the CLI flag it maps to (e.g. "--max-model-len"). */
export class ReplicaOptionError extends Error {
  override name = "ReplicaOptionError";
  readonly flag: string;
  constructor(flag: string, message: string) {
    super(`${flag}: ${message}`);
    this.flag = flag;
  }
}

/** What a user may set; everything is optional. */
export interface ReplicaSettings {
  host?: string;
  /** 0 picks an ephemeral port. */
  port?: number;
  /** Model path/name (vLLM --model); defaults to the profile's model name. */
  model?: string;
  /** Names clients may use; the first is reported in metrics (vLLM --served-model-name). */
  servedModelName?: string | string[];
  /** Built-in profile name, YAML path, or a loaded Profile. */
  profile?: string | Profile;
  blockSize?: number;
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  numGpuBlocksOverride?: number;
  maxModelLen?: number;
  longPrefillTokenThreshold?: number;
  enablePrefixCaching?: boolean;
  /** vLLM --scheduling-policy: fcfs (default) or priority (requests' `priority`, lower first). */
  schedulingPolicy?: "fcfs" | "priority";
  /**
   * vLLM --stream-interval: a stream's chunks carry this many new tokens (the first token, and the
   * last, go out at once). Default 1, a chunk per token.
   */
  streamInterval?: number;
  seed?: number;
  /** PYTHONHASHSEED for the block-hash chain; default: the env var, else "0". */
  hashSeed?: string;
  /** Simulated seconds per wall second. */
  timeScale?: number;
  /** A Tokenizer, or a directory holding tokenizer.json (loaded offline). Default: the sim tokenizer. */
  tokenizer?: Tokenizer | string;
  /** Parsed config or the JSON text of --kv-events-config. */
  kvEventsConfig?: KvEventsConfig | string | null;
  kvEventsFormat?: "array" | "map";
  /** Parsed config or the JSON text of --kv-transfer-config (P/D with NixlConnector, or the OffloadingConnector). */
  kvTransferConfig?: KvTransferConfig | string | null;
  /** vLLM --kv-offloading-size, GiB of host memory for the CPU KV tier. */
  kvOffloadingSize?: number;
  /** vLLM --kv-offloading-backend (native; lmcache is not simulated). */
  kvOffloadingBackend?: KvOffloadingBackend;
  /** Host-link bandwidth of the CPU tier, bytes/s, both directions (default 50 GB/s). */
  kvOffloadingBandwidth?: number;
  /** The advertised and bound side-channel host (default: $VLLM_NIXL_SIDE_CHANNEL_HOST, else localhost). */
  nixlSideChannelHost?: string;
  /** Side-channel base port (default: $VLLM_NIXL_SIDE_CHANNEL_PORT, else 5600), plus the DP rank; 0 = any free port. */
  nixlSideChannelPort?: number;
  /** Link preset: rdma (default) or tcp (fallback without RDMA). */
  kvTransport?: "rdma" | "tcp";
  /** Overrides of the preset: bandwidth in bytes/s, overhead and handshake in seconds. */
  kvLink?: Partial<KvLink>;
  dataParallelRank?: number;
  /** vLLM --enable-lora, --max-loras, --max-lora-rank, --lora-modules, and the modelled load time. */
  lora?: LoraSettings;
  legacyMetricNames?: boolean;
  faults?: Partial<FaultOptions>;
  maxRequestBodyBytes?: number;
  /**
   * What a crash fault does. Default: the server cuts every connection and stops listening (safe
   * in-process); the CLI passes a hard kill of the process.
   */
  onCrash?: () => void;
  log?: (line: string) => void;
}

export interface ReplicaOptions {
  host: string;
  port: number;
  model: string;
  servedModelNames: string[];
  profile: Profile;
  blockSize: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  numGpuBlocks: number;
  maxModelLen: number;
  longPrefillTokenThreshold: number;
  enablePrefixCaching: boolean;
  schedulingPolicy: "fcfs" | "priority";
  streamInterval: number;
  seed: number;
  hashSeed: string;
  timeScale: number;
  tokenizer: Tokenizer;
  kvEventsConfig: KvEventsConfig | null;
  kvEventsFormat: "array" | "map";
  kvTransferConfig: KvTransferConfig | null;
  /** The CPU offload tier, or null. */
  kvOffload: OffloadConfig | null;
  /** Where the NIXL side channel listens and what kv_transfer_params advertise. */
  sideChannel: { host: string; port: number };
  kvLink: KvLink;
  dataParallelRank: number;
  /** LoRA serving (lora-config.ts), or null without --enable-lora. */
  lora: LoraOptions | null;
  legacyMetricNames: boolean;
  faults: FaultOptions;
  maxRequestBodyBytes: number;
  onCrash: (() => void) | null;
  log: (line: string) => void;
}

export const DEFAULT_PORT = 8000;
export const DEFAULT_BLOCK_SIZE = 16;
/** Default request body limit: a max-length prompt as JSON token ids fits with room to spare. */
export const DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024;

function int(
  flag: string,
  v: number | undefined,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number | undefined {
  if (v === undefined) return undefined;
  if (!Number.isInteger(v) || v < min || v > max)
    throw new ReplicaOptionError(flag, `must be an integer in [${min}, ${max}], got ${v}`);
  return v;
}

/** The hash seed vLLM would use: PYTHONHASHSEED if set, else "0" (fixed, so runs are reproducible). */
export function defaultHashSeed(env: NodeJS.ProcessEnv = process.env): string {
  return env["PYTHONHASHSEED"] ?? "0";
}

/** Fills defaults from the profile and checks everything; async because a tokenizer may be loaded. */
export async function resolveReplicaOptions(s: ReplicaSettings = {}): Promise<ReplicaOptions> {
  let profile: Profile;
  try {
    profile = typeof s.profile === "object" ? s.profile : loadProfile(s.profile ?? DEFAULT_PROFILE);
  } catch (err) {
    throw new ReplicaOptionError("--profile", (err as Error).message);
  }
  const port = int("--port", s.port, 0, 65535) ?? DEFAULT_PORT;
  const blockSize = int("--block-size", s.blockSize, 1, 1024) ?? DEFAULT_BLOCK_SIZE;
  const maxNumSeqs = int("--max-num-seqs", s.maxNumSeqs, 1) ?? profile.defaults.maxNumSeqs;
  const maxNumBatchedTokens =
    int("--max-num-batched-tokens", s.maxNumBatchedTokens, 1) ?? profile.defaults.maxNumBatchedTokens;
  const numGpuBlocks =
    int("--num-gpu-blocks-override", s.numGpuBlocksOverride, 2) ?? numGpuBlocksFor(profile, blockSize);
  const capacityTokens = (numGpuBlocks - 1) * blockSize;
  const modelMax = profile.defaults.maxModelLen;
  let maxModelLen = int("--max-model-len", s.maxModelLen, 1);
  if (maxModelLen === undefined) {
    maxModelLen = Math.min(modelMax, capacityTokens);
  } else {
    if (maxModelLen > modelMax)
      throw new ReplicaOptionError(
        "--max-model-len",
        `${maxModelLen} exceeds the model's ${modelMax} (profile ${profile.name})`,
      );
    if (maxModelLen > capacityTokens)
      throw new ReplicaOptionError(
        "--max-model-len",
        `${maxModelLen} tokens do not fit the KV cache (${numGpuBlocks - 1} blocks × ${blockSize} = ${capacityTokens} tokens)`,
      );
  }
  const longPrefillTokenThreshold =
    int("--long-prefill-token-threshold", s.longPrefillTokenThreshold, 0) ?? 0;
  const streamInterval = int("--stream-interval", s.streamInterval, 1) ?? 1;
  const seed = int("--seed", s.seed, 0, 2 ** 32 - 1) ?? 0;
  const timeScale = s.timeScale ?? 1;
  if (!(Number.isFinite(timeScale) && timeScale > 0))
    throw new ReplicaOptionError("--time-scale", `must be a number > 0, got ${timeScale}`);
  const dataParallelRank = int("--data-parallel-rank", s.dataParallelRank, 0, 1024) ?? 0;
  const maxRequestBodyBytes =
    int("--max-request-body-bytes", s.maxRequestBodyBytes, 1024) ?? DEFAULT_MAX_BODY_BYTES;

  const model = s.model ?? profile.model.name;
  if (!model) throw new ReplicaOptionError("--model", "must not be empty");
  const served = s.servedModelName === undefined ? [] : [s.servedModelName].flat();
  if (served.some((n) => typeof n !== "string" || n === ""))
    throw new ReplicaOptionError("--served-model-name", "names must be non-empty");
  const servedModelNames = served.length ? served : [model];

  let lora: LoraOptions | null;
  try {
    lora = resolveLora(s.lora ?? {}, servedModelNames);
  } catch (err) {
    if (err instanceof LoraOptionError) throw new ReplicaOptionError(err.flag, err.message);
    throw err;
  }

  let kvEventsConfig: KvEventsConfig | null = null;
  if (typeof s.kvEventsConfig === "string") {
    try {
      kvEventsConfig = parseKvEventsConfig(s.kvEventsConfig);
    } catch (err) {
      throw new ReplicaOptionError(
        "--kv-events-config",
        (err as Error).message.replace(/^--kv-events-config:? ?/, ""),
      );
    }
  } else if (s.kvEventsConfig) {
    kvEventsConfig = s.kvEventsConfig;
  }
  let kvTransferConfig: KvTransferConfig | null = null;
  let sideChannel = { host: "localhost", port: 5600 };
  let kvOffload: OffloadConfig | null = null;
  try {
    kvOffload = offloadFromFlags(s.kvOffloadingSize, s.kvOffloadingBackend, s.kvOffloadingBandwidth);
  } catch (err) {
    const flag = (err as Error).message.split(" ")[0]!;
    throw new ReplicaOptionError(flag, (err as Error).message.replace(/^\S+ /, ""));
  }
  try {
    const fromJson =
      typeof s.kvTransferConfig === "string"
        ? offloadFromTransferConfig(parseJsonOrNull(s.kvTransferConfig), s.kvOffloadingBandwidth)
        : null;
    if (fromJson !== null) {
      if (kvOffload !== null)
        throw new Error(
          "names the OffloadingConnector and --kv-offloading-size is given too; use one of them",
        );
      kvOffload = fromJson;
    } else
      kvTransferConfig =
        typeof s.kvTransferConfig === "string"
          ? parseKvTransferConfig(s.kvTransferConfig)
          : (s.kvTransferConfig ?? null);
    sideChannel = sideChannelAddress(process.env, dataParallelRank, {
      ...(s.nixlSideChannelHost !== undefined && { host: s.nixlSideChannelHost }),
      ...(s.nixlSideChannelPort !== undefined && { port: s.nixlSideChannelPort }),
    });
  } catch (err) {
    throw new ReplicaOptionError("--kv-transfer-config", (err as Error).message);
  }
  if (!Number.isInteger(sideChannel.port) || sideChannel.port < 0 || sideChannel.port > 65535)
    throw new ReplicaOptionError(
      "--nixl-side-channel-port",
      `must be a port in [0, 65535], got ${sideChannel.port}`,
    );
  if (kvOffload !== null && !(s.enablePrefixCaching ?? true))
    throw new ReplicaOptionError(
      "--kv-offloading-size",
      "needs prefix caching (the CPU tier is keyed by block hashes); drop --no-enable-prefix-caching",
    );
  if (kvOffload?.chunkTokens !== undefined && kvOffload.chunkTokens % blockSize !== 0)
    throw new ReplicaOptionError(
      "--kv-transfer-config",
      `kv_connector_extra_config.block_size ${kvOffload.chunkTokens} must be a multiple of --block-size ${blockSize}`,
    );
  const transport = s.kvTransport ?? "rdma";
  if (transport !== "rdma" && transport !== "tcp")
    throw new ReplicaOptionError("--kv-transport", `must be rdma or tcp, got ${transport}`);
  const kvLink: KvLink = { ...KV_LINK_PRESETS[transport], ...s.kvLink };
  if (!(kvLink.bandwidth > 0 && Number.isFinite(kvLink.bandwidth)))
    throw new ReplicaOptionError(
      "--kv-transfer-bandwidth",
      `must be a number > 0 (GB/s), got ${kvLink.bandwidth}`,
    );
  for (const [flag, v] of [
    ["--kv-transfer-overhead", kvLink.overhead],
    ["--kv-transfer-handshake", kvLink.handshake],
  ] as const)
    if (!(v >= 0 && Number.isFinite(v))) throw new ReplicaOptionError(flag, `must be a number ≥ 0, got ${v}`);

  const schedulingPolicy = s.schedulingPolicy ?? "fcfs";
  if (schedulingPolicy !== "fcfs" && schedulingPolicy !== "priority")
    throw new ReplicaOptionError("--scheduling-policy", `must be fcfs or priority, got ${schedulingPolicy}`);
  const kvEventsFormat = s.kvEventsFormat ?? "map";
  if (kvEventsFormat !== "array" && kvEventsFormat !== "map")
    throw new ReplicaOptionError("--kv-events-format", `must be array or map, got ${kvEventsFormat}`);

  const faults: FaultOptions = { ...NO_FAULTS, ...s.faults };
  const faultError = checkFaultOptions(faults);
  if (faultError) throw new ReplicaOptionError(faultError.split(" ")[0]!, faultError.replace(/^\S+ /, ""));

  let tokenizer: Tokenizer;
  if (s.tokenizer === undefined) {
    const { createSimTokenizer } = await import("../engine/sim-tokenizer.ts");
    tokenizer = createSimTokenizer({ vocabSize: profile.model.vocabSize });
  } else if (typeof s.tokenizer === "string") {
    try {
      const { loadHfTokenizer } = await import("../datalayer/hf-tokenizer.ts");
      tokenizer = await loadHfTokenizer(s.tokenizer);
    } catch (err) {
      throw new ReplicaOptionError(
        "--tokenizer",
        `cannot load a tokenizer from ${s.tokenizer}: ${(err as Error).message}`,
      );
    }
  } else {
    tokenizer = s.tokenizer;
  }

  return {
    host: s.host ?? "127.0.0.1",
    port,
    model,
    servedModelNames,
    profile,
    blockSize,
    maxNumSeqs,
    maxNumBatchedTokens,
    numGpuBlocks,
    maxModelLen,
    longPrefillTokenThreshold,
    enablePrefixCaching: s.enablePrefixCaching ?? true,
    schedulingPolicy,
    streamInterval,
    seed,
    hashSeed: s.hashSeed ?? defaultHashSeed(),
    timeScale,
    tokenizer,
    kvEventsConfig,
    kvEventsFormat,
    kvTransferConfig,
    kvOffload,
    sideChannel,
    kvLink,
    dataParallelRank,
    lora,
    legacyMetricNames: s.legacyMetricNames ?? false,
    faults,
    maxRequestBodyBytes,
    onCrash: s.onCrash ?? null,
    log: s.log ?? ((line) => console.error(line)),
  };
}

/** The parsed JSON, or null when it does not parse (parseKvTransferConfig then says why). */
function parseJsonOrNull(json: string): unknown {
  try {
    return JSON.parse(json);
  } catch {
    return null;
  }
}

/** The engine configuration these options describe. */
export function engineConfigOf(o: ReplicaOptions): EngineConfig {
  return {
    blockSize: o.blockSize,
    numGpuBlocks: o.numGpuBlocks,
    maxNumSeqs: o.maxNumSeqs,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
    maxModelLen: o.maxModelLen,
    longPrefillTokenThreshold: o.longPrefillTokenThreshold,
    enablePrefixCaching: o.enablePrefixCaching,
    hashSeed: o.hashSeed,
    seed: o.seed,
    modelName: o.servedModelNames[0]!,
    dataParallelRank: o.dataParallelRank,
    enableKvCacheEvents: o.kvEventsConfig?.enableKvCacheEvents ?? false,
    profile: o.profile,
    schedulingPolicy: o.schedulingPolicy,
    vocabSize: o.tokenizer.vocabSize,
    eosTokenId: o.tokenizer.eosTokenId,
    ...(o.kvOffload !== null && { kvOffload: o.kvOffload }),
    ...(o.lora !== null && { lora: { maxLoras: o.lora.maxLoras, loadSeconds: o.lora.loadSeconds } }),
    ...(o.kvTransferConfig && {
      kvLoadFailurePolicy: o.kvTransferConfig.kvLoadFailurePolicy,
      kvLeaseDuration: o.kvTransferConfig.kvLeaseDuration,
    }),
  };
}
