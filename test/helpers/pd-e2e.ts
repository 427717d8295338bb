/**
 * End-to-end P/D fixtures with simulated replicas (NixlConnector producer and consumer,
 * pd-replicas.ts): the replicas' metrics read as the Done-when checks need them, and a
 * "header-first relay" in front of a prefiller. The relay answers a POST's status line and headers
 * at once and the body when the prefiller has answered, so a client can leave after the prefill
 * answer has begun and before the decode leg starts: the window between the legs, which against a
 * real prefiller is too short to hit on purpose. With `hold`, POSTs go on to the prefiller only
 * after open(). GETs (metrics, models) pass through.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { request } from "undici";
import type { EndpointSpec } from "../../src/datalayer/endpoints.ts";
import { gauge, histogram } from "../../src/datalayer/prom-accessors.ts";
import { scrapeMetrics, type TestReplica } from "./replica.ts";

export interface Relay {
  id: string;
  port: number;
  /** POSTs received so far. */
  posts: number;
  /** Lets held POSTs go on to the prefiller. */
  open(): void;
  close(): Promise<void>;
}

const readAll = (req: IncomingMessage) =>
  new Promise<Buffer>((resolve) => {
    const parts: Buffer[] = [];
    req.on("data", (c: Buffer) => parts.push(c));
    req.on("end", () => resolve(Buffer.concat(parts)));
  });

export async function headerFirstRelay(target: TestReplica, opts: { hold?: boolean } = {}): Promise<Relay> {
  const sockets = new Set<Socket>();
  let open = () => {};
  const gate = opts.hold ? new Promise<void>((r) => (open = r)) : Promise.resolve();
  const relay: Relay = { id: "", port: 0, posts: 0, open: () => open(), close: async () => {} };
  const server: Server = createServer(async (req, res) => {
    const body = await readAll(req);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.connection;
    if (req.method === "POST") {
      relay.posts++;
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      await gate;
    }
    try {
      const up = await request(`${target.url}${req.url}`, {
        method: req.method as "GET" | "POST",
        headers,
        body: body.length ? body : undefined,
      });
      const text = await up.body.text();
      if (req.method !== "POST")
        res.writeHead(up.statusCode, { "content-type": String(up.headers["content-type"]) });
      res.end(text);
    } catch {
      res.destroy();
    }
  });
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  relay.port = (server.address() as AddressInfo).port;
  relay.id = `127.0.0.1:${relay.port}`;
  relay.close = () =>
    new Promise<void>((r) => {
      for (const s of sockets) s.destroy();
      server.close(() => r());
    });
  return relay;
}

/** An endpoint spec for a loopback server labelled with its llm-d.ai/role. */
export const specFor = (port: number, role: string): EndpointSpec => ({
  id: `127.0.0.1:${port}`,
  host: "127.0.0.1",
  port,
  labels: { "llm-d.ai/role": role },
  kvEvents: null,
});

/** What the Done-when checks read off a replica's /metrics. */
export async function pdMetrics(r: TestReplica) {
  const m = await scrapeMetrics(r.url);
  const src = (source: string) => gauge(m, "vllm:prompt_tokens_by_source_total", { source }) ?? 0;
  return {
    promptTokens: gauge(m, "vllm:prompt_tokens_total") ?? 0,
    externalKv: src("external_kv_transfer"),
    localCompute: src("local_compute"),
    xferCount: histogram(m, "vllm:nixl_xfer_time_seconds")?.count ?? 0,
    xferSeconds: histogram(m, "vllm:nixl_xfer_time_seconds")?.sum ?? 0,
    bytes: histogram(m, "vllm:nixl_bytes_transferred")?.sum ?? 0,
    expired: gauge(m, "vllm:nixl_num_kv_expired_reqs_total") ?? 0,
    failedTransfers: gauge(m, "vllm:nixl_num_failed_transfers_total") ?? 0,
  };
}

/** The model a simulated replica serves. */
export const modelOf = (r: TestReplica) => r.server.opts.servedModelNames[0] as string;
