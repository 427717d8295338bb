/**
 * `kvgate pd-sidecar`: the routing sidecar of a decode pod (src/gateway/pd/sidecar.ts), with llm-d's
 * pd-sidecar flags (llm-d/llm-d-router `pkg/sidecar/proxy/options.go`) so its manifests keep working:
 * --port, --vllm-port (or --model-server-port), --kv-connector, --prefill-max-retries,
 * --prefill-retry-backoff, --enable-ssrf-protection, --inference-pool, --pool-group,
 * --enable-prefiller-sampling, --metrics-port. Flags for what kvgate does not implement (other KV
 * connectors, encoders, TLS, chunked decode, data parallelism) are accepted at their "off" values and
 * refused otherwise with a message saying so. kvgate's own: the SSRF allowlist from --endpoints or
 * --endpoints-file instead of an InferencePool, and --prefill-failure-policy / --prefill-timeout.
 * Bad flags exit 2; SIGTERM/SIGINT close and exit 0.
 */
import type { Command } from "commander";
import type { EndpointSource } from "../datalayer/endpoints.ts";
import { startKubernetesDiscovery } from "./epp-kubernetes.ts";
import { bool, nonNegative, port, positive } from "./flag-values.ts";
import { addPrefillLegOptions } from "./pd-flags.ts";

interface Flags {
  host: string;
  port: number;
  vllmHost: string;
  vllmPort: number;
  modelServerPort?: number;
  kvConnector: string;
  ecConnector?: string;
  prefillMaxRetries: number;
  prefillRetryBackoff: number;
  prefillTimeout: number;
  prefillFailurePolicy: "recompute" | "fail";
  enableSsrfProtection: boolean;
  inferencePool?: string;
  poolGroup: string;
  endpoints?: string;
  endpointsFile?: string;
  enablePrefillerSampling: boolean;
  secureServing: boolean;
  secureProxy?: boolean;
  certPath?: string;
  enableTls?: string;
  tlsInsecureSkipVerify?: string;
  decodeChunkSize: number;
  dataParallelSize: number;
  metricsPort: number;
  maxBodyBytes: number;
  seed: number;
}

/** llm-d's connectors (options.go `supportedKVConnectors`); kvgate implements only NIXL v2. */
const LLMD_CONNECTORS = ["nixlv2", "shared-storage", "sglang", "mooncake", "offloading"];

/** What is wrong with the flags, or null. */
export function checkSidecarFlags(f: Flags): string | null {
  if (f.kvConnector !== "nixlv2")
    return LLMD_CONNECTORS.includes(f.kvConnector)
      ? `--kv-connector ${f.kvConnector} is not supported by kvgate pd-sidecar; use nixlv2 (vLLM's NixlConnector)`
      : `--kv-connector ${JSON.stringify(f.kvConnector)} is unknown; use nixlv2 (llm-d also names ${LLMD_CONNECTORS.slice(1).join(", ")}, which kvgate does not support)`;
  if (f.ecConnector)
    return "--ec-connector: encoder disaggregation is not supported by kvgate pd-sidecar; remove the flag";
  if (f.secureServing || f.secureProxy)
    return "--secure-serving / --secure-proxy: TLS serving is not supported by kvgate pd-sidecar; pass --secure-serving=false (terminate TLS in front of the pod)";
  for (const [flag, v] of [
    ["--cert-path", f.certPath],
    ["--enable-tls", f.enableTls],
    ["--tls-insecure-skip-verify", f.tlsInsecureSkipVerify],
  ] as const)
    if (v !== undefined) return `${flag}: TLS is not supported by kvgate pd-sidecar; remove the flag`;
  if (f.decodeChunkSize > 0)
    return "--decode-chunk-size: chunked decode is not supported by kvgate pd-sidecar; use 0";
  if (f.dataParallelSize > 1)
    return "--data-parallel-size > 1 is not supported by kvgate pd-sidecar; run one sidecar per vLLM server";
  const sources = [f.inferencePool, f.endpoints, f.endpointsFile].filter((v) => v !== undefined);
  if (sources.length > 1) return "give at most one of --inference-pool, --endpoints and --endpoints-file";
  if (f.enableSsrfProtection && sources.length === 0)
    return "SSRF protection is on (the default) but there is no allowlist: give --inference-pool <namespace/name> (or INFERENCE_POOL), --endpoints or --endpoints-file, or --enable-ssrf-protection=false";
  return null;
}

export function registerPdSidecar(program: Command): Command {
  const envBool = (name: string, dflt: boolean) => {
    const v = process.env[name];
    return v === undefined ? dflt : ["true", "1", "yes", "on"].includes(v.trim().toLowerCase());
  };
  return addPrefillLegOptions(
    program
      .command("pd-sidecar")
      .description(
        "Routing sidecar for a decode pod (drop-in for llm-d's pd-sidecar): runs the P/D legs when the EPP names a prefiller, else proxies to the local vLLM.",
      )
      .option("--host <host>", "address to listen on", "0.0.0.0")
      .option("--port <port>", "the port the sidecar listens on", port, 8000)
      .option("--vllm-host <host>", "the local vLLM's address", "127.0.0.1")
      .option("--vllm-port <port>", "the local vLLM's port", port, 8200)
      .option("--model-server-port <port>", "the same as --vllm-port (llm-d's newer name; wins)", port)
      .option(
        "--kv-connector <name>",
        "KV transfer protocol between prefiller and decoder (nixlv2 only)",
        "nixlv2",
      )
      .option("--ec-connector <name>", "encoder connector (not supported)")
      .option(
        "--enable-ssrf-protection [bool]",
        "only prefillers in the allowlist (host and port) are used; others get 403 (llm-d's default: false)",
        bool,
        true,
      )
      .option(
        "--inference-pool <namespace/name>",
        "the InferencePool whose Ready pods × target ports are the allowlist (a bare name means namespace default)",
        process.env.INFERENCE_POOL || undefined,
      )
      .option("--pool-group <group>", "API group of the InferencePool", "inference.networking.k8s.io")
      .option("--endpoints <list>", "static allowlist: host:port,... (instead of --inference-pool)")
      .option(
        "--endpoints-file <path>",
        "static allowlist: a kvgate endpoints YAML file, re-read when it changes",
      )
      .option(
        "--enable-prefiller-sampling [bool]",
        "pick a random prefiller when the header names several (default: the first)",
        bool,
        envBool("ENABLE_PREFILLER_SAMPLING", false),
      )
      .option("--secure-serving [bool]", "TLS on the listener (not supported: pass false)", bool, false)
      .option("--secure-proxy [bool]", "deprecated name of --secure-serving", bool)
      .option("--cert-path <dir>", "TLS certificate directory (not supported)")
      .option("--enable-tls <stages>", "TLS to prefiller/decoder/encoder (not supported)")
      .option("--tls-insecure-skip-verify <stages>", "(not supported)")
      .option("--decode-chunk-size <n>", "chunked decode token budget (0 only)", nonNegative, 0)
      .option("--data-parallel-size <n>", "the model server's data-parallel size (1 only)", positive, 1)
      .option("--metrics-port <port>", "serve kvgate_pd_* on this port's /metrics (0 = off)", port, 0)
      .option("--max-body-bytes <n>", "largest request body (413 beyond)", positive, 16 * 1024 * 1024)
      .option("--seed <n>", "seed of --enable-prefiller-sampling's draws", nonNegative, 1),
  ).action(async (flags: Flags, cmd: Command) => {
    const bad = checkSidecarFlags(flags);
    if (bad) cmd.error(`error: ${bad}`, { exitCode: 2 });
    await run(flags, cmd);
  });
}

async function allowlist(
  f: Flags,
  cmd: Command,
): Promise<{ source: EndpointSource | null; what: string; close(): Promise<void> }> {
  const { EndpointSource: Source, EndpointConfigError } = await import("../datalayer/endpoints.ts");
  try {
    if (f.endpoints !== undefined) {
      const source = Source.fromList(f.endpoints);
      return { source, what: `${source.current().length} endpoint(s)`, close: async () => source.close() };
    }
    if (f.endpointsFile !== undefined) {
      const source = Source.fromFile(f.endpointsFile);
      return { source, what: `endpoints file ${f.endpointsFile}`, close: async () => source.close() };
    }
  } catch (err) {
    if (err instanceof EndpointConfigError) cmd.error(`error: ${err.message}`, { exitCode: 2 });
    throw err;
  }
  if (f.inferencePool === undefined) return { source: null, what: "none", close: async () => {} };
  const [ns, name] = f.inferencePool.includes("/")
    ? f.inferencePool.split("/", 2)
    : ["default", f.inferencePool];
  const k8s = await startKubernetesDiscovery({
    poolName: name as string,
    poolNamespace: ns as string,
    poolGroup: f.poolGroup,
    leaderElection: false,
  }).catch((err: Error) => cmd.error(`error: --inference-pool: ${err.message}`, { exitCode: 2 }));
  for (let i = 0; i < 300 && !k8s.ready(); i++) await new Promise((r) => setTimeout(r, 100));
  if (!k8s.ready())
    console.error(
      `kvgate pd-sidecar: InferencePool ${ns}/${name} not synced yet; prefill targets get 403 until it is`,
    );
  return { source: k8s.source, what: `InferencePool ${ns}/${name}`, close: () => k8s.close() };
}

async function run(f: Flags, cmd: Command): Promise<void> {
  const { startPdSidecar } = await import("../gateway/pd/sidecar.ts");
  const allow = await allowlist(f, cmd);
  const vllmPort = f.modelServerPort ?? f.vllmPort;
  let sc: Awaited<ReturnType<typeof startPdSidecar>>;
  try {
    sc = await startPdSidecar({
      host: f.host,
      port: f.port,
      vllmHost: f.vllmHost,
      vllmPort,
      legs: {
        failurePolicy: f.prefillFailurePolicy,
        prefillMaxRetries: f.prefillMaxRetries,
        prefillRetryBackoffMs: f.prefillRetryBackoff,
        prefillTimeoutMs: f.prefillTimeout,
      },
      ssrfProtection: f.enableSsrfProtection,
      allowlist: allow.source,
      prefillerSampling: f.enablePrefillerSampling,
      seed: f.seed,
      metricsPort: f.metricsPort === 0 ? undefined : f.metricsPort,
      maxBodyBytes: f.maxBodyBytes,
    });
  } catch (err) {
    await allow.close();
    const e = err as Error;
    if (/^--|^give |^SSRF/.test(e.message)) cmd.error(`error: ${e.message}`, { exitCode: 2 });
    console.error(`kvgate pd-sidecar: cannot start: ${e.message}`);
    process.exit(1);
  }
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(`kvgate pd-sidecar: ${signal}, closing`);
    const done = () => process.exit(0);
    sc.close()
      .then(() => allow.close())
      .then(done, done);
  };
  process.once("SIGTERM", () => stop("SIGTERM"));
  process.once("SIGINT", () => stop("SIGINT"));
  const ssrf = f.enableSsrfProtection ? `SSRF protection on (${allow.what})` : "SSRF protection OFF";
  console.log(
    `kvgate pd-sidecar: listening on ${sc.url}, vLLM at ${f.vllmHost}:${vllmPort}, kv-connector nixlv2, ${ssrf}, prefill failure policy ${f.prefillFailurePolicy}${sc.metricsUrl ? `, metrics ${sc.metricsUrl}/metrics` : ""}`,
  );
}
