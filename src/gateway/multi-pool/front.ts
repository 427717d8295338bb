/**
 * `kvgate serve --pools`: one front door (public OpenAI port + admin port) for several pools, each a
 * full Gateway of its own (endpoints, scraping, EndpointPickerConfig, admission, flow control,
 * metrics) built without a listener. Per request the front reads and decodes the body once, takes
 * the model (or, when configured, a trusted header set by a model-selecting layer above kvgate),
 * applies the InferenceModelRewrites, and hands the request to the pool serving the target model,
 * whose own decision path (decide.ts) schedules it. An unknown model is a 404 naming the served ones.
 * GET /v1/models is the union over the pools plus the rewrites' source names. The pools, the choice
 * and the admin routes (GET /pools, each pool's admin API under /pools/<name>/) are pool-set.ts's,
 * shared with `kvgate epp --pools`; the file's reload (watched, or POST /reload) is live-pools.ts's.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer, type Server } from "node:http";
import { isIPv6, type Socket } from "node:net";
import { ConnectionLimit } from "../connection-limit.ts";
import { GatewayError, sendError } from "../errors.ts";
import type { Gateway } from "../gateway.ts";
import { headerValue } from "../headers.ts";
import { type BoundAddress, listen } from "../listen.ts";
import { type ParsedRequest, parseRequestBody, readBody, routeOf } from "../request-body.ts";
import { proxyPreread, SERVED_ROUTES } from "../server.ts";
import { createPoolSet, type DiscoveryOptions } from "./build-pools.ts";
import type { FrontMetrics } from "./front-metrics.ts";
import { LivePools } from "./live-pools.ts";
import type { RoutedPool } from "./pool-router.ts";
import type { PoolSet, SharedPoolOptions } from "./pool-set.ts";
import { loadPoolsFile, type PoolsFile, type TrustedHeader } from "./pools-file.ts";

export type MultiPoolOptions = SharedPoolOptions &
  DiscoveryOptions & {
    /** Path of the pools file (pools-file.ts); exclusive with `poolsSpec`. */
    poolsFile?: string;
    /** An already parsed pools file (tests). */
    poolsSpec?: PoolsFile;
  };

export interface MultiPoolHandle {
  url: string;
  adminUrl: string;
  bound: BoundAddress;
  adminBound: BoundAddress;
  front: MultiPoolFront;
  close(): Promise<void>;
}

const ROUTE_PATHS = new Set(["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]);

export class MultiPoolFront {
  readonly live: LivePools;
  readonly publicServer: Server;
  readonly adminServer: Server;
  readonly connections: ConnectionLimit;
  readonly maxBodyBytes: number;
  readonly #sockets = new Set<Socket>();
  draining = false;

  constructor(live: LivePools, opts: MultiPoolOptions) {
    this.live = live;
    this.maxBodyBytes = opts.maxBodyBytes ?? 16 * 1024 * 1024;
    this.connections = new ConnectionLimit(opts.maxConnections ?? 16384);
    this.publicServer = createServer({ headersTimeout: opts.headersTimeoutMs ?? 30_000 }, (req, res) =>
      this.#public(req, res).catch(() => sendError(res, new GatewayError(500, "internal gateway error"))),
    );
    this.publicServer.requestTimeout = opts.requestTimeoutMs ?? 120_000;
    this.publicServer.on("connection", (s: Socket) => {
      this.connections.accept(s);
      this.#sockets.add(s);
      s.on("close", () => this.#sockets.delete(s));
    });
    this.adminServer = createServer((req, res) => live.handleAdmin(req, res));
  }

  /** The pools serving now (a reload of the pools file replaces them). */
  get set(): PoolSet {
    return this.live.current;
  }

  get pools(): ReadonlyMap<string, Gateway> {
    return this.set.pools;
  }

  get trusted(): TrustedHeader | null {
    return this.set.trusted;
  }

  get metrics(): FrontMetrics {
    return this.set.metrics;
  }

  /** The trusted header's value when the request may use it; otherwise null (and it is dropped). */
  #trustedValue(req: IncomingMessage): string | null {
    const t = this.set.trusted;
    if (!t) return null;
    const v = headerValue(req.headers, t.name);
    delete req.headers[t.name]; // never forwarded to a replica
    if (v === undefined || v === "") return null;
    if (t.sources) {
      let addr = req.socket.remoteAddress ?? "";
      if (addr.startsWith("::ffff:")) addr = addr.slice(7);
      if (!t.sources.check(addr, isIPv6(addr) ? "ipv6" : "ipv4")) return null;
    }
    return v;
  }

  /** model (or the trusted header) → rewrite → pool, counted; a GatewayError when nothing serves it. */
  choose(parsed: ParsedRequest, req: IncomingMessage): RoutedPool<Gateway> | GatewayError {
    return this.set.choose(parsed, this.#trustedValue(req));
  }

  async #public(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0];
    const route = ROUTE_PATHS.has(path) ? routeOf(path) : null;
    if (this.connections.rejects(req.socket)) {
      req.resume();
      res.setHeader("connection", "close");
      return this.#reject(
        res,
        "connection-limit",
        new GatewayError(
          503,
          `too many open connections (limit ${this.connections.max}); retry with backoff or raise --max-connections`,
        ),
      );
    }
    if (route && req.method === "POST") {
      if (this.draining) {
        req.resume();
        return this.#reject(
          res,
          "shutting-down",
          new GatewayError(503, "the gateway is shutting down; retry on another replica", {
            reason: "rejected-shutting-down",
          }),
        );
      }
      let body: Buffer;
      let parsed: ParsedRequest;
      try {
        body = await readBody(req, this.maxBodyBytes);
        parsed = parseRequestBody(route, body);
      } catch (err) {
        if (!(err instanceof GatewayError)) throw err;
        return this.#reject(res, "bad-request", err);
      }
      const chosen = this.choose(parsed, req);
      if (chosen instanceof GatewayError) return sendError(res, chosen); // counted by choose()
      return proxyPreread(chosen.pool, route, req, res, {
        body,
        pre: { parsed, rewrite: chosen.rewrite },
        objectives: this.set.objectivesOf(chosen.pool),
      });
    }
    if (path === "/health" && req.method === "GET") {
      res.writeHead(this.draining ? 503 : 200, { "content-type": "application/json" }).end("{}");
      return;
    }
    if (path === "/v1/models" && req.method === "GET") return this.#models(res);
    req.resume();
    const known = route !== null || path === "/v1/models" || path === "/health";
    const allow = route ? "POST" : "GET";
    this.#reject(
      res,
      known ? "method" : "no-route",
      known
        ? new GatewayError(405, `Method ${req.method} is not allowed on ${path}; use ${allow}`, {
            headers: { allow },
          })
        : new GatewayError(404, `No route for ${req.method} ${path}; ${SERVED_ROUTES}`),
    );
  }

  #reject(res: ServerResponse, reason: string, err: GatewayError): void {
    this.metrics.reject(err.status, reason);
    sendError(res, err);
  }

  async #models(res: ServerResponse): Promise<void> {
    const body = JSON.stringify({ object: "list", data: await this.set.modelCards() });
    res
      .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
      .end(body);
  }

  /** Stops accepting, drains every pool, closes the listeners. */
  async close(): Promise<void> {
    if (this.draining) return;
    this.draining = true;
    const closed = new Promise<void>((r) => this.publicServer.close(() => r()));
    this.publicServer.closeIdleConnections();
    await this.live.close();
    for (const s of this.#sockets) s.destroy();
    await closed;
    await new Promise<void>((r) => {
      this.adminServer.close(() => r());
      this.adminServer.closeAllConnections();
    });
  }
}

/** Builds every pool's gateway, then listens; rejects with a message naming the bad file or option. */
export async function startMultiPool(opts: MultiPoolOptions): Promise<MultiPoolHandle> {
  const spec = opts.poolsSpec ?? loadPoolsFile(opts.poolsFile as string);
  const { poolsFile: _f, poolsSpec: _s, ...shared } = opts;
  const { kubeconfig, ...gateway } = shared;
  const set = await createPoolSet(spec, gateway, { kubeconfig });
  const live = new LivePools(set, opts.poolsFile ?? null, { shared: gateway, kube: { kubeconfig } });
  const front = new MultiPoolFront(live, opts);
  try {
    const bound = await listen(front.publicServer, opts.port ?? 0, opts.host ?? "127.0.0.1", {
      port: "--port",
      host: "--host",
    });
    const adminBound = await listen(front.adminServer, opts.adminPort ?? 0, opts.adminHost ?? "127.0.0.1", {
      port: "--admin-port",
      host: "--admin-host",
    });
    front.live.start();
    return { url: bound.url, adminUrl: adminBound.url, bound, adminBound, front, close: () => front.close() };
  } catch (err) {
    await front.close().catch(() => {});
    throw err;
  }
}
