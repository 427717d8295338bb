/**
 * Small fake model servers for datalayer and gateway tests: a loopback node:http server whose
 * /metrics, /v1/models and generation routes are scripted per test, recording what arrives.
 * Every server tracks its sockets so close() never waits on a stalled connection.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { GatewayHandle } from "../../src/gateway/gateway.ts";

export interface Recorded {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: Buffer;
}

export type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => void | Promise<void>;

export interface FakeServer {
  readonly id: string;
  readonly port: number;
  readonly url: string;
  readonly requests: Recorded[];
  hits(path: string): number;
  /** Route handlers by "METHOD /path"; unmatched routes answer 404. */
  routes: Map<string, Handler>;
  /** Stops listening and cuts every open connection. */
  close(): Promise<void>;
  /** Listens again on the same port (after close). */
  restart(): Promise<void>;
}

export function vllmMetrics(
  o: { waiting?: number; running?: number; kv?: number; model?: string } = {},
): string {
  const m = o.model ?? "m";
  return [
    "# TYPE vllm:num_requests_running gauge",
    `vllm:num_requests_running{engine="0",model_name="${m}"} ${o.running ?? 0}.0`,
    "# TYPE vllm:num_requests_waiting gauge",
    `vllm:num_requests_waiting{engine="0",model_name="${m}"} ${o.waiting ?? 0}.0`,
    "# TYPE vllm:kv_cache_usage_perc gauge",
    `vllm:kv_cache_usage_perc{engine="0",model_name="${m}"} ${o.kv ?? 0.1}`,
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0',
    "",
  ].join("\n");
}

export function modelList(...ids: string[]): string {
  return JSON.stringify({
    object: "list",
    data: ids.map((id) => ({ id, object: "model", owned_by: "vllm" })),
  });
}

export async function startFake(
  init: Record<string, Handler> = {},
  port = 0,
  host = "127.0.0.1",
): Promise<FakeServer> {
  const requests: Recorded[] = [];
  const counts = new Map<string, number>();
  const sockets = new Set<Socket>();
  const routes = new Map<string, Handler>(Object.entries(init));
  let server: Server;
  const make = () => {
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks);
        const path = (req.url ?? "/").split("?")[0];
        requests.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
        counts.set(path, (counts.get(path) ?? 0) + 1);
        const h = routes.get(`${req.method} ${path}`);
        if (!h) {
          res.writeHead(404, { "content-type": "application/json" }).end('{"error":{"message":"no route"}}');
          return;
        }
        Promise.resolve(h(req, res, body)).catch(() => res.destroy());
      });
    });
    server.on("connection", (s: Socket) => {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
    });
  };
  const listen = (p: number) =>
    new Promise<number>((resolve, reject) => {
      make();
      server.once("error", reject);
      server.listen(p, host, () => resolve((server.address() as AddressInfo).port));
    });
  const actual = await listen(port);
  return {
    id: `${host}:${actual}`,
    port: actual,
    url: `http://${host}:${actual}`,
    requests,
    routes,
    hits: (p) => counts.get(p) ?? 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        if (!server.listening) return resolve();
        server.close(() => resolve());
      }),
    restart: async () => {
      await listen(actual);
    },
  };
}

/** Polls `cond` every few ms until true; the test's own timeout bounds the wait. */
export async function waitFor(cond: () => boolean, what = "condition", limitMs = 10_000): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > limitMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Resolves once the gateway's public server holds no client connection (their close events ran). */
export async function connectionsGone(gw: GatewayHandle): Promise<void> {
  const count = () => new Promise<number>((r) => gw.gateway.publicServer.getConnections((_e, n) => r(n)));
  for (let i = 0; i < 1000 && (await count()) > 0; i++) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setImmediate(r));
}
