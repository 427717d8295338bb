/**
 * An Envoy-like HTTP/1.1 proxy for tests and the bench, since no Envoy binary can be had here: every
 * request opens an `envoy.service.ext_proc.v3.ExternalProcessor/Process` stream (grpc-js, from
 * Envoy's own protos: protos.ts), is processed as Envoy's ext_proc filter would (exchange.ts) and is
 * forwarded with undici to the `ip:port` the processor put in `x-gateway-destination-endpoint`
 * (upstream.ts), the llm-d reference Envoy's ORIGINAL_DST routing.
 *
 * Also as in Envoy: `x-request-id` is added when absent (the connection manager does it before any
 * filter runs); `failOpen` is `failure_mode_allow` (here the request then goes to the next of
 * `failOpenBackends`, standing in for the gateway's own pool routing, since there is no destination
 * header); and `maxStreams` is the ext_proc cluster's circuit breaker (`max_requests`, Envoy's default
 * 1,024): one stream more fails to open, and the request gets a 500 or fails open. A processor the
 * channel knows is down (TRANSIENT_FAILURE) is the health-checked cluster with no healthy host: the
 * stream fails to open too. Otherwise a connection failure arrives as a gRPC error once the body is
 * on its way, and in FULL_DUPLEX_STREAMED that is a 500 even with failOpen, as in Envoy.
 *
 * Not modelled: per-route overrides, mode_override, observability mode, request/response attributes,
 * CONTINUE_AND_REPLACE, trailers (HTTP/1 clients and vLLM send none), retries to fallback endpoints.
 */
import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { Agent } from "undici";
import { Exchange } from "./exchange.ts";
import { requestHeaderList } from "./headers.ts";
import { extProcProtocol } from "./protos.ts";
import type { BodyMode, ExtProcCall, ProxyStats } from "./types.ts";

export interface EnvoyLikeProxyOptions {
  /** The ext_proc server, `host:port`. */
  extProc: string;
  /** TLS to the ext_proc server without verifying its certificate, as the llm-d reference Envoy does
   *  against the EPP's self-signed one. Default false (plaintext). */
  tls?: boolean;
  /** Body mode for requests and responses. Default FULL_DUPLEX_STREAMED (what llm-d's EPP supports). */
  mode?: BodyMode;
  /** `failure_mode_allow`. Default false (FailClose: 500). */
  failOpen?: boolean;
  /** Where fail-open requests go, round-robin (`ip:port`). */
  failOpenBackends?: string[];
  /** Concurrent ext_proc streams allowed (the cluster circuit breaker). Default 1024, Envoy's default. */
  maxStreams?: number;
  /** Per-message timeout in BUFFERED mode. Default 200 ms, Envoy's `message_timeout` default. */
  messageTimeoutMs?: number;
  /** How long a half-closed stream may linger before it is cancelled. Default 5000 ms, as Envoy. */
  deferredCloseMs?: number;
  /** Listen address; port 0 (default) picks a free one. */
  host?: string;
  port?: number;
  log?: (line: string) => void;
}

export interface EnvoyLikeProxy {
  url: string;
  port: number;
  stats: ProxyStats;
  /** ext_proc streams open right now. */
  activeStreams(): number;
  close(): Promise<void>;
}

/** Starts the proxy; `await proxy.close()` when done. */
export async function startEnvoyLikeProxy(opts: EnvoyLikeProxyOptions): Promise<EnvoyLikeProxy> {
  const { Client } = extProcProtocol();
  const creds = opts.tls
    ? grpc.credentials.createSsl(null, null, null, { rejectUnauthorized: false })
    : grpc.credentials.createInsecure();
  const client = new Client(opts.extProc, creds, {
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    // SNI cannot be an IP address (RFC 6066); the name is not checked anyway.
    ...(opts.tls ? { "grpc.ssl_target_name_override": "kvgate-epp" } : {}),
  });
  const maxStreams = opts.maxStreams ?? 1024;
  const stats: ProxyStats = {
    requests: 0,
    streamsStarted: 0,
    overflows: 0,
    bypassed: 0,
    spurious: 0,
    grpcErrors: 0,
    timeouts: 0,
    immediateResponses: 0,
    clientAborts: 0,
  };
  let active = 0;
  let next = 0;
  const backends = opts.failOpenBackends ?? [];
  const dispatcher = new Agent({ connections: 256, keepAliveTimeout: 10_000 });
  const log = opts.log ?? (() => {});

  const channel = client.getChannel();
  const openStream = (): ExtProcCall | "overflow" | "unhealthy" => {
    if (active >= maxStreams) return "overflow";
    // A processor the channel already knows is down stands for Envoy's health-checked ext_proc
    // cluster with no healthy host: the stream fails to open, before any body is sent.
    if (channel.getConnectivityState(false) === grpc.connectivityState.TRANSIENT_FAILURE) return "unhealthy";
    active++;
    stats.streamsStarted++;
    const call = (client as unknown as { Process(): ExtProcCall }).Process();
    let open = true;
    call.on("status", () => {
      if (open) active--;
      open = false;
    });
    return call;
  };

  const server: Server = createServer((req, res) => {
    stats.requests++;
    const headers = requestHeaderList(req.method ?? "GET", req.url ?? "/", req.rawHeaders);
    if (!headers.has("x-request-id")) headers.set("x-request-id", [randomUUID()]);
    const exchange = new Exchange(
      {
        mode: opts.mode ?? "FULL_DUPLEX_STREAMED",
        failOpen: opts.failOpen ?? false,
        fallback: () => (backends.length ? backends[next++ % backends.length]! : null),
        messageTimeoutMs: opts.messageTimeoutMs ?? 200,
        deferredCloseMs: opts.deferredCloseMs ?? 5000,
        dispatcher,
        openStream,
        stats,
        log,
      },
      req,
      res,
      headers,
    );
    exchange.start();
  });
  server.keepAliveTimeout = 10_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    // A deep accept queue: thousands of clients may connect at once (the cap demonstration).
    server.listen({ port: opts.port ?? 0, host: opts.host ?? "127.0.0.1", backlog: 8192 }, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://${opts.host ?? "127.0.0.1"}:${port}`,
    port,
    stats,
    activeStreams: () => active,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      client.close();
      await dispatcher.close();
    },
  };
}
