/**
 * `kvgate epp`: the scheduler, data layer and admission of `kvgate serve` as an Envoy ext_proc
 * endpoint picker, with llm-d's EPP flag names (llm-d/llm-d-router@ebab6879 `pkg/epp/server/options.go`)
 * where llm-d has them, plus kvgate's --endpoints/--endpoints-file for use without Kubernetes. With
 * --pool-name and no endpoint flag, endpoints, objectives and rewrites come from Kubernetes discovery
 * (epp-kubernetes.ts), and with --ha-enable-leader-election only the Lease holder reports SERVING.
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
  const given = [f.endpoints, f.endpointsFile].filter((x) => x !== undefined).length;
  if (given > 1) return "give at most one of --endpoints and --endpoints-file";
  if (given === 0 && f.poolName === undefined)
    return "say where the endpoints are: --pool-name NAME (Kubernetes InferencePool discovery), or --endpoints host:port,... / --endpoints-file FILE";
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

async function run(flags: Flags, c: Command): Promise<void> {
  const { startEpp } = await import("../gateway/ext-proc/epp.ts");
  const { EndpointConfigError } = await import("../datalayer/endpoints.ts");
  const { ConfigError } = await import("../scheduler/errors.ts");
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
      grpcHost: flags.host,
      grpcPort: flags.grpcPort,
      grpcHealthPort: flags.grpcHealthPort,
      metricsPort: flags.metricsPort,
      adminPort: flags.adminPort,
      endpoints: flags.endpoints,
      endpointsFile: flags.endpointsFile,
      source: k8s?.source,
      resources: k8s?.resources,
      isLeader: k8s?.isLeader,
      ready: k8s?.ready,
      configFile: flags.configFile,
      config: flags.configText,
      secureServing: flags.secureServing,
      certPath: flags.certPath,
      drainTimeoutMs: flags.drainTimeout,
      grpcMaxRecvMsgSize: flags.grpcMaxRecvMsgSize,
      grpcMaxSendMsgSize: flags.grpcMaxSendMsgSize,
      scrapeIntervalMs: flags.scrapeIntervalMs,
      maxBodyBytes: flags.maxBodyBytes,
      modelObjectivesFile: flags.modelObjectives,
      tokenizer: flags.tokenizer,
      poolName: flags.poolName ?? "kvgate",
      seed: flags.seed,
      nats: flags.nats,
      natsSubject: flags.natsSubject,
    });
  } catch (err) {
    await k8s?.close();
    const e = err as Error;
    if (err instanceof EndpointConfigError || err instanceof ConfigError || /^--|^give /.test(e.message))
      c.error(`error: ${e.message}`, { exitCode: 2 });
    console.error(`kvgate epp: cannot start: ${e.message}`);
    process.exit(1);
  }
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(
      `kvgate epp: ${signal}: health NOT_SERVING, draining open streams (up to ${flags.drainTimeout} ms)`,
    );
    const force = setTimeout(() => process.exit(0), flags.drainTimeout + 5000);
    force.unref();
    const done = () => process.exit(0);
    epp
      .close()
      .then(() => k8s?.close())
      .then(done, done);
  };
  process.once("SIGTERM", () => stop("SIGTERM"));
  process.once("SIGINT", () => stop("SIGINT"));
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
