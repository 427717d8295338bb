/**
 * Test doubles for the Envoy-like proxy: a scripted ext_proc server (grpc-js, Envoy's own protos via
 * src/bench/ext-proc/protos.ts) that records every message it receives, and a plain HTTP backend
 * that records what reaches it and answers with JSON or an SSE stream.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { extProcProtocol, type ProcessingResponse } from "../../src/bench/ext-proc/protos.ts";

// biome-ignore lint/suspicious/noExplicitAny: decoded protobuf messages are checked by assertions
export type Msg = any;
export type Stream = grpc.ServerDuplexStream<Msg, ProcessingResponse>;

export interface FakeExtProc {
  address: string;
  /** Every stream's received messages, in order. */
  streams: Msg[][];
  /** Streams that ended by the client cancelling. */
  cancelled: number;
  close(): Promise<void>;
}

/** Starts an ext_proc server; `onStream` drives each stream (it gets the stream and its message log). */
export async function startFakeExtProc(
  onStream: (call: Stream, received: Msg[], next: () => Promise<Msg | null>) => unknown,
): Promise<FakeExtProc> {
  const { Client } = extProcProtocol();
  const server = new grpc.Server();
  const fake: FakeExtProc = { address: "", streams: [], cancelled: 0, close: async () => {} };
  server.addService(Client.service, {
    Process: (call: Stream) => {
      const received: Msg[] = [];
      fake.streams.push(received);
      const queue: Msg[] = [];
      const waiters: ((m: Msg | null) => void)[] = [];
      let ended = false;
      call.on("data", (m: Msg) => {
        received.push(m);
        const w = waiters.shift();
        if (w) w(m);
        else queue.push(m);
      });
      const end = () => {
        ended = true;
        for (const w of waiters.splice(0)) w(null);
      };
      call.on("end", end);
      call.on("cancelled", () => {
        fake.cancelled++;
        end();
      });
      call.on("error", end);
      const next = () =>
        new Promise<Msg | null>((resolve) => {
          if (queue.length) resolve(queue.shift());
          else if (ended) resolve(null);
          else waiters.push(resolve);
        });
      void Promise.resolve(onStream(call, received, next)).catch(() => {});
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) =>
      e ? reject(e) : resolve(p),
    ),
  );
  fake.address = `127.0.0.1:${port}`;
  fake.close = () => new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
  return fake;
}

/** Reads messages until one of `kind` with end_of_stream (body) arrives; returns them all. */
export async function readUntilEos(next: () => Promise<Msg | null>, kind: string): Promise<Msg[]> {
  const out: Msg[] = [];
  for (;;) {
    const m = await next();
    if (!m) return out;
    out.push(m);
    if (m.request === kind && m[kind].end_of_stream) return out;
    if (m.request === kind.replace("_body", "_headers") && m[m.request].end_of_stream) return out;
  }
}

/** A header as a HeaderValueOption with raw_value, as an EPP writes it. */
export const setHeader = (key: string, value: string) => ({ header: { key, raw_value: Buffer.from(value) } });

/** The headers of a received request_headers / response_headers message as a plain object. */
export function headersOf(m: Msg): Record<string, string> {
  const h = (m.request_headers ?? m.response_headers).headers.headers as Msg[];
  return Object.fromEntries(h.map((e) => [e.key, Buffer.from(e.raw_value ?? []).toString()]));
}

/** Concatenated bodies of request_body / response_body messages. */
export function bodyOf(msgs: Msg[], kind: string): Buffer {
  return Buffer.concat(msgs.filter((m) => m.request === kind).map((m) => Buffer.from(m[kind].body ?? [])));
}

/** streamed_response body replies for `body`, split in `parts` chunks, the last with end_of_stream. */
export function streamedReplies(kind: "request_body" | "response_body", body: Buffer, parts = 2) {
  const size = Math.ceil(body.length / parts) || 1;
  const out: ProcessingResponse[] = [];
  for (let i = 0; i < Math.max(parts, 1); i++) {
    const chunk = body.subarray(i * size, (i + 1) * size);
    out.push({
      [kind]: {
        response: {
          body_mutation: { streamed_response: { body: chunk, end_of_stream: i === parts - 1 } },
        },
      },
    } as ProcessingResponse);
  }
  return out;
}

export interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

export interface FakeBackend {
  endpoint: string;
  seen: SeenRequest[];
  close(): Promise<void>;
}

/** An HTTP backend; `respond` writes the answer (default: JSON echo of what it got). */
export async function startBackend(
  respond?: (req: SeenRequest, res: ServerResponse) => void,
): Promise<FakeBackend> {
  const seen: SeenRequest[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const r = {
        method: req.method!,
        url: req.url!,
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      };
      seen.push(r);
      if (respond) return respond(r, res);
      const out = JSON.stringify({ echo: r.body.length, path: r.url });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
      res.end(out);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  return {
    endpoint: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
