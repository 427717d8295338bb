/**
 * Composition root of `kvgate serve`: the data layer (endpoints, scraping, health), the routing
 * brain (scheduler + admission from EndpointPickerConfig), one keep-alive undici Pool per replica,
 * the public OpenAI front door and the admin API on its own port. `startGateway()` is the
 * in-process entry point used by the CLI, tests and the demo.
 *
 * Precise mode: when the config has precise-prefix-cache-producer plugins, the gateway subscribes to
 * every endpoint's vLLM KV events for each of them (kv-events.ts), following the endpoint set, the
 * config reloads and shutdown, and it tokenizes prompts (the sim tokenizer unless --tokenizer is given).
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { Pool } from "undici";
import { DataLayer } from "../datalayer/datalayer.ts";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import { EndpointSource, type EndpointSpec } from "../datalayer/endpoints.ts";
import type { Tokenizer } from "../engine/tokenizer.ts";
import { handleAdmin } from "./admin.ts";
import type { AutoscaleService } from "./autoscale.ts";
import { ConnectionLimit } from "./connection-limit.ts";
import { dashboardSamplerOf, stopDashboard } from "./dashboard/sampler.ts";
import { TrafficCounts } from "./endpoint-traffic.ts";
import { acceptH2c, type H2cFront } from "./h2c.ts";
import { KvEventsWiring } from "./kv-events.ts";
import { type BoundAddress, listen } from "./listen.ts";
import { GatewayMetrics } from "./metrics.ts";
import { loadModelObjectives, type ModelObjectives } from "./model-objectives.ts";
import { buildRouting, type Routing } from "./routing.ts";
import { handlePublic } from "./server.ts";
import { NatsSync } from "./sync/nats-sync.ts";
import { isEndpointTokenizerSpec, loadGatewayTokenizer } from "./tokenize.ts";
import { EndpointTokenizer } from "./tokenize-endpoint.ts";

export interface GatewayOptions {
  /** Public port (0 = ephemeral). Default 0. */
  port?: number;
  /** Default 127.0.0.1; the CLI passes 0.0.0.0. */
  host?: string;
  adminPort?: number;
  /** Default 127.0.0.1. */
  adminHost?: string;
  /** `host:port,...` or parsed specs; exclusive with endpointsFile. */
  endpoints?: string | EndpointSpec[];
  endpointsFile?: string;
  /** EndpointPickerConfig YAML text; exclusive with configFile. Default: the built-in config. */
  config?: string;
  configFile?: string;
  /** YAML map model → priority or InferenceObjective name, for requests without an objective header. */
  modelObjectivesFile?: string;
  scrapeIntervalMs?: number;
  scrapeTimeoutMs?: number;
  modelsIntervalMs?: number;
  failureThreshold?: number;
  probationBaseMs?: number;
  /** Default 16 MiB. */
  maxBodyBytes?: number;
  /** Requests being handled at once; beyond this, 503. Default 4096. */
  maxConcurrentRequests?: number;
  /** Open client connections on the public port; requests on more get 503 (connection-limit.ts). Default 16384. */
  maxConnections?: number;
  /** Endpoints tried per request (failover). Default 3. */
  maxAttempts?: number;
  /** Client must send its headers within this. Default 30 s. */
  headersTimeoutMs?: number;
  /** Client must send its whole request within this. Default 120 s. */
  requestTimeoutMs?: number;
  /** Replica must answer headers within this. Default 300 s. */
  upstreamHeadersTimeoutMs?: number;
  /** Longest silence between response chunks. Default 300 s. */
  upstreamBodyTimeoutMs?: number;
  /** On close(): how long in-flight requests may finish. Default 30 s. */
  drainTimeoutMs?: number;
  /** InferencePool name in pool metrics. Default "kvgate". */
  poolName?: string;
  /**
   * "sim", a Hugging Face tokenizer directory, "endpoint"/"remote" (a replica's vLLM /tokenize), or a
   * Tokenizer: real token ids for the prefix index.
   */
  tokenizer?: string | Tokenizer;
  /** Byte budget of the local tokenizer's prefix cache (tokenize-cache.ts). Default 64 MiB; 0 disables. */
  tokenizerCacheBytes?: number;
  /** Timeout of a --tokenizer endpoint /tokenize call. Default 250 ms. */
  tokenizeTimeoutMs?: number;
  /**
   * Set x-gateway-destination-endpoint-served (the endpoint that answered, after any failover) on
   * every proxied response. Default true.
   */
  servedEndpointHeader?: boolean;
  /**
   * Who runs a split request's two legs: "gateway" (default: kvgate sends the prefill leg, then the
   * decode leg, pd/legs.ts) or "sidecar" (kvgate only names the prefiller in x-prefiller-host-port for
   * the decode pod's routing sidecar, kvgate pd-sidecar or llm-d's).
   */
  pdLegs?: "gateway" | "sidecar";
  /** A failed prefill leg: "recompute" (default, local prefill on the decoder) or "fail" (llm-d's). */
  prefillFailurePolicy?: "recompute" | "fail";
  /** Retries of a prefill answered 502/503/504 or cut off. Default 0. */
  prefillMaxRetries?: number;
  /** Between prefill retries. Default 200 ms. */
  prefillRetryBackoffMs?: number;
  /** A prefill attempt must be answered in full within this. Default 60 s. */
  prefillTimeoutMs?: number;
  seed?: number;
  /**
   * nats://host:port: share routing state with the other gateway replicas on the same subject
   * (sync/nats-sync.ts). Default: none (a single gateway needs nothing).
   */
  nats?: string;
  /** Subject prefix of the replicas that share state. Default `kvgate.sync.<poolName>`. */
  natsSubject?: string;
  /**
   * Resume a stream whose replica died after the first byte on another replica (migrate.ts);
   * requests override it with `x-kvgate-migrate: on|off`. Default false.
   */
  migrateStreams?: boolean;
  /** Migrations per stream at most. Default 3. */
  migrationLimit?: number;
  log?: (line: string) => void;
}

export type { BoundAddress } from "./listen.ts";

export interface GatewayHandle {
  /** A URL that reaches the public port from this machine (loopback when bound to every interface). */
  url: string;
  adminUrl: string;
  /** What the public and admin servers are actually bound to. */
  bound: BoundAddress;
  adminBound: BoundAddress;
  gateway: Gateway;
  close(): Promise<void>;
}

export class Gateway {
  readonly opts: Required<
    Pick<
      GatewayOptions,
      | "maxBodyBytes"
      | "maxConcurrentRequests"
      | "maxAttempts"
      | "upstreamHeadersTimeoutMs"
      | "upstreamBodyTimeoutMs"
      | "drainTimeoutMs"
      | "poolName"
      | "servedEndpointHeader"
    >
  > &
    GatewayOptions;
  readonly data: DataLayer;
  readonly metrics = new GatewayMetrics();
  /** Routing-state sync with peer gateways (--nats), or null. */
  sync: NatsSync | null = null;
  /** Per-endpoint requests, retries and failures, for GET /endpoints. */
  readonly traffic = new TrafficCounts();
  /** Autoscaling recommendations (--autoscale-config), fed by the request paths; null when off. */
  autoscale: AutoscaleService | null = null;
  routing: Routing;
  modelObjectives: ModelObjectives;
  /** Set when the gateway tokenizes prompts (GatewayOptions.tokenizer, or precise mode's default). */
  tokenizer: Tokenizer | null = null;
  /** Set by --tokenizer endpoint: prompts are tokenized by a candidate replica's /tokenize. */
  endpointTokenizer: EndpointTokenizer | null = null;
  /** What `tokenizer` is, for the startup line: "sim", a directory, "custom", or null. */
  tokenizerName: string | null = null;
  /** True when precise mode chose the sim tokenizer because no tokenizer was given. */
  tokenizerDefaulted = false;
  /** KV-event subscribers of the precise-prefix-cache-producers (precise mode). */
  readonly kvEvents: KvEventsWiring;
  readonly log: (line: string) => void;
  readonly #pools = new Map<string, Pool>();
  active = 0;
  draining = false;
  readonly publicServer: Server;
  /** HTTP/2 prior-knowledge connections on the public port (h2c.ts). */
  readonly h2c: H2cFront;
  readonly adminServer: Server;
  readonly #sockets = new Set<Socket>();
  readonly connections: ConnectionLimit;
  #closing: Promise<void> | null = null;
  /** The routing's between-request measurements (Scheduler.refresh) on their period; 0 ms = none. */
  #refresh: { timer: ReturnType<typeof setInterval> | null; ms: number; failed: boolean } = {
    timer: null,
    ms: 0,
    failed: false,
  };

  constructor(opts: GatewayOptions, source: EndpointSource, routing: Routing, objectives: ModelObjectives) {
    this.opts = {
      maxBodyBytes: 16 * 1024 * 1024,
      maxConcurrentRequests: 4096,
      maxAttempts: 3,
      upstreamHeadersTimeoutMs: 300_000,
      upstreamBodyTimeoutMs: 300_000,
      drainTimeoutMs: 30_000,
      poolName: "kvgate",
      servedEndpointHeader: true,
      ...stripUndefined(opts),
    };
    this.log = opts.log ?? ((l) => console.error(l));
    this.routing = routing;
    this.modelObjectives = objectives;
    this.kvEvents = new KvEventsWiring(this.log);
    this.data = new DataLayer(source, {
      store: {
        failureThreshold: opts.failureThreshold,
        probationBaseMs: opts.probationBaseMs,
        onHealthChange: (id, h, why) => this.log(`kvgate: endpoint ${id} is ${h}: ${why}`),
      },
      scraper: {
        intervalMs: opts.scrapeIntervalMs,
        timeoutMs: opts.scrapeTimeoutMs,
        modelsIntervalMs: opts.modelsIntervalMs,
        onPollError: () => this.metrics.pollErrors.inc({ source_type: "metrics-data-source" }),
        onExtractError: () =>
          this.metrics.extractErrors.inc({
            source_type: "metrics-data-source",
            extractor_type: "core-metrics-extractor",
          }),
      },
      onEndpointsChanged: (ids) => this.#pruneEndpoints(ids),
    });
    const onPublic = (req: IncomingMessage, res: ServerResponse) => handlePublic(this, req, res);
    this.publicServer = createServer({ headersTimeout: opts.headersTimeoutMs ?? 30_000 }, onPublic);
    this.h2c = acceptH2c(this.publicServer, onPublic, opts.headersTimeoutMs ?? 30_000);
    this.publicServer.requestTimeout = opts.requestTimeoutMs ?? 120_000;
    this.connections = new ConnectionLimit(opts.maxConnections ?? 16384);
    this.publicServer.on("connection", (s: Socket) => {
      this.connections.accept(s);
      this.#sockets.add(s);
      s.on("close", () => this.#sockets.delete(s));
    });
    this.adminServer = createServer((req, res) => handleAdmin(this, req, res));
  }

  /** The keep-alive pool to a replica, created on first use. */
  pool(id: string): Pool {
    let p = this.#pools.get(id);
    if (!p) {
      p = new Pool(`http://${id}`, { keepAliveTimeout: 30_000, connect: { timeout: 5_000 } });
      this.#pools.set(id, p);
    }
    return p;
  }

  #pruneEndpoints(ids: ReadonlySet<string>): void {
    for (const [id, p] of this.#pools)
      if (!ids.has(id)) {
        this.#pools.delete(id);
        p.close().catch(() => {});
      }
    this.routing.scheduler.retainEndpoints(ids);
    this.traffic.retain(ids);
    this.syncKvEvents();
  }

  /** Points the KV-event subscribers at the current routing's precise producers and endpoint set. */
  syncKvEvents(): void {
    this.kvEvents.sync(
      this.routing.precise,
      this.data.store.all().map((r) => r.spec),
    );
  }

  /**
   * Precise mode needs token ids: without a configured tokenizer it uses the sim replicas' one; a config
   * without precise producers drops that default again (approximate mode then hashes pseudo-tokens, as
   * without --tokenizer). Returns true when it changed the tokenizer.
   */
  async ensureTokenizer(): Promise<boolean> {
    const precise = this.routing.precise.length > 0;
    if (precise && this.tokenizer === null && this.endpointTokenizer === null) {
      this.tokenizer = await loadGatewayTokenizer("sim");
      this.tokenizerName = "sim";
      this.tokenizerDefaulted = true;
      return true;
    }
    if (!precise && this.tokenizerDefaulted) {
      this.tokenizer = this.tokenizerName = null;
      this.tokenizerDefaulted = false;
      return true;
    }
    return false;
  }

  /** Re-reads the endpoints file and the config file; a bad one is rejected and the old one kept. */
  async reload(): Promise<{ ok: boolean; endpoints: unknown; config: unknown }> {
    const ep = this.data.reload();
    let config: unknown = { ok: true, reloaded: false };
    let ok = ep.ok;
    if (this.opts.configFile) {
      try {
        const next = await buildRouting(readConfig(this.opts.configFile), {
          seed: this.opts.seed,
          previous: this.routing,
        });
        this.routing = next;
        this.sync?.attach(next.scheduler, configFingerprint(next.configText));
        this.startRefresh();
        next.scheduler.retainEndpoints(new Set(this.data.store.all().map((r) => r.spec.id)));
        this.syncKvEvents();
        if (await this.ensureTokenizer())
          this.log(
            this.tokenizer
              ? "kvgate: precise mode: tokenizing prompts with the sim tokenizer (no --tokenizer given)"
              : "kvgate: no precise producer left: no longer tokenizing prompts",
          );
        config = { ok: true, reloaded: true, warnings: next.warnings };
      } catch (err) {
        ok = false;
        const msg = (err as Error).message;
        const where = msg.startsWith("--config ") ? msg : `--config ${this.opts.configFile}: ${msg}`;
        config = {
          ok: false,
          error: `${where}; the running config is kept: fix the file and POST /reload again`,
        };
      }
    }
    if (this.opts.modelObjectivesFile) {
      try {
        this.modelObjectives = loadModelObjectives(this.opts.modelObjectivesFile);
      } catch (err) {
        ok = false;
        config = { ...(config as object), modelObjectivesError: (err as Error).message };
      }
    }
    return { ok, endpoints: ep, config };
  }

  /**
   * Runs the routing's between-request measurements (Scheduler.refresh: e.g. the locality filter's
   * saturation) every refreshIntervalS, so requests read them instead of taking them; again after
   * a reload, which may change the period. A failing refresh is logged once and never stops the
   * timer: requests then measure for themselves, as without it.
   */
  startRefresh(): void {
    const r = this.#refresh;
    const s = this.routing.scheduler.refreshIntervalS;
    const ms = s === null || this.draining ? 0 : Math.max(1, Math.round(s * 1000));
    if (ms === r.ms) return;
    if (r.timer !== null) clearInterval(r.timer);
    r.timer = null;
    r.ms = ms;
    if (ms === 0) return;
    r.timer = setInterval(() => {
      try {
        this.routing.scheduler.refresh(monotonicSeconds());
      } catch (err) {
        if (!r.failed)
          this.log(
            `kvgate: scheduler refresh failed: ${(err as Error).message} (requests measure for themselves)`,
          );
        r.failed = true;
      }
    }, ms);
    r.timer.unref();
  }

  /** Stops accepting, lets in-flight requests finish (up to drainTimeoutMs), then closes everything. */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.draining = true;
    this.startRefresh();
    const closed = new Promise<void>((r) => this.publicServer.close(() => r()));
    this.publicServer.closeIdleConnections();
    this.h2c.closeSessions();
    const deadline = Date.now() + this.opts.drainTimeoutMs;
    while (this.active > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    for (const s of this.#sockets) s.destroy();
    await closed;
    await new Promise<void>((r) => {
      this.adminServer.close(() => r());
      this.adminServer.closeAllConnections();
    });
    await this.sync?.close();
    stopDashboard(this);
    await this.data.close();
    await this.kvEvents.close();
    await Promise.all([...this.#pools.values()].map((p) => p.destroy().catch(() => {})));
    this.#pools.clear();
  }
}

/** Peers merge each other's state only when their routing configs are the same text. */
export function configFingerprint(configText: string): string {
  return createHash("sha256").update(configText).digest("hex").slice(0, 16);
}

function stripUndefined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/**
 * Builds a gateway without listening anywhere: options checked, config and objectives loaded, the
 * endpoint source opened, the tokenizer loaded. `kvgate serve` (startGateway) and `kvgate epp`
 * (ext-proc/epp.ts) both start from it. `source` replaces endpoints/endpointsFile (Kubernetes
 * discovery passes one and replaces its specs as pods come and go).
 */
export async function createGateway(opts: GatewayOptions, source?: EndpointSource): Promise<Gateway> {
  if (source !== undefined) {
    if (opts.endpoints !== undefined || opts.endpointsFile !== undefined)
      throw new Error("give an endpoint source or endpoints/endpointsFile, not both");
  } else if ((opts.endpoints === undefined) === (opts.endpointsFile === undefined))
    throw new Error("give exactly one of endpoints (--endpoints) or endpointsFile (--endpoints-file)");
  if (opts.config !== undefined && opts.configFile !== undefined)
    throw new Error("give at most one of config and configFile");
  const maxBody = opts.maxBodyBytes;
  if (maxBody !== undefined && !(Number.isInteger(maxBody) && maxBody >= 1))
    throw new Error(`--max-body-bytes must be a positive integer, got ${maxBody}`);
  for (const [flag, v] of [
    ["--max-connections", opts.maxConnections],
    ["--max-concurrent-requests", opts.maxConcurrentRequests],
  ] as const)
    if (v !== undefined && !(Number.isInteger(v) && v >= 1))
      throw new Error(`${flag} must be a positive integer, got ${v}`);
  if ((opts.requestTimeoutMs ?? 120_000) < (opts.headersTimeoutMs ?? 30_000))
    throw new Error("--request-timeout-ms must be ≥ --headers-timeout-ms");
  const configText = opts.configFile !== undefined ? readConfig(opts.configFile) : (opts.config ?? null);
  const routing = await buildRouting(configText, { seed: opts.seed });
  const objectives = opts.modelObjectivesFile ? loadModelObjectives(opts.modelObjectivesFile) : new Map();
  const src =
    source ??
    (opts.endpointsFile !== undefined
      ? EndpointSource.fromFile(opts.endpointsFile, { log: opts.log })
      : EndpointSource.fromList(opts.endpoints as string | EndpointSpec[]));
  const remote = isEndpointTokenizerSpec(opts.tokenizer);
  const tokenizer =
    opts.tokenizer !== undefined && !remote
      ? await loadGatewayTokenizer(opts.tokenizer, { maxBytes: opts.tokenizerCacheBytes })
      : null;
  const gw = new Gateway(opts, src, routing, objectives);
  gw.tokenizer = tokenizer;
  if (remote) gw.endpointTokenizer = new EndpointTokenizer({ timeoutMs: opts.tokenizeTimeoutMs });
  if (opts.tokenizer !== undefined)
    gw.tokenizerName = typeof opts.tokenizer === "string" ? opts.tokenizer : "custom";
  try {
    await gw.ensureTokenizer();
  } catch (err) {
    await gw.close().catch(() => {});
    throw err;
  }
  return gw;
}

/** Starts the data layer and the KV-event subscribers, and logs the config's warnings. */
export function startDataLayer(gw: Gateway): void {
  gw.data.start();
  gw.syncKvEvents();
  gw.startRefresh();
  if (gw.opts.nats) {
    gw.sync = new NatsSync(gw.routing.scheduler, {
      url: gw.opts.nats,
      subject: gw.opts.natsSubject ?? `kvgate.sync.${gw.opts.poolName.replace(/[^\w-]/g, "_")}`,
      config: configFingerprint(gw.routing.configText),
      registry: gw.metrics.registry,
      log: (l) => gw.log(l),
    });
    gw.sync.start();
  }
  dashboardSamplerOf(gw); // the dashboard's history starts with the gateway, not with the first page view
  for (const w of gw.routing.warnings) gw.log(`kvgate: config warning: ${w}`);
}

/** Builds and starts a gateway; rejects with a message naming the bad option or file. */
export async function startGateway(opts: GatewayOptions): Promise<GatewayHandle> {
  const gw = await createGateway(opts);
  const host = opts.host ?? "127.0.0.1";
  const adminHost = opts.adminHost ?? "127.0.0.1";
  try {
    const bound = await listen(gw.publicServer, opts.port ?? 0, host, { port: "--port", host: "--host" });
    const adminBound = await listen(gw.adminServer, opts.adminPort ?? 0, adminHost, {
      port: "--admin-port",
      host: "--admin-host",
    });
    startDataLayer(gw);
    return {
      url: bound.url,
      adminUrl: adminBound.url,
      bound,
      adminBound,
      gateway: gw,
      close: () => gw.close(),
    };
  } catch (err) {
    await gw.close().catch(() => {});
    throw err;
  }
}

function readConfig(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (err) {
    throw new Error(`--config ${path}: ${(err as Error).message}; check the path`);
  }
}
