/**
 * `kvgate serve`: runs the gateway in front of a fleet of vLLM replicas. Endpoints come from
 * --endpoints or a watched --endpoints-file; scheduling from an llm-d EndpointPickerConfig
 * (--config, default: the built-in config). Prints one startup line (in precise mode it also names
 * the KV-events producers and the tokenizer, saying when the sim one is a default; a wildcard --host is
 * shown as bound, with the URL to use from this machine); SIGTERM/SIGINT
 * drain in-flight requests (up to --drain-timeout-ms) and exit 0. Bad flags, endpoints or config
 * exit 2.
 */

import type { Command } from "commander";
import type { BoundAddress, GatewayOptions } from "../gateway/gateway.ts";
import { AUTOSCALE_FLAG, startAutoscale } from "./autoscale-flag.ts";
import { integer, oneOf, port, positive } from "./flag-values.ts";
import { addPrefillLegOptions } from "./pd-flags.ts";
import { addSyncOptions, type SyncFlags } from "./sync-flags.ts";

interface Flags extends SyncFlags {
  host: string;
  port: number;
  adminHost: string;
  adminPort: number;
  endpoints?: string;
  endpointsFile?: string;
  pools?: string;
  config?: string;
  modelObjectives?: string;
  scrapeIntervalMs: number;
  scrapeTimeoutMs: number;
  maxBodyBytes: number;
  maxConcurrentRequests: number;
  maxConnections: number;
  maxAttempts: number;
  drainTimeoutMs: number;
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  upstreamTimeoutMs: number;
  failureThreshold: number;
  tokenizer?: string;
  tokenizerCacheBytes: number;
  tokenizeTimeoutMs: number;
  poolName: string;
  autoscaleConfig?: string;
  servedEndpointHeader: boolean;
  pdLegs: "gateway" | "sidecar";
  prefillFailurePolicy: "recompute" | "fail";
  prefillMaxRetries: number;
  prefillRetryBackoff: number;
  prefillTimeout: number;
  migrateStreams: boolean;
  migrationLimit: number;
}

/**
 * A bound address as the startup line shows it: the address itself, and for a wildcard bind the URL to
 * use from this machine (other machines use one of its addresses).
 */
export function where(b: BoundAddress): string {
  const at = `http://${b.host.includes(":") ? `[${b.host}]` : b.host}:${b.port}`;
  return b.allInterfaces ? `${at} (all interfaces; from this machine ${b.url})` : at;
}

/** Adds the `serve` command to the program. */
export function registerServe(program: Command): Command {
  return addPrefillLegOptions(
    addSyncOptions(
      program
        .command("serve")
        .description(
          "Run the gateway: route each OpenAI request to the replica holding its prefix, unless saturated.",
        )
        .option("--host <host>", "public address to listen on", "0.0.0.0")
        .option("--port <port>", "public port (OpenAI API; 0 = any free port)", port, 8080)
        .option("--admin-host <host>", "admin API address (keep it private)", "127.0.0.1")
        .option("--admin-port <port>", "admin API port: /endpoints, /explain, /reload, /metrics", port, 9090)
        .option("--endpoints <list>", "replicas as host:port,host:port,...")
        .option(
          "--endpoints-file <path>",
          "YAML list of {address, labels?, kvEvents?, kvEventsReplay?}; re-read when it changes",
        )
        .option(
          "--pools <path>",
          "several pools behind this front door: YAML {pools: [{name, endpoints|endpointsFile|inferencePool, config?, models?}], rewrites?, trustedHeader?} (instead of --endpoints/--endpoints-file/--config)",
        )
        .option("--config <path>", "llm-d EndpointPickerConfig YAML (default: built-in)")
        .option("--model-objectives <path>", "YAML map model → priority or InferenceObjective name")
        .option("--scrape-interval-ms <n>", "metrics poll period per replica", positive, 100)
        .option("--scrape-timeout-ms <n>", "metrics poll timeout", positive, 1000)
        .option("--max-body-bytes <n>", "largest request body (413 beyond)", positive, 16 * 1024 * 1024)
        .option("--max-concurrent-requests <n>", "requests handled at once (503 beyond)", positive, 4096)
        .option(
          "--max-connections <n>",
          "open client connections (requests on more get 503)",
          positive,
          16384,
        )
        .option("--max-attempts <n>", "replicas tried per request before 503 (failover)", positive, 3)
        .option(
          "--drain-timeout-ms <n>",
          "on SIGTERM, how long in-flight requests may finish",
          integer,
          30_000,
        )
        .option(
          "--headers-timeout-ms <n>",
          "a client must send its request headers within this",
          positive,
          30_000,
        )
        .option(
          "--request-timeout-ms <n>",
          "a client must send its whole request within this",
          positive,
          120_000,
        )
        .option(
          "--upstream-timeout-ms <n>",
          "a replica must send headers, and then each chunk, within this",
          positive,
          300_000,
        )
        .option(
          "--failure-threshold <n>",
          "failed metric scrapes in a row that make a replica unhealthy",
          positive,
          3,
        )
        .option(
          "--tokenizer <dir|sim|endpoint>",
          "tokenize prompts for the prefix index: a tokenizer.json directory, sim, or endpoint (alias " +
            "remote: ask a candidate replica's vLLM POST /tokenize, 250 ms timeout, no ids on failure); " +
            "local ones cache token ids per prompt segment split at special tokens (precise mode: the " +
            "served model's tokenizer, so ids match vLLM's; default sim)",
        )
        .option(
          "--tokenizer-cache-bytes <n>",
          "byte budget of the local tokenizer's per-segment id cache (LRU; 0 disables)",
          (v: string) => (v === "0" ? 0 : positive(v)),
          64 * 1024 * 1024,
        )
        .option(
          "--tokenize-timeout-ms <n>",
          "timeout of a --tokenizer endpoint /tokenize call",
          positive,
          250,
        )
        .option("--pool-name <name>", "InferencePool name in pool metrics", "kvgate")
        .option(
          "--migrate-streams",
          "when a replica dies mid-stream, resume the response on another replica (prompt + generated " +
            "token ids) in the same SSE stream; per request: x-kvgate-migrate: on|off",
          false,
        )
        .option("--migration-limit <n>", "migrations per stream at most (--migrate-streams)", positive, 3)
        .option(...AUTOSCALE_FLAG)
        .option(
          "--no-served-endpoint-header",
          "do not add x-gateway-destination-endpoint-served (the replica that answered) to responses",
        )
        .option(
          "--pd-legs <gateway|sidecar>",
          "P/D (a disagg-profile-handler config): gateway = kvgate sends the prefill leg, then the decode " +
            "leg; sidecar = kvgate only sets x-prefiller-host-port for the decode pod's routing sidecar",
          oneOf("gateway", "sidecar"),
          "gateway",
        ),
    ),
  ).action(async (flags: Flags, cmd: Command) => {
    if (flags.pools !== undefined) return serveMultiPool(flags, cmd);
    if ((flags.endpoints === undefined) === (flags.endpointsFile === undefined))
      cmd.error("error: give exactly one of --endpoints or --endpoints-file", { exitCode: 2 });
    const { startGateway } = await import("../gateway/gateway.ts");
    const { EndpointConfigError } = await import("../datalayer/endpoints.ts");
    const { ConfigError } = await import("../scheduler/errors.ts");
    let gw: Awaited<ReturnType<typeof startGateway>>;
    try {
      gw = await startGateway({
        ...gatewayOptions(flags),
        endpoints: flags.endpoints,
        endpointsFile: flags.endpointsFile,
        configFile: flags.config,
        poolName: flags.poolName,
        nats: flags.nats,
        natsSubject: flags.natsSubject,
      });
    } catch (err) {
      const e = err as Error & { code?: string };
      if (err instanceof EndpointConfigError || err instanceof ConfigError || /^--|^give /.test(e.message))
        cmd.error(`error: ${e.message}`, { exitCode: 2 });
      console.error(`kvgate serve: cannot start: ${e.message}`);
      process.exit(1);
    }
    // Handlers first: a supervisor (or test) may signal as soon as it reads the startup line, and a
    // signal without a handler would kill the process instead of draining it.
    drainOnSignals(() => gw.close(), flags.drainTimeoutMs);
    try {
      startAutoscale(gw.gateway, flags.autoscaleConfig);
    } catch (err) {
      cmd.error(`error: ${(err as Error).message}`, { exitCode: 2 });
    }
    const n = gw.gateway.data.store.size;
    const g = gw.gateway;
    const precise = g.routing.precise.map((p) => p.typedName.name);
    const mode =
      precise.length === 0
        ? ""
        : `, precise mode (KV events for ${precise.join(", ")}), tokenizer ${
            g.tokenizerDefaulted
              ? "sim (default: no --tokenizer given; for real vLLM pass --tokenizer <dir of the model's tokenizer.json>)"
              : g.tokenizerName
          }`;
    const handler = g.routing.scheduler.plugins.get(g.routing.scheduler.config.profileHandler);
    const pd =
      handler?.typedName.type !== "disagg-profile-handler"
        ? ""
        : flags.pdLegs === "sidecar"
          ? ", P/D: the prefiller goes to the decode pods' sidecars in x-prefiller-host-port"
          : `, P/D: kvgate runs the prefill and decode legs (a failed prefill: ${flags.prefillFailurePolicy === "fail" ? "returned to the client" : "prefilled on the decoder, x-kvgate-pd: fallback-<reason>"})`;
    console.log(
      `kvgate serve: listening on ${where(gw.bound)}, admin ${where(gw.adminBound)}, ${n} endpoint(s), config ${flags.config ?? "built-in"}${mode}${pd}`,
    );
  });
}

/** SIGTERM/SIGINT drain through `close` and exit; a drain longer than the timeout (+5 s) is cut. */
function drainOnSignals(close: () => Promise<void>, drainTimeoutMs: number): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(`kvgate serve: ${signal}, draining`);
    setTimeout(() => process.exit(0), drainTimeoutMs + 5000).unref();
    close().then(
      () => process.exit(0),
      () => process.exit(0),
    );
  };
  process.once("SIGTERM", () => stop("SIGTERM"));
  process.once("SIGINT", () => stop("SIGINT"));
}

/** The options every gateway takes from serve's flags, with or without --pools. */
function gatewayOptions(flags: Flags) {
  return {
    host: flags.host,
    port: flags.port,
    adminHost: flags.adminHost,
    adminPort: flags.adminPort,
    modelObjectivesFile: flags.modelObjectives,
    scrapeIntervalMs: flags.scrapeIntervalMs,
    scrapeTimeoutMs: flags.scrapeTimeoutMs,
    maxBodyBytes: flags.maxBodyBytes,
    maxConcurrentRequests: flags.maxConcurrentRequests,
    maxConnections: flags.maxConnections,
    maxAttempts: flags.maxAttempts,
    drainTimeoutMs: flags.drainTimeoutMs,
    headersTimeoutMs: flags.headersTimeoutMs,
    requestTimeoutMs: flags.requestTimeoutMs,
    upstreamHeadersTimeoutMs: flags.upstreamTimeoutMs,
    upstreamBodyTimeoutMs: flags.upstreamTimeoutMs,
    failureThreshold: flags.failureThreshold,
    tokenizer: flags.tokenizer,
    tokenizerCacheBytes: flags.tokenizerCacheBytes,
    tokenizeTimeoutMs: flags.tokenizeTimeoutMs,
    servedEndpointHeader: flags.servedEndpointHeader,
    pdLegs: flags.pdLegs,
    prefillFailurePolicy: flags.prefillFailurePolicy,
    prefillMaxRetries: flags.prefillMaxRetries,
    prefillRetryBackoffMs: flags.prefillRetryBackoff,
    prefillTimeoutMs: flags.prefillTimeout,
    migrateStreams: flags.migrateStreams,
    migrationLimit: flags.migrationLimit,
  } satisfies Partial<GatewayOptions>;
}

/** `kvgate serve --pools`: the multi-pool front door (gateway/multi-pool/front.ts). */
async function serveMultiPool(flags: Flags, cmd: Command): Promise<void> {
  if (flags.endpoints !== undefined || flags.endpointsFile !== undefined || flags.config !== undefined)
    cmd.error(
      "error: --pools names each pool's endpoints and config; drop --endpoints, --endpoints-file and --config",
      { exitCode: 2 },
    );
  // Refused rather than ignored: the autoscaler sizes one pool.
  if (flags.autoscaleConfig !== undefined)
    cmd.error(
      "error: --autoscale-config is not supported with --pools (the autoscaler sizes one pool); run one `kvgate serve --autoscale-config` per pool, or drop it",
      { exitCode: 2 },
    );
  const { startMultiPool } = await import("../gateway/multi-pool/front.ts");
  const { PoolsFileError } = await import("../gateway/multi-pool/pools-file.ts");
  const { EndpointConfigError } = await import("../datalayer/endpoints.ts");
  const { ConfigError } = await import("../scheduler/errors.ts");
  let h: Awaited<ReturnType<typeof startMultiPool>>;
  try {
    h = await startMultiPool({
      poolsFile: flags.pools,
      ...gatewayOptions(flags),
      // Each pool syncs on its own subject: a --nats-subject gets the pool's name appended.
      nats: flags.nats,
      natsSubject: flags.natsSubject,
    });
  } catch (err) {
    const e = err as Error;
    if (
      err instanceof PoolsFileError ||
      err instanceof EndpointConfigError ||
      err instanceof ConfigError ||
      /^pool .*: (--|give )/.test(e.message)
    )
      cmd.error(`error: ${e.message}`, { exitCode: 2 });
    console.error(`kvgate serve: cannot start: ${e.message}`);
    process.exit(1);
  }
  drainOnSignals(() => h.close(), flags.drainTimeoutMs);
  const pools = [...h.front.pools].map(([name, gw]) => `${name} (${gw.data.store.size} endpoint(s))`);
  const t = h.front.trusted;
  console.log(
    `kvgate serve: listening on ${where(h.bound)}, admin ${where(h.adminBound)}, pools ${pools.join(", ")}${
      t
        ? `, trusting header ${t.name} (selects the ${t.selects}) from ${t.sourcesText?.join(", ") ?? "any source"}`
        : ""
    }`,
  );
}
