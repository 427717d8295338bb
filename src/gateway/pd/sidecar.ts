/**
 * `kvgate pd-sidecar`: a drop-in for llm-d's routing sidecar on a decode pod (llm-d/llm-d-router
 * `pkg/sidecar/proxy/`, binary `cmd/pd-sidecar`). It listens where clients (Envoy, after the EPP's
 * pick) reach the pod, and proxies to the local vLLM. A POST to /v1/chat/completions,
 * /v1/completions or /v1/responses carrying the EPP's `x-prefiller-host-port` runs the two P/D legs
 * (legs.ts, the code `kvgate serve` runs): prefill on that prefiller, decode on the local vLLM.
 * Everything else goes straight to vLLM, answers (5xx included) passed back as they are.
 *
 * The header: all its values are read (one line is split on commas); the first entry is used, or a
 * random one with prefiller sampling. It is removed before anything is proxied, with the other
 * routing-control headers (headers.ts), so vLLM never sees it. SSRF protection (on by default,
 * unlike llm-d) allows only prefillers in the allowlist, matched on host AND port (the fix of
 * llm-d/llm-d-router#242 / #979): the InferencePool's Ready pods × target ports, or a static list.
 * Anything else is refused with 403 in OpenAI's error format.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer, type Server } from "node:http";
import type { Socket } from "node:net";
import { Registry } from "prom-client";
import { Pool } from "undici";
import { type EndpointSource, parseHostPort } from "../../datalayer/endpoints.ts";
import { createRng } from "../../scheduler/rng.ts";
import { GatewayError, sendError } from "../errors.ts";
import { forwardRequestHeaders } from "../headers.ts";
import { type BoundAddress, listen } from "../listen.ts";
import { type ForwardOutcome, type ForwardRequest, forward } from "../proxy.ts";
import { readBody } from "../request-body.ts";
import { type JsonObject, pdApiOf } from "./bodies.ts";
import { DEFAULT_PD_LEG_OPTIONS, type PdLegOptions, runPdLegs } from "./legs.ts";
import { PdMetrics } from "./metrics.ts";

export const PREFILLER_HEADER = "x-prefiller-host-port";

export interface PdSidecarOptions {
  /** Default 8000 (0 = any free port). */
  port?: number;
  /** Default 0.0.0.0. */
  host?: string;
  /** The local vLLM. Default 127.0.0.1:8200. */
  vllmHost?: string;
  vllmPort?: number;
  legs?: Partial<PdLegOptions>;
  /** Refuse prefillers outside `allowlist` (403). Default true. */
  ssrfProtection?: boolean;
  /** The allowed prefillers (their `host:port` ids); required with SSRF protection. */
  allowlist?: EndpointSource | null;
  /** Pick a random entry of a multi-valued header instead of the first. */
  prefillerSampling?: boolean;
  seed?: number;
  /** Serve kvgate_pd_* on this port's /metrics (0 = any free port); undefined = no metrics server. */
  metricsPort?: number;
  maxBodyBytes?: number;
  /** The local vLLM must send headers, then each chunk, within this. Default 300 s. */
  upstreamTimeoutMs?: number;
  log?: (line: string) => void;
}

export interface PdSidecarHandle {
  url: string;
  /** The listening server (tests watch its connections). */
  server: Server;
  bound: BoundAddress;
  metricsUrl: string | null;
  metrics: PdMetrics;
  close(): Promise<void>;
}

/** Prefill pools kept at most (the oldest is closed beyond it; SSRF off lets a client name any target). */
const MAX_PREFILL_POOLS = 256;

class Sidecar {
  readonly registry = new Registry();
  readonly metrics = new PdMetrics(this.registry);
  readonly vllmId: string;
  readonly vllm: Pool;
  readonly #prefill = new Map<string, Pool>();
  readonly #rng;
  #allowed: Set<string> | null = null;
  readonly legs: PdLegOptions;
  readonly log: (line: string) => void;

  constructor(readonly o: PdSidecarOptions) {
    const host = o.vllmHost ?? "127.0.0.1";
    this.vllmId = `${host.includes(":") ? `[${host}]` : host}:${o.vllmPort ?? 8200}`;
    this.vllm = new Pool(`http://${this.vllmId}`, { keepAliveTimeout: 30_000, connect: { timeout: 5_000 } });
    this.#rng = createRng(o.seed ?? 1);
    this.legs = { ...DEFAULT_PD_LEG_OPTIONS, ...o.legs };
    this.log = o.log ?? ((l) => console.error(l));
    const invalidate = () => (this.#allowed = null);
    o.allowlist?.on("add", invalidate).on("remove", invalidate).on("update", invalidate);
  }

  #ids(): Set<string> {
    this.#allowed ??= new Set((this.o.allowlist?.current() ?? []).map((s) => s.id));
    return this.#allowed;
  }

  allowed(id: string): boolean {
    return this.#ids().has(id);
  }

  /** Whether `host` is the host of an allowed endpoint (any port). */
  allowedHost(host: string): boolean {
    for (const id of this.#ids()) if (id.slice(0, id.lastIndexOf(":")) === host) return true;
    return false;
  }

  prefillPool(id: string): Pool {
    let p = this.#prefill.get(id);
    if (p) return p;
    if (this.#prefill.size >= MAX_PREFILL_POOLS) {
      const [oldId, old] = this.#prefill.entries().next().value as [string, Pool];
      this.#prefill.delete(oldId);
      old.close().catch(() => {});
    }
    p = new Pool(`http://${id}`, { keepAliveTimeout: 30_000, connect: { timeout: 5_000 } });
    this.#prefill.set(id, p);
    return p;
  }

  /** The header's prefiller, or null: all values, one line split on commas, first or sampled. */
  prefiller(req: IncomingMessage): string | null {
    const values = req.headersDistinct[PREFILLER_HEADER] ?? [];
    const list = (values.length === 1 ? (values[0] as string).split(",") : values)
      .map((v) => v.trim())
      .filter((v) => v !== "");
    if (list.length === 0) return null;
    const pick = this.o.prefillerSampling ? list[this.#rng.int(list.length)] : list[0];
    return (pick as string).replace(/^http:\/\//, "");
  }

  async closePools(): Promise<void> {
    await Promise.all([this.vllm, ...this.#prefill.values()].map((p) => p.destroy().catch(() => {})));
    this.#prefill.clear();
  }
}

async function handle(s: Sidecar, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const ac = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) ac.abort(new Error("client disconnected"));
  });
  const path = req.url ?? "/";
  const target = s.prefiller(req); // read before the headers are filtered: it never goes on
  const headers = forwardRequestHeaders(req.headers);
  let body: Buffer;
  try {
    body = await readBody(req, s.o.maxBodyBytes ?? 16 * 1024 * 1024);
  } catch (err) {
    if (err instanceof GatewayError) return sendError(res, err);
    throw err;
  }
  if (body.length > 0 || req.method === "POST" || req.method === "PUT")
    headers["content-length"] = String(body.length);
  const timeout = s.o.upstreamTimeoutMs ?? 300_000;
  const local: Omit<ForwardRequest, "path" | "method" | "headers" | "body" | "signal" | "res"> = {
    targets: [s.vllmId],
    maxAttempts: 1,
    headersTimeoutMs: timeout,
    bodyTimeoutMs: timeout,
    pool: () => s.vllm,
    passLastError: true,
    onAttemptFailed: (f) => s.log(`kvgate pd-sidecar: local vLLM ${f.endpoint}: ${f.message}`),
    onStarted: () => {},
  };
  const api = req.method === "POST" ? pdApiOf(path) : null;
  let out: ForwardOutcome;
  if (target !== null && api !== null) {
    let id: string;
    try {
      id = parseHostPort(target, PREFILLER_HEADER).id;
    } catch {
      id = "";
    }
    if ((s.o.ssrfProtection ?? true) && (id === "" || !s.allowed(id))) {
      s.metrics.ssrfRejections.inc();
      s.log(
        `kvgate pd-sidecar: SSRF protection: prefill target ${JSON.stringify(target)} is not in the allowlist; refused (403)`,
      );
      return sendError(
        res,
        new GatewayError(
          403,
          `prefill target ${JSON.stringify(target)} is not allowed by SSRF protection: it is not an endpoint of the pool; set ${PREFILLER_HEADER} to the host:port of one of the pool's endpoints`,
        ),
      );
    }
    if (id === "")
      return sendError(
        res,
        new GatewayError(
          400,
          `${PREFILLER_HEADER} ${JSON.stringify(target)} is not host:port; give host:port or [ipv6]:port, e.g. 10.0.0.7:8000`,
        ),
      );
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString("utf8"));
    } catch {
      parsed = null;
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      return sendError(res, new GatewayError(400, "the request body must be a JSON object"));
    out = (
      await runPdLegs({
        api,
        path,
        headers,
        body: parsed as JsonObject,
        prefill: { id, pool: s.prefillPool(id) },
        decode: local,
        res,
        signal: ac.signal,
        opts: s.legs,
        metrics: s.metrics,
        log: s.log,
      })
    ).out;
  } else {
    const foreign = api !== null && (s.o.ssrfProtection ?? true) ? foreignKvSource(s, body) : null;
    if (foreign !== null) {
      s.metrics.ssrfRejections.inc();
      s.log(
        `kvgate pd-sidecar: SSRF protection: kv_transfer_params.remote_host ${foreign} is not a pool host; refused (403)`,
      );
      return sendError(
        res,
        new GatewayError(
          403,
          `kv_transfer_params.remote_host ${foreign} is not allowed by SSRF protection: it is not a host of the pool; let the endpoint picker choose the prefiller (x-prefiller-host-port) instead`,
        ),
      );
    }
    out = await forward({
      ...local,
      path,
      method: req.method ?? "GET",
      headers,
      body,
      signal: ac.signal,
      res,
    });
  }
  if (out.kind === "exhausted")
    sendError(
      res,
      new GatewayError(
        502,
        `the local vLLM at ${s.vllmId} did not answer (${out.failures.map((f) => f.message).join("; ")}); check that it runs on --vllm-port`,
      ),
    );
}

export async function startPdSidecar(o: PdSidecarOptions): Promise<PdSidecarHandle> {
  if ((o.ssrfProtection ?? true) && !o.allowlist)
    throw new Error(
      "SSRF protection is on but there is no allowlist: give --inference-pool, --endpoints or --endpoints-file, or --enable-ssrf-protection=false",
    );
  const s = new Sidecar(o);
  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    handle(s, req, res).catch((err) => {
      s.log(`kvgate pd-sidecar: internal error on ${req.url}: ${(err as Error).stack ?? err}`);
      sendError(res, new GatewayError(500, "internal sidecar error"));
      if (!res.writableEnded) res.destroy();
    });
  });
  server.on("connection", (c: Socket) => {
    sockets.add(c);
    c.on("close", () => sockets.delete(c));
  });
  let metricsServer: Server | null = null;
  let metricsUrl: string | null = null;
  const closeAll = async () => {
    for (const c of sockets) c.destroy();
    await new Promise<void>((r) => server.close(() => r()));
    if (metricsServer) {
      const m = metricsServer;
      await new Promise<void>((r) => m.close(() => r()));
      m.closeAllConnections();
    }
    await s.closePools();
  };
  try {
    const bound = await listen(server, o.port ?? 8000, o.host ?? "0.0.0.0", {
      port: "--port",
      host: "--host",
    });
    if (o.metricsPort !== undefined) {
      metricsServer = createServer((req, res) => {
        if ((req.url ?? "").split("?")[0] !== "/metrics" || req.method !== "GET")
          return sendError(res, new GatewayError(404, "only GET /metrics is served here"));
        s.registry.metrics().then(
          (text) => res.writeHead(200, { "content-type": s.registry.contentType }).end(text),
          () => sendError(res, new GatewayError(500, "metrics unavailable")),
        );
      });
      metricsUrl = (
        await listen(metricsServer, o.metricsPort, o.host ?? "0.0.0.0", {
          port: "--metrics-port",
          host: "--host",
        })
      ).url;
    }
    return { url: bound.url, server, bound, metricsUrl, metrics: s.metrics, close: closeAll };
  } catch (err) {
    await closeAll().catch(() => {});
    throw err;
  }
}

/**
 * A decode request that names its own KV source (`kv_transfer_params.remote_host`, which vLLM's
 * NixlConnector would contact) outside the pool's hosts: that host, quoted; else null. Ports are
 * not compared — the side channel (vLLM's 5600 + rank) is not the serving port in the allowlist.
 * Params from a prefiller of the pool (llm-d's coordinator topology) pass.
 */
function foreignKvSource(s: Sidecar, body: Buffer): string | null {
  if (!body.includes("kv_transfer_params")) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch {
    return null; // vLLM answers a malformed body itself
  }
  const params = (parsed as { kv_transfer_params?: unknown } | null)?.kv_transfer_params;
  if (typeof params !== "object" || params === null) return null;
  const host = (params as { remote_host?: unknown }).remote_host;
  if (host === undefined || host === null) return null;
  const h = String(host).replace(/^\[(.*)\]$/, "$1");
  const bracketed = h.includes(":") ? `[${h}]` : h;
  return s.allowedHost(h) || s.allowedHost(bracketed) ? null : JSON.stringify(String(host));
}
