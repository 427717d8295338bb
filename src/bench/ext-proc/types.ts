/**
 * Types shared by the Envoy-like proxy's pieces: the body mode, the Process stream, the counters the
 * proxy keeps (what Envoy's ext_proc filter counts as stats) and what an exchange needs from it.
 */
import type { ClientDuplexStream } from "@grpc/grpc-js";
import type { Dispatcher } from "undici";
import type { ProcessingResponse } from "./protos.ts";

export type BodyMode = "FULL_DUPLEX_STREAMED" | "BUFFERED";
export type ExtProcCall = ClientDuplexStream<object, ProcessingResponse>;

export interface ProxyStats {
  requests: number;
  streamsStarted: number;
  overflows: number;
  /** Requests that went on without ext_proc (fail-open, or the server closed the stream cleanly). */
  bypassed: number;
  spurious: number;
  grpcErrors: number;
  timeouts: number;
  immediateResponses: number;
  clientAborts: number;
}

export interface ExchangeEnv {
  mode: BodyMode;
  failOpen: boolean;
  /** Next fail-open backend (`ip:port`), or null when none are configured. */
  fallback(): string | null;
  messageTimeoutMs: number;
  deferredCloseMs: number;
  dispatcher: Dispatcher;
  /** Opens a Process stream; "overflow" at the concurrent-stream cap, "unhealthy" when known down. */
  openStream(): ExtProcCall | "overflow" | "unhealthy";
  stats: ProxyStats;
  log(line: string): void;
}
