/**
 * `kvgate epp`: the scheduler, data layer and admission of `kvgate serve` as an Envoy ext_proc
 * endpoint picker, with llm-d's EPP flag names (llm-d/llm-d-router@ebab6879 `pkg/epp/server/options.go`)
 * where llm-d has them, plus kvgate's --endpoints/--endpoints-file for use without Kubernetes. With
 * --pool-name and no endpoint flag, endpoints, objectives and rewrites come from Kubernetes discovery
 * (epp-kubernetes.ts), and with --ha-enable-leader-election only the Lease holder reports SERVING.
 * With --pools FILE (the pools file of `kvgate serve --pools`) one server fronts several pools, each
 * request decided by the pool serving its model (gateway/multi-pool/epp-pools.ts).
 * Prints one startup line; SIGTERM/SIGINT turn health NOT_SERVING at once, let open streams finish
 * for --drain-timeout, then exit 0. Bad flags exit 2 with what to do.
 */

import { type Command, Option } from "commander";
import { AUTOSCALE_FLAG, startAutoscale } from "./autoscale-flag.ts";
import { startKubernetesDiscovery } from "./epp-kubernetes.ts";
import { bool, durationMs, integer, port, positive } from "./flag-values.ts";
import { addSyncOptions, type SyncFlags } from "./sync-flags.ts";

export { durationMs } from "./flag-values.ts";

/** Metric names kvgate's scraper reads (vLLM and SGLang), per llm-d metric flag. */
const METRIC_FLAGS: Record<string, { known: string[]; what: string }> = {
  kvCacheUsagePercentageMetric: {
    known: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"],
    what: "--kv-cache-usage-percentage-metric",
  },
  totalQueuedRequestsMetric: {
    known: ["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
    what: "--total-queued-requests-metric",
  },
  totalRunningRequestsMetric: {
    known: ["vllm:num_requests_running", "sglang:num_running_reqs"],
    what: "--total-running-requests-metric",
  },
  cacheInfoMetric: {
    known: ["vllm:cache_config_info", "sglang:cache_config_info"],
    what: "--cache-info-metric",
  },
  loraInfoMetric: { known: ["vllm:lora_requests_info"], what: "--lora-info-metric" },
};

interface Flags extends SyncFlags {
  host: string;
  grpcPort: number;
  grpcHealthPort: number;
  metricsPort: number;
  adminPort?: number;
  poolName?: string;
  autoscaleConfig?: string;
  poolNamespace: string;
  poolGroup: string;
  configFile?: string;
  configText?: string;
  endpoints?: string;
  endpointsFile?: string;
  pools?: string;
  secureServing: boolean;
  certPath?: string;
  enableCertReload?: boolean;
  drainTimeout: number;
  grpcMaxRecvMsgSize?: number;
  grpcMaxSendMsgSize?: number;
  haEnableLeaderElection: boolean;
  scrapeIntervalMs: number;
  maxBodyBytes: number;
  modelObjectives?: string;
  tokenizer?: string;
  seed: number;
  [metric: string]: unknown;
}

/** Checks the flags that do not need a running server; returns an error message or null. */
export function checkEppFlags(f: Flags): string | null {
  if (f.pools !== undefined) {
    const per = {
      "--endpoints": f.endpoints,
      "--endpoints-file": f.endpointsFile,
      "--pool-name": f.poolName,
      "--config-file": f.configFile,
      "--config-text": f.configText,
      "--autoscale-config": f.autoscaleConfig,
    };
    const clash = Object.entries(per)
      .filter(([, v]) => v !== undefined)
      .map(([k]) => k);
    if (clash.length)
      return `--pools names each pool's endpoints and EndpointPickerConfig; drop ${clash.join(", ")}${f.autoscaleConfig !== undefined ? " (autoscaling signals are per pool and not wired for --pools yet)" : ""}`;
    if (f.haEnableLeaderElection)
      return "--ha-enable-leader-election holds one InferencePool's Lease; it is not supported with --pools (run one kvgate epp per pool for active-passive HA)";
  }
  const given = [f.endpoints, f.endpointsFile].filter((x) => x !== undefined).length;
  if (given > 1) return "give at most one of --endpoints and --endpoints-file";
  if (given === 0 && f.poolName === undefined && f.pools === undefined)
    return "say where the endpoints are: --pool-name NAME (Kubernetes InferencePool discovery), --endpoints host:port,... / --endpoints-file FILE, or --pools FILE (several pools)";
  if (f.configFile !== undefined && f.configText !== undefined)
    return "give at most one of --config-file and --config-text";
  if (f.certPath !== undefined && !f.secureServing)
    return "--cert-path is the TLS certificate of --secure-serving; drop it, or drop --secure-serving=false";
  if (f.haEnableLeaderElection && given > 0)
    return "--ha-enable-leader-election elects a leader through a Kubernetes Lease: use it with --pool-name (Kubernetes discovery), not with --endpoints/--endpoints-file";
  for (const [key, { known, what }] of Object.entries(METRIC_FLAGS)) {
    const v = f[key];
    if (typeof v !== "string") continue;
    const name = v.replace(/\{.*$/, "").trim();
    if (!known.includes(name))
      return `${what} ${v}: kvgate's scraper reads ${known.join(" or ")} (vLLM and SGLang names); another name is not supported, so remove the flag or serve one of these`;
  }
  return null;
}

export function registerEpp(program: Command): Command {
  const cmd = program
    .command("epp")
    .description("Run as an Envoy ext_proc endpoint picker (llm-d's EPP protocol, flags and metrics).")
    .option("--host <host>", "address of the gRPC, health and metrics servers", "0.0.0.0")
    .option("--grpc-port <port>", "ext_proc gRPC port", port, 9002)
    .option(
      "--grpc-health-port <port>",
      "gRPC health port (liveness, readiness, ext_proc service)",
      port,
      9003,
    )
    .option("--metrics-port <port>", "Prometheus /metrics and the read-only admin API", port, 9090)
    .option("--admin-port <port>", "full admin API (POST /explain, /reload) on 127.0.0.1; default off", port)
    .option("--pool-name <name>", "InferencePool to serve (Kubernetes discovery)")
    .option("--pool-namespace <ns>", "namespace of the InferencePool", process.env.NAMESPACE ?? "default")
    .option(...AUTOSCALE_FLAG)
    .option("--pool-group <group>", "API group of the InferencePool", "inference.networking.k8s.io")
    .option("--config-file <path>", "llm-d EndpointPickerConfig YAML (default: built-in)")
    .option("--config-text <yaml>", "the EndpointPickerConfig itself")
    .option("--endpoints <list>", "replicas as host:port,... (instead of Kubernetes discovery)")
    .option("--endpoints-file <path>", "YAML list of {address, labels?, kvEvents?}; re-read when it changes")
    .option(
      "--pools <path>",
      "several pools behind this one server: the pools file of kvgate serve --pools (instead of --endpoints/--endpoints-file/--pool-name/--config-file)",
    )
    .option("--secure-serving [bool]", "TLS on the ext_proc port", bool, true)
    .option("--cert-path <dir>", "directory with tls.crt and tls.key (default: a self-signed certificate)")
    .addOption(
      new Option(
        "--enable-cert-reload [bool]",
        "accepted for llm-d compatibility; restart to load a new certificate",
      ).argParser(bool),
    )
    .option(
      "--drain-timeout <duration>",
      "on SIGTERM, how long open streams may finish (e.g. 30s)",
      durationMs,
      30_000,
    )
    .option("--grpc-max-recv-msg-size <bytes>", "largest ext_proc message accepted", positive)
    .option("--grpc-max-send-msg-size <bytes>", "largest ext_proc message sent", positive)
    .option("--ha-enable-leader-election [bool]", "active-passive HA through a Kubernetes Lease", bool, false)
    .option("--scrape-interval-ms <n>", "metrics poll period per replica", positive, 100)
    .option("--max-body-bytes <n>", "largest request body (413 beyond)", positive, 16 * 1024 * 1024)
    .option("--model-objectives <path>", "YAML map model → priority or InferenceObjective name")
    .option("--tokenizer <dir|sim|endpoint>", "tokenize prompts for the prefix index (as kvgate serve)")
    .option("--seed <n>", "seed of the picker's tie-breaks and rewrite draws", integer, 1);
  addSyncOptions(cmd);
  for (const { known, what } of Object.values(METRIC_FLAGS))
    cmd.option(`${what} <name>`, `scraped metric name (kvgate reads ${known.join(", ")})`);
  return cmd.action(async (flags: Flags, c: Command) => {
    const bad = checkEppFlags(flags);
    if (bad) c.error(`error: ${bad}`, { exitCode: 2 });
    if (flags.enableCertReload)
      console.error(
        "kvgate epp: note: --enable-cert-reload is accepted but certificates load at start; restart to pick up a new one",
      );
    await run(flags, c);
  });
}

/** The options of the ext_proc server and of every pool's gateway that come from flags. */
function serverOptions(flags: Flags) {
  return {
    grpcHost: flags.host,
    grpcPort: flags.grpcPort,
    grpcHealthPort: flags.grpcHealthPort,
    metricsPort: flags.metricsPort,
    adminPort: flags.adminPort,
    secureServing: flags.secureServing,
    certPath: flags.certPath,
    drainTimeoutMs: flags.drainTimeout,
    grpcMaxRecvMsgSize: flags.grpcMaxRecvMsgSize,
    grpcMaxSendMsgSize: flags.grpcMaxSendMsgSize,
    scrapeIntervalMs: flags.scrapeIntervalMs,
    maxBodyBytes: flags.maxBodyBytes,
    modelObjectivesFile: flags.modelObjectives,
    tokenizer: flags.tokenizer,
    seed: flags.seed,
    nats: flags.nats,
    natsSubject: flags.natsSubject,
  };
}

/** SIGTERM/SIGINT: health NOT_SERVING, open streams drain (up to --drain-timeout), exit 0. */
function stopOnSignals(close: () => Promise<unknown>, drainTimeout: number): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(
      `kvgate epp: ${signal}: health NOT_SERVING, draining open streams (up to ${drainTimeout} ms)`,
    );
    const force = setTimeout(() => process.exit(0), drainTimeout + 5000);
    force.unref();
    const done = () => process.exit(0);
    close().then(done, done);
  };
  process.once("SIGTERM", () => stop("SIGTERM"));
  process.once("SIGINT", () => stop("SIGINT"));
}

/** Exit 2 for a bad file, flag or config (the message says what to change), 1 for anything else. */
async function failStart(err: unknown, c: Command): Promise<never> {
  const { EndpointConfigError } = await import("../datalayer/endpoints.ts");
  const { ConfigError } = await import("../scheduler/errors.ts");
  const { PoolsFileError } = await import("../gateway/multi-pool/pools-file.ts");
  const e = err as Error;
  if (
    err instanceof EndpointConfigError ||
    err instanceof ConfigError ||
    err instanceof PoolsFileError ||
    /^(pool [^:]*: )?(--|give )/.test(e.message)
  )
    c.error(`error: ${e.message}`, { exitCode: 2 });
  console.error(`kvgate epp: cannot start: ${e.message}`);
  process.exit(1);
}

async function runPools(flags: Flags, c: Command): Promise<void> {
  const { startMultiPoolEpp } = await import("../gateway/multi-pool/epp-pools.ts");
  const epp = await startMultiPoolEpp({ ...serverOptions(flags), poolsFile: flags.pools }).catch((err) =>
    failStart(err, c),
  );
  stopOnSignals(() => epp.close(), flags.drainTimeout);
  const tls = epp.grpc.secure
    ? `TLS ${epp.tlsOrigin === "self-signed" ? "self-signed" : `from ${epp.tlsOrigin}`}`
    : "plaintext";
  const pools = [...epp.live.current.pools].map(
    ([name, gw]) => `${name} (${gw.data.store.size} endpoint(s))`,
  );
  console.log(
    `kvgate epp: ext_proc on ${flags.host}:${epp.grpc.port} (${tls}), health on ${flags.host}:${epp.healthPort}, metrics ${epp.metrics.url}/metrics, pools ${pools.join(", ")}`,
  );
}

async function run(flags: Flags, c: Command): Promise<void> {
  if (flags.pools !== undefined) return runPools(flags, c);
  const { startEpp } = await import("../gateway/ext-proc/epp.ts");
  const k8s =
    flags.endpoints === undefined && flags.endpointsFile === undefined
      ? await startKubernetesDiscovery({
          poolName: flags.poolName as string,
          poolNamespace: flags.poolNamespace,
          poolGroup: flags.poolGroup,
          leaderElection: flags.haEnableLeaderElection,
        }).catch((err: Error) => c.error(`error: ${err.message}`, { exitCode: 2 }))
      : null;
  let epp: Awaited<ReturnType<typeof startEpp>>;
  try {
    epp = await startEpp({
      ...serverOptions(flags),
      endpoints: flags.endpoints,
      endpointsFile: flags.endpointsFile,
      source: k8s?.source,
      resources: k8s?.resources,
      isLeader: k8s?.isLeader,
      ready: k8s?.ready,
      configFile: flags.configFile,
      config: flags.configText,
      poolName: flags.poolName ?? "kvgate",
    });
  } catch (err) {
    await k8s?.close();
    return failStart(err, c);
  }
  stopOnSignals(() => epp.close().then(() => k8s?.close()), flags.drainTimeout);
  try {
    startAutoscale(epp.gateway, flags.autoscaleConfig);
  } catch (err) {
    await epp.close();
    c.error(`error: ${(err as Error).message}`, { exitCode: 2 });
  }
  const tls = epp.grpc.secure
    ? `TLS ${epp.tlsOrigin === "self-signed" ? "self-signed" : `from ${epp.tlsOrigin}`}`
    : "plaintext";
  const where = k8s
    ? `InferencePool ${flags.poolNamespace}/${flags.poolName}`
    : `${epp.gateway.data.store.size} endpoint(s)`;
  console.log(
    `kvgate epp: ext_proc on ${flags.host}:${epp.grpc.port} (${tls}), health on ${flags.host}:${epp.healthPort}, metrics ${epp.metrics.url}/metrics, ${where}, config ${flags.configFile ?? (flags.configText ? "from --config-text" : "built-in")}`,
  );
}
