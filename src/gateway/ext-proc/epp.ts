/**
 * `kvgate epp`'s composition root: the gateway's data layer, routing, admission and metrics (the
 * same Gateway `kvgate serve` builds, minus its HTTP front door) behind an
 * envoy.service.ext_proc.v3.ExternalProcessor gRPC server, as llm-d's endpoint picker runs
 * (llm-d/llm-d-router@ebab6879 `pkg/epp/server/`): ext_proc on --grpc-port (TLS by default),
 * grpc.health.v1.Health on --grpc-health-port (and on the ext_proc port, for Envoy's cluster health
 * check) with services "", liveness, readiness and the ext_proc service — SERVING only while the
 * data layer is ready, this replica is the leader and it is not draining — and Prometheus metrics
 * (plus the read-only admin API) on --metrics-port.
 *
 * Seams for Kubernetes discovery: `source` (an EndpointSource it replaces as pods change),
 * `resources` (InferenceObjective priorities and InferenceModelRewrites), `isLeader` and `ready`.
 * The server itself (serveExtProc) takes an EppBackend: here one pool's Gateway; with --pools
 * several (multi-pool/epp-pools.ts), the pool chosen per stream from the body's model.
 */
import {
  createServer,
  type Server as HttpServer,
  type IncomingMessage,
  type ServerResponse,
} from "node:http";
import { Server, ServerCredentials, type ServerDuplexStream } from "@grpc/grpc-js";
import { HealthImplementation, type ServingStatus } from "grpc-health-check";
import type { EndpointSource } from "../../datalayer/endpoints.ts";
import type { PoolResources } from "../../datalayer/pool-resources.ts";
import { createRng, type Rng } from "../../scheduler/rng.ts";
import { handleAdmin } from "../admin.ts";
import { GatewayError, sendError } from "../errors.ts";
import { createGateway, type Gateway, type GatewayOptions, startDataLayer } from "../gateway.ts";
import { type BoundAddress, listen } from "../listen.ts";
import { clusterObjectives } from "../model-objectives.ts";
import { resolveModelRewrite } from "../model-rewrite.ts";
import { EppStreamMetrics, EppTokenMetrics } from "./metrics.ts";
import {
  EXT_PROC_SERVICE,
  extProcService,
  type ProcessingRequest,
  type ProcessingResponse,
} from "./proto.ts";
import { randomReady } from "./request-answer.ts";
import { type EppContext, ProcessStream } from "./stream.ts";
import { readTlsDir, selfSigned, type TlsIdentity } from "./tls.ts";

/** The ext_proc server's own options (ports, TLS, message sizes, leadership). */
export interface EppServerOptions {
  /** ext_proc port; default 9002 (0 = any free port). */
  grpcPort?: number;
  /** Address of the gRPC and metrics servers; default 0.0.0.0. */
  grpcHost?: string;
  /** gRPC health port; default 9003. */
  grpcHealthPort?: number;
  /** Prometheus /metrics (and GET admin routes); default 9090. */
  metricsPort?: number;
  metricsHost?: string;
  /** TLS on the ext_proc port; default true. */
  secureServing?: boolean;
  /** Directory with tls.crt and tls.key; default a self-signed certificate. */
  certPath?: string;
  /** Largest gRPC message accepted / sent, bytes; default grpc-js's (4 MiB received, unlimited sent). */
  grpcMaxRecvMsgSize?: number;
  grpcMaxSendMsgSize?: number;
  /** Only the leader reports SERVING (HA with leader election); default always. */
  isLeader?: () => boolean;
  /** How often readiness is re-evaluated; default 250 ms. */
  readyPollMs?: number;
  /** --admin-port: the full admin API (POST /explain, /reload); default off. */
  adminPort?: number;
  adminHost?: string;
}

export interface EppOptions extends GatewayOptions, EppServerOptions {
  /** The endpoints, instead of endpoints/endpointsFile (Kubernetes discovery replaces its specs). */
  source?: EndpointSource;
  /** The pool's InferenceObjectives and InferenceModelRewrites, read on every request. */
  resources?: () => PoolResources;
  /** Whether discovery has synced; default: some endpoint has been scraped. */
  ready?: () => boolean;
}

/** What the ext_proc server serves: one pool, or several behind one server. */
export interface EppBackend {
  /** The streams' context (shuttingDown is the server's). */
  readonly ctx: Omit<EppContext, "shuttingDown">;
  /** Whether the data layer is ready (one of the conditions of SERVING). */
  ready(): boolean;
  /** A GET on the metrics port: /metrics and the read-only admin routes. */
  metricsGet(req: IncomingMessage, res: ServerResponse): void;
  /** The full admin API, listened on with --admin-port. */
  readonly adminServer: HttpServer;
  /** How long open streams may finish on drain. */
  readonly drainTimeoutMs: number;
  /** Starts scraping and discovery once the server listens. */
  start(): void;
  close(): Promise<void>;
}

export interface ExtProcHandle {
  grpc: { host: string; port: number; secure: boolean };
  healthPort: number;
  metrics: BoundAddress;
  /** The certificate served on the ext_proc port (PEM), when TLS is on. */
  certificate: string | null;
  tlsOrigin: string | null;
  /** What the health service reports for the ext_proc service now. */
  serving(): boolean;
  /** Health NOT_SERVING at once, then waits (up to drainTimeoutMs) for open streams to finish. */
  drain(): Promise<void>;
  /** drain(), then stops everything. */
  close(): Promise<void>;
}

export interface EppHandle extends ExtProcHandle {
  gateway: Gateway;
}

const SERVICES = ["", "readiness", EXT_PROC_SERVICE];

function bindGrpc(server: Server, host: string, port: number, creds: ServerCredentials, flag: string) {
  return new Promise<number>((resolve, reject) =>
    server.bindAsync(`${host.includes(":") ? `[${host}]` : host}:${port}`, creds, (err, bound) =>
      err
        ? reject(
            new Error(
              `cannot listen on ${host}:${port} (${flag}): ${err.message}; pick another ${flag}, or ${flag} 0 for any free port`,
            ),
          )
        : resolve(bound),
    ),
  );
}

/** The metrics port: GET routes of the admin API (/metrics, /endpoints, /config, /health) only. */
function metricsGet(gw: Gateway, req: IncomingMessage, res: ServerResponse): void {
  if (req.method === "GET") {
    handleAdmin(gw, req, res);
    return;
  }
  req.resume();
  sendError(
    res,
    new GatewayError(
      405,
      `${req.method} ${req.url} is not served on the metrics port; start kvgate epp with --admin-port for POST /explain and /reload`,
      {
        headers: { allow: "GET" },
      },
    ),
  );
}

/** One pool's Gateway as the ext_proc server's backend (InferenceObjectives and rewrites from `resources`). */
async function singlePool(opts: EppOptions): Promise<EppBackend & { gw: Gateway }> {
  const gw = await createGateway(opts, opts.source);
  const tokens = new EppTokenMetrics(gw.metrics.registry);
  const rng: Rng = createRng(opts.seed ?? 1);
  const objectives = clusterObjectives(
    () => gw.routing.objectives,
    () => opts.resources?.().objectives,
  );
  return {
    gw,
    ctx: {
      metrics: new EppStreamMetrics(gw.metrics.registry),
      rng,
      maxBodyBytes: gw.opts.maxBodyBytes,
      strip: () => [],
      target: (parsed) => {
        const rewrites = opts.resources?.().rewrites ?? [];
        const rewrite = rewrites.length
          ? resolveModelRewrite(rewrites, parsed.model, () => rng.next())
          : null;
        return { gw, tokens, rewrite, objectives: objectives() };
      },
      anyReady: (subset) => randomReady([gw], subset, rng),
      log: (line) => gw.log(line),
    },
    ready: () => (opts.ready ? opts.ready() : gw.data.store.all().some((r) => r.state.metrics !== null)),
    metricsGet: (req, res) => metricsGet(gw, req, res),
    adminServer: gw.adminServer,
    drainTimeoutMs: gw.opts.drainTimeoutMs,
    start: () => startDataLayer(gw),
    close: () => gw.close(),
  };
}

export async function startEpp(opts: EppOptions): Promise<EppHandle> {
  const { backend, ...h } = await serveExtProc(opts, () => singlePool(opts));
  return { ...h, gateway: backend.gw };
}

/** TLS, the backend, then the gRPC, health, metrics (and admin) listeners; rejects saying which flag to change. */
export async function serveExtProc<B extends EppBackend>(
  opts: EppServerOptions,
  makeBackend: () => Promise<B>,
): Promise<ExtProcHandle & { backend: B }> {
  const secure = opts.secureServing ?? true;
  let tls: TlsIdentity | null = null;
  if (secure) tls = opts.certPath !== undefined ? readTlsDir(opts.certPath) : await selfSigned();
  else if (opts.certPath !== undefined)
    throw new Error("--cert-path needs --secure-serving (it is the TLS certificate)");
  const backend = await makeBackend();
  let draining = false;
  let stopping = false;
  let active = 0;
  const ctx: EppContext = { ...backend.ctx, shuttingDown: () => stopping };

  const grpcOpts: Record<string, number> = {};
  if (opts.grpcMaxRecvMsgSize !== undefined)
    grpcOpts["grpc.max_receive_message_length"] = opts.grpcMaxRecvMsgSize;
  if (opts.grpcMaxSendMsgSize !== undefined)
    grpcOpts["grpc.max_send_message_length"] = opts.grpcMaxSendMsgSize;
  const server = new Server(grpcOpts);
  server.addService(extProcService(), {
    Process: (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
      active++;
      let ended = false;
      let counted = true;
      const gone = () => {
        if (counted) {
          counted = false;
          active--;
        }
      };
      const s = new ProcessStream(ctx, {
        send: (r) => {
          if (!ended) call.write(r);
        },
        end: () => {
          if (ended) return;
          ended = true;
          call.end();
        },
        fail: (code, message) => {
          if (ended) return;
          ended = true;
          call.emit("error", Object.assign(new Error(message), { code, details: message }));
        },
      });
      call.on("data", (m: ProcessingRequest) => s.onMessage(m));
      call.on("end", () => s.onClose(true));
      call.on("cancelled", () => s.onClose(false));
      call.on("error", () => s.onClose(false));
      call.on("finish", gone);
      call.on("close", gone);
    },
  });
  const health = new HealthImplementation({ liveness: "SERVING" });
  health.addToServer(server);
  const healthServer = new Server();
  health.addToServer(healthServer);

  let last: ServingStatus | null = null;
  const update = () => {
    const st: ServingStatus =
      !draining && (opts.isLeader?.() ?? true) && backend.ready() ? "SERVING" : "NOT_SERVING";
    if (st === last) return;
    last = st;
    for (const svc of SERVICES) health.setStatus(svc, st);
  };
  const host = opts.grpcHost ?? "0.0.0.0";
  const metricsSrv = createServer((req, res) => backend.metricsGet(req, res));
  let timer: NodeJS.Timeout | null = null;
  try {
    const creds = tls
      ? ServerCredentials.createSsl(
          null,
          [{ private_key: Buffer.from(tls.key), cert_chain: Buffer.from(tls.cert) }],
          false,
        )
      : ServerCredentials.createInsecure();
    const port = await bindGrpc(server, host, opts.grpcPort ?? 9002, creds, "--grpc-port");
    const healthPort = await bindGrpc(
      healthServer,
      host,
      opts.grpcHealthPort ?? 9003,
      ServerCredentials.createInsecure(),
      "--grpc-health-port",
    );
    const metricsBound = await listen(metricsSrv, opts.metricsPort ?? 9090, opts.metricsHost ?? host, {
      port: "--metrics-port",
      host: "--metrics-host",
    });
    if (opts.adminPort !== undefined)
      await listen(backend.adminServer, opts.adminPort, opts.adminHost ?? "127.0.0.1", {
        port: "--admin-port",
        host: "--admin-host",
      });
    backend.start();
    update();
    timer = setInterval(update, opts.readyPollMs ?? 250);
    timer.unref();

    let drained: Promise<void> | null = null;
    const drain = () => {
      drained ??= (async () => {
        draining = true;
        update();
        const deadline = Date.now() + backend.drainTimeoutMs;
        while (active > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      })();
      return drained;
    };
    let closed: Promise<void> | null = null;
    const close = () => {
      closed ??= (async () => {
        await drain();
        stopping = true;
        if (timer) clearInterval(timer);
        for (const svc of [...SERVICES, "liveness"]) health.setStatus(svc, "NOT_SERVING");
        server.forceShutdown();
        healthServer.forceShutdown();
        await new Promise<void>((r) => {
          metricsSrv.close(() => r());
          metricsSrv.closeAllConnections();
        });
        await backend.close();
      })();
      return closed;
    };
    return {
      backend,
      grpc: { host, port, secure: tls !== null },
      healthPort,
      metrics: metricsBound,
      certificate: tls?.cert ?? null,
      tlsOrigin: tls?.origin ?? null,
      serving: () => last === "SERVING",
      drain,
      close,
    };
  } catch (err) {
    if (timer) clearInterval(timer);
    server.forceShutdown();
    healthServer.forceShutdown();
    metricsSrv.close();
    await backend.close().catch(() => {});
    throw err;
  }
}
