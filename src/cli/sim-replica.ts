/**
 * `kvgate sim-replica`: runs one simulated vLLM replica. Flags carry vLLM's names (--port,
 * --max-num-seqs, --kv-events-config, ...); the profile supplies the defaults a real GPU would, and
 * vLLM's other common flags are accepted with a note that they change nothing (vllm-flags.ts).
 * Prints one startup line; a taken port names itself and the flag to change; SIGTERM/SIGINT close
 * the server and the KV-event publisher and exit 0.
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { DEFAULT_PROFILE, listProfiles } from "../sim/profiles.ts";
import type { ReplicaSettings } from "../sim/replica-options.ts";
import type { ReplicaServer } from "../sim/replica-server.ts";
import { integer, port } from "./flag-values.ts";
import { addVllmCompatFlags, compatNote, expandShortForms } from "./vllm-flags.ts";

const number = (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isFinite(n)) throw new InvalidArgumentError("must be a number.");
  return n;
};

interface Flags {
  port?: number;
  host?: string;
  model?: string;
  servedModelName?: string[];
  profile: string;
  listProfiles?: boolean;
  blockSize?: number;
  maxNumSeqs?: number;
  maxNumBatchedTokens?: number;
  numGpuBlocksOverride?: number;
  maxModelLen?: number;
  longPrefillTokenThreshold?: number;
  enablePrefixCaching?: boolean;
  schedulingPolicy?: "fcfs" | "priority";
  streamInterval?: number;
  kvEventsConfig?: string;
  kvEventsFormat?: "array" | "map";
  kvTransferConfig?: string;
  kvOffloadingSize?: number;
  kvOffloadingBackend?: "native" | "lmcache";
  kvOffloadingBandwidth?: number;
  nixlSideChannelHost?: string;
  nixlSideChannelPort?: number;
  kvTransport?: "rdma" | "tcp";
  kvTransferBandwidth?: number;
  kvTransferOverhead?: number;
  kvTransferHandshake?: number;
  dataParallelRank?: number;
  enableLora?: boolean;
  maxLoras?: number;
  maxLoraRank?: number;
  loraModules?: string[];
  loraLoadTime?: number;
  seed?: number;
  hashSeed?: string;
  timeScale?: number;
  tokenizer?: string;
  legacyMetricNames?: boolean;
  maxRequestBodyBytes?: number;
  faultCrashAfter?: number;
  faultExtraLatency?: number;
  faultErrorRate?: number;
  faultMetrics?: "stall" | "garbled";
}

/** `kvgate sim-replica ... -tp 2 ...` → `... --tensor-parallel-size 2 ...` (vLLM's short forms). */
export function expandVllmShortFlags(argv: string[]): string[] {
  if (argv[2] !== "sim-replica") return argv;
  const end = argv.indexOf("--");
  const stop = end < 0 ? argv.length : end;
  return [...argv.slice(0, 3), ...expandShortForms(argv.slice(3, stop)), ...argv.slice(stop)];
}

/** Adds the `sim-replica` command to the program. */
export function registerSimReplica(program: Command): Command {
  const cmd = program
    .command("sim-replica")
    .description(
      "Run a simulated vLLM replica: OpenAI API, /metrics and KV events, driven by a modelled engine.",
    )
    .argument("[model_tag]", "model name, as in `vllm serve <model>` (same as --model)")
    .option("--host <host>", "address to listen on (0.0.0.0 for all interfaces)", "127.0.0.1")
    .option("--port <port>", "port to listen on (0 = any free port)", integer, 8000)
    .option("--model <name>", "model name/path (default: the profile's model)")
    .option("--served-model-name <names...>", "names clients use; the first one is reported in metrics")
    .option(
      "--profile <name|path>",
      `hardware/model profile: a built-in name or a YAML file`,
      DEFAULT_PROFILE,
    )
    .option("--list-profiles", "print the built-in profile names and exit")
    .option("--block-size <tokens>", "tokens per KV block", integer, 16)
    .option("--max-num-seqs <n>", "most requests in one batch (default: profile)", integer)
    .option("--max-num-batched-tokens <n>", "token budget of one step (default: profile)", integer)
    .option(
      "--num-gpu-blocks-override <n>",
      "KV blocks in the pool, null block included (default: from profile)",
      integer,
    )
    .option("--max-model-len <tokens>", "context window (default: profile, capped by the KV cache)", integer)
    .option(
      "--long-prefill-token-threshold <tokens>",
      "cap on one request's prefill chunk per step (0 = off)",
      integer,
    )
    .option("--enable-prefix-caching", "enable automatic prefix caching (default)")
    .option("--no-enable-prefix-caching", "disable automatic prefix caching")
    .addOption(
      new Option(
        "--scheduling-policy <policy>",
        "fcfs, or priority (by the request's `priority`, lower first)",
      )
        .choices(["fcfs", "priority"])
        .default("fcfs"),
    )
    .option(
      "--stream-interval <tokens>",
      "new tokens per streamed chunk; the first and last go out at once (default 1)",
      integer,
    )
    .option(
      "--kv-events-config <json>",
      'vLLM KV-events config, e.g. \'{"enable_kv_cache_events":true,"publisher":"zmq"}\'',
    )
    .addOption(
      new Option("--kv-events-format <format>", "KV-event encoding: map (vLLM >= 0.26) or array (older)")
        .choices(["array", "map"])
        .default("map"),
    )
    .option(
      "--kv-transfer-config <json>",
      'P/D as vLLM\'s NixlConnector, e.g. \'{"kv_connector":"NixlConnector","kv_role":"kv_producer"}\' (kv_consumer on the decoder)',
    )
    .option(
      "--kv-offloading-size <GiB>",
      "CPU KV offload tier of this many GiB (vLLM's native OffloadingConnector); or name the OffloadingConnector in --kv-transfer-config",
      number,
    )
    .addOption(
      new Option("--kv-offloading-backend <backend>", "offload backend (only native is simulated)").choices([
        "native",
        "lmcache",
      ]),
    )
    .option(
      "--kv-offloading-bandwidth <GB/s>",
      "modelled host↔device bandwidth of the CPU tier, each direction (default 50, PCIe Gen5 x16 achievable)",
      number,
    )
    .option(
      "--nixl-side-channel-host <host>",
      "NIXL side-channel host, bound and advertised as remote_host (default: $VLLM_NIXL_SIDE_CHANNEL_HOST, else localhost)",
    )
    .option(
      "--nixl-side-channel-port <port>",
      "NIXL side-channel base port, plus the DP rank (default: $VLLM_NIXL_SIDE_CHANNEL_PORT, else 5600; 0 = any free port)",
      port,
    )
    .addOption(
      new Option("--kv-transport <kind>", "modelled KV link: rdma (8 GB/s) or tcp (TCP fallback, 0.5 GB/s)")
        .choices(["rdma", "tcp"])
        .default("rdma"),
    )
    .option("--kv-transfer-bandwidth <GB/s>", "KV-transfer bandwidth, overriding --kv-transport's", number)
    .option("--kv-transfer-overhead <ms>", "fixed cost of posting one KV transfer (default 5 ms)", number)
    .option(
      "--kv-transfer-handshake <seconds>",
      "one-time cost of a decoder's first contact with a prefiller (default 5 s)",
      number,
    )
    .option(
      "--data-parallel-rank <rank>",
      "DP rank: engine label, event batches and endpoint port offset",
      integer,
    )
    .option("--enable-lora", "serve LoRA adapters (requests pick one by `model`)")
    .option("--max-loras <n>", "distinct adapters in one batch, and GPU adapter slots (default 1)", integer)
    .option("--max-lora-rank <n>", "largest adapter rank (default 16; accepted, not modelled)", integer)
    .option(
      "--lora-modules <specs...>",
      'adapters as name=path or \'{"name":…,"path":…,"base_model_name":…}\'',
    )
    .option(
      "--lora-load-time <ms>",
      "modelled time to bring an adapter into a GPU slot (default 25 ms)",
      number,
    )
    .option("--seed <n>", "seed of the output-token generator and fault randomness", integer, 0)
    .option("--hash-seed <seed>", "PYTHONHASHSEED for block hashes (default: $PYTHONHASHSEED, else 0)")
    .option("--time-scale <n>", "simulated seconds per wall second (100 = 100x faster than real)", number, 1)
    .option(
      "--tokenizer <dir>",
      "directory with a Hugging Face tokenizer.json (default: built-in sim tokenizer)",
    )
    .option("--legacy-metric-names", "also expose vllm:gpu_cache_usage_perc and vllm:gpu_prefix_cache_*")
    .option("--max-request-body-bytes <n>", "largest accepted request body (413 beyond)", integer)
    .option(
      "--fault-crash-after <n>",
      "die hard while serving the n-th generation request (after its first output)",
      integer,
    )
    .option(
      "--fault-extra-latency <seconds>",
      "hold each generation request this long (simulated) before the engine",
      number,
    )
    .option("--fault-error-rate <p>", "fraction of generation requests answered 500", number)
    .addOption(
      new Option("--fault-metrics <mode>", "break /metrics: stall (never answers) or garbled").choices([
        "stall",
        "garbled",
      ]),
    );
  return addVllmCompatFlags(cmd).action(async (modelTag: string | undefined, flags: Flags, cmd: Command) => {
    if (flags.listProfiles) {
      for (const name of listProfiles()) console.log(name);
      return;
    }
    if (modelTag && flags.model && modelTag !== flags.model)
      cmd.error("error: model given both as argument and --model, with different values; give it once", {
        exitCode: 2,
      });
    const settings: ReplicaSettings = {
      host: flags.host,
      port: flags.port,
      model: modelTag ?? flags.model,
      servedModelName: flags.servedModelName,
      profile: flags.profile,
      blockSize: flags.blockSize,
      maxNumSeqs: flags.maxNumSeqs,
      maxNumBatchedTokens: flags.maxNumBatchedTokens,
      numGpuBlocksOverride: flags.numGpuBlocksOverride,
      maxModelLen: flags.maxModelLen,
      longPrefillTokenThreshold: flags.longPrefillTokenThreshold,
      enablePrefixCaching: flags.enablePrefixCaching,
      schedulingPolicy: flags.schedulingPolicy,
      streamInterval: flags.streamInterval,
      kvEventsConfig: flags.kvEventsConfig ?? null,
      kvEventsFormat: flags.kvEventsFormat,
      kvTransferConfig: flags.kvTransferConfig ?? null,
      ...(flags.kvOffloadingSize !== undefined && { kvOffloadingSize: flags.kvOffloadingSize }),
      ...(flags.kvOffloadingBackend !== undefined && { kvOffloadingBackend: flags.kvOffloadingBackend }),
      ...(flags.kvOffloadingBandwidth !== undefined && {
        kvOffloadingBandwidth: flags.kvOffloadingBandwidth * 1e9,
      }),
      ...(flags.nixlSideChannelHost !== undefined && { nixlSideChannelHost: flags.nixlSideChannelHost }),
      ...(flags.nixlSideChannelPort !== undefined && { nixlSideChannelPort: flags.nixlSideChannelPort }),
      kvTransport: flags.kvTransport,
      kvLink: {
        ...(flags.kvTransferBandwidth !== undefined && { bandwidth: flags.kvTransferBandwidth * 1e9 }),
        ...(flags.kvTransferOverhead !== undefined && { overhead: flags.kvTransferOverhead / 1000 }),
        ...(flags.kvTransferHandshake !== undefined && { handshake: flags.kvTransferHandshake }),
      },
      dataParallelRank: flags.dataParallelRank,
      lora: {
        enableLora: flags.enableLora === true,
        ...(flags.maxLoras !== undefined && { maxLoras: flags.maxLoras }),
        ...(flags.maxLoraRank !== undefined && { maxLoraRank: flags.maxLoraRank }),
        ...(flags.loraModules !== undefined && { loraModules: flags.loraModules }),
        ...(flags.loraLoadTime !== undefined && { loadTimeMs: flags.loraLoadTime }),
      },
      seed: flags.seed,
      hashSeed: flags.hashSeed,
      timeScale: flags.timeScale,
      tokenizer: flags.tokenizer,
      legacyMetricNames: flags.legacyMetricNames,
      maxRequestBodyBytes: flags.maxRequestBodyBytes,
      faults: {
        crashAfter: flags.faultCrashAfter ?? null,
        extraLatency: flags.faultExtraLatency ?? 0,
        errorRate: flags.faultErrorRate ?? 0,
        metrics: flags.faultMetrics ?? null,
      },
      // A crash fault is a dying replica: no cleanup, every connection drops.
      onCrash: () => process.kill(process.pid, "SIGKILL"),
    };
    // Loaded here so `--help` stays fast and does not load zeromq or the engine.
    const { ReplicaOptionError } = await import("../sim/replica-options.ts");
    const { ReplicaServer } = await import("../sim/replica-server.ts");
    let replica: ReplicaServer;
    try {
      replica = await ReplicaServer.start(settings);
    } catch (err) {
      if (err instanceof ReplicaOptionError) cmd.error(`error: ${err.message}`, { exitCode: 2 });
      console.error(`kvgate sim-replica: cannot start: ${startError(err, settings)}`);
      process.exit(1);
    }
    console.log(replica.describe());
    const note = compatNote(cmd);
    if (note) console.error(note);
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      console.error(`kvgate sim-replica: ${signal}, shutting down`);
      const force = setTimeout(() => process.exit(0), 5000);
      force.unref();
      replica.close().then(
        () => process.exit(0),
        () => process.exit(0),
      );
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
}

/** The message for a replica that could not start; a taken HTTP port names itself and --port. */
function startError(err: unknown, s: ReplicaSettings): string {
  const e = err as NodeJS.ErrnoException & { address?: string; port?: number };
  if (e.code === "EADDRINUSE" && e.syscall === "listen") {
    const at = `${e.address ?? s.host}:${e.port ?? s.port}`;
    return `${at} (--port) is already in use by another process; pick another --port, or --port 0 for any free port`;
  }
  return e.message ?? String(err);
}
