/**
 * `kvgate serve --pools`: one front door (public OpenAI port + admin port) for several pools, each a
 * full Gateway of its own (endpoints, scraping, EndpointPickerConfig, admission, flow control,
 * metrics) built without a listener. Per request the front reads and decodes the body once, takes
 * the model (or, when configured, a trusted header set by a model-selecting layer above kvgate),
 * applies the InferenceModelRewrites, and hands the request to the pool serving the target model,
 * whose own decision path (decide.ts) schedules it. An unknown model is a 404 naming the served ones.
 * GET /v1/models is the union over the pools plus the rewrites' source names. Admin: GET /pools, and
 * each pool's own admin API under /pools/<name>/ (its /endpoints, /metrics, /reload, ...).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer, type Server } from "node:http";
import { isIPv6, type Socket } from "node:net";
import { createRng } from "../../scheduler/rng.ts";
import { handleAdmin } from "../admin.ts";
import { ConnectionLimit } from "../connection-limit.ts";
import { GatewayError, sendError } from "../errors.ts";
import { createGateway, type Gateway, type GatewayOptions, startDataLayer } from "../gateway.ts";
import { headerValue } from "../headers.ts";
import { type BoundAddress, listen } from "../listen.ts";
import { type ParsedRequest, parseRequestBody, readBody, routeOf } from "../request-body.ts";
import { proxyPreread, servedModelCards } from "../server.ts";
import { FrontMetrics } from "./front-metrics.ts";
import { PoolRouter, type RoutedPool } from "./pool-router.ts";
import { loadPoolsFile, type PoolsFile, type TrustedHeader } from "./pools-file.ts";

export type MultiPoolOptions = Omit<
  GatewayOptions,
  "endpoints" | "endpointsFile" | "config" | "configFile"
> & {
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

/** A model card of GET /v1/models. */
interface Card {
  id: string;
  object?: string;
  owned_by?: string;
  [k: string]: unknown;
}

const ROUTE_PATHS = new Set(["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]);

export class MultiPoolFront {
  readonly pools: ReadonlyMap<string, Gateway>;
  readonly router: PoolRouter<Gateway>;
  readonly trusted: TrustedHeader | null;
  readonly publicServer: Server;
  readonly adminServer: Server;
  readonly metrics = new FrontMetrics();
  readonly connections: ConnectionLimit;
  readonly maxBodyBytes: number;
  readonly #rng: () => number;
  readonly #sockets = new Set<Socket>();
  readonly #declared: ReadonlyMap<Gateway, readonly string[] | null>;
  readonly #forget: NodeJS.Timeout;
  draining = false;

  constructor(spec: PoolsFile, pools: ReadonlyMap<string, Gateway>, opts: MultiPoolOptions) {
    this.pools = pools;
    const entries = spec.pools.map((p) => ({
      name: p.name,
      pool: pools.get(p.name) as Gateway,
      models: p.models,
    }));
    this.#declared = new Map(entries.map((e) => [e.pool, e.models]));
    this.router = new PoolRouter(entries, spec.rewrites, (gw, model) =>
      gw.data.store.all().some((r) => r.modelIds?.has(model) === true),
    );
    this.#forget = setInterval(() => this.router.forgetLearned(), 1000);
    this.#forget.unref();
    this.trusted = spec.trustedHeader;
    const rng = createRng(opts.seed ?? 1);
    this.#rng = () => rng.next();
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
    this.adminServer = createServer((req, res) => this.#admin(req, res));
  }

  /** Served model names: each pool's declared models, or what its replicas list. */
  servedModels(): string[] {
    const out = new Set<string>();
    for (const gw of this.pools.values()) {
      const declared = this.#declared.get(gw);
      if (declared) for (const m of declared) out.add(m);
      else for (const r of gw.data.store.all()) for (const m of r.modelIds ?? []) out.add(m);
    }
    return [...out].sort();
  }

  /** The trusted header's value when the request may use it; otherwise null (and it is dropped). */
  #trustedValue(req: IncomingMessage): string | null {
    const t = this.trusted;
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

  /** model (or the trusted header) → rewrite → pool; a GatewayError when nothing serves it. */
  choose(parsed: ParsedRequest, req: IncomingMessage): RoutedPool<Gateway> | GatewayError {
    const hv = this.#trustedValue(req);
    if (hv !== null && this.trusted?.selects === "pool") {
      const pool = this.router.byName(hv);
      if (!pool)
        return new GatewayError(
          400,
          `${this.trusted.name} names pool ${JSON.stringify(hv)}, which is not configured; pools: ${[...this.pools.keys()].join(", ")}`,
        );
      const rewrite = this.router.rewrite(parsed.model, this.#rng);
      return { pool, model: rewrite?.target ?? parsed.model, rewrite };
    }
    const asked = hv ?? parsed.model;
    const routed = this.router.route(asked, this.#rng);
    if (routed) {
      if (hv === null || hv === parsed.model) return routed;
      // The header chose the model: the body's model is rewritten to what is sent.
      return {
        ...routed,
        rewrite: {
          rewriteName: routed.rewrite?.rewriteName ?? `header:${this.trusted?.name}`,
          model: parsed.model,
          target: routed.model,
        },
      };
    }
    const known = [...this.servedModels(), ...this.router.rewriteSources()];
    return new GatewayError(
      404,
      `The model \`${asked}\` does not exist. Served models: ${known.length ? known.join(", ") : "none yet (no replica has been scraped)"}; set "model" to one of them.`,
      { param: "model" },
    );
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
          new GatewayError(503, "the gateway is shutting down", { reason: "rejected-shutting-down" }),
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
      if (chosen instanceof GatewayError)
        return this.#reject(res, chosen.status === 404 ? "unknown-model" : "bad-selection", chosen);
      this.metrics.routed.inc({ pool: chosen.pool.opts.poolName });
      return proxyPreread(chosen.pool, route, req, res, { body, pre: { parsed, rewrite: chosen.rewrite } });
    }
    if (path === "/health" && req.method === "GET") {
      res.writeHead(this.draining ? 503 : 200, { "content-type": "application/json" }).end("{}");
      return;
    }
    if (path === "/v1/models" && req.method === "GET") return this.#models(res);
    req.resume();
    const known = route !== null || path === "/v1/models" || path === "/health";
    this.#reject(
      res,
      known ? "method" : "no-route",
      known
        ? new GatewayError(405, `Method ${req.method} is not allowed on ${path}`, {
            headers: { allow: route ? "POST" : "GET" },
          })
        : new GatewayError(404, `No route for ${req.method} ${path}`),
    );
  }

  #reject(res: ServerResponse, reason: string, err: GatewayError): void {
    this.metrics.reject(err.status, reason);
    sendError(res, err);
  }

  /** The union over the pools (replica cards, or minimal cards for declared models) plus rewrite sources. */
  async #models(res: ServerResponse): Promise<void> {
    const seen = new Set<string>();
    const data: Card[] = [];
    const add = (c: Card) => {
      if (seen.has(c.id)) return;
      seen.add(c.id);
      data.push(c);
    };
    const lists = await Promise.all([...this.pools.values()].map((gw) => servedModelCards(gw)));
    let i = 0;
    for (const gw of this.pools.values()) {
      const cards = lists[i++] as Card[];
      const declared = this.#declared.get(gw);
      if (!declared) for (const c of cards) add(c);
      else
        for (const m of declared)
          add(cards.find((c) => c.id === m) ?? { id: m, object: "model", owned_by: "kvgate" });
    }
    for (const m of this.router.rewriteSources()) add({ id: m, object: "model", owned_by: "kvgate" });
    const body = JSON.stringify({ object: "list", data });
    res
      .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
      .end(body);
  }

  #admin(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? "/").split("?")[0];
    if (path === "/metrics" && req.method === "GET") {
      void this.metrics
        .text()
        .then((t) => res.writeHead(200, { "content-type": this.metrics.registry.contentType }).end(t));
      return;
    }
    if (path === "/pools" && req.method === "GET") {
      const pools = [...this.pools].map(([name, gw]) => ({
        name,
        declaredModels: this.#declared.get(gw) ?? null,
        replicaModels: [...new Set(gw.data.store.all().flatMap((r) => [...(r.modelIds ?? [])]))].sort(),
        endpoints: gw.data.store.all().map((r) => ({ id: r.spec.id, health: r.health })),
        admin: `/pools/${name}/`,
      }));
      const body = JSON.stringify({ pools, rewriteSources: this.router.rewriteSources() }, null, 2);
      res.writeHead(200, { "content-type": "application/json" }).end(body);
      return;
    }
    const m = /^\/pools\/([^/]+)(\/.*)?$/.exec(req.url ?? "/");
    const gw = m ? this.pools.get(m[1]) : undefined;
    if (m && gw) {
      req.url = m[2] ?? "/";
      handleAdmin(gw, req, res);
      return;
    }
    req.resume();
    sendError(
      res,
      new GatewayError(
        404,
        `No admin route ${req.method} ${path}; see GET /pools and GET /metrics (the front door's own), and /pools/<name>/endpoints, /pools/<name>/metrics, ... for each pool`,
      ),
    );
  }

  /** Stops accepting, drains every pool, closes the listeners. */
  async close(): Promise<void> {
    if (this.draining) return;
    this.draining = true;
    clearInterval(this.#forget);
    const closed = new Promise<void>((r) => this.publicServer.close(() => r()));
    this.publicServer.closeIdleConnections();
    await Promise.all([...this.pools.values()].map((gw) => gw.close()));
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
  const pools = new Map<string, Gateway>();
  const { poolsFile: _f, poolsSpec: _s, ...shared } = opts;
  try {
    for (const p of spec.pools) {
      const gw = await createGateway({
        ...shared,
        endpoints: p.endpoints,
        endpointsFile: p.endpointsFile,
        configFile: p.configFile,
        poolName: p.name,
      }).catch((err: Error) => {
        throw Object.assign(err, { message: `pool ${p.name}: ${err.message}` });
      });
      pools.set(p.name, gw);
    }
  } catch (err) {
    await Promise.all([...pools.values()].map((g) => g.close().catch(() => {})));
    throw err;
  }
  const front = new MultiPoolFront(spec, pools, opts);
  try {
    const bound = await listen(front.publicServer, opts.port ?? 0, opts.host ?? "127.0.0.1", {
      port: "--port",
      host: "--host",
    });
    const adminBound = await listen(front.adminServer, opts.adminPort ?? 0, opts.adminHost ?? "127.0.0.1", {
      port: "--admin-port",
      host: "--admin-host",
    });
    for (const gw of pools.values()) startDataLayer(gw);
    return { url: bound.url, adminUrl: adminBound.url, bound, adminBound, front, close: () => front.close() };
  } catch (err) {
    await front.close().catch(() => {});
    throw err;
  }
}
