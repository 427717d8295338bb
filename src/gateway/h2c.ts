/**
 * HTTP/2 over cleartext with prior knowledge ("h2c", RFC 9113 §3.3) on the same port as HTTP/1.1.
 * Each new connection of the public node:http server is held until its first bytes show which
 * protocol it speaks: the HTTP/2 connection preface goes to a node:http2 server (its compatibility
 * API hands the same request handler an Http2ServerRequest/Http2ServerResponse), anything else to
 * node:http as before. Many streams then share one client connection, so a gateway holds one
 * socket per stream (its upstream) instead of two. No h2c Upgrade (RFC 9113 removed it) and no TLS.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import {
  createServer as createHttp2Server,
  type Http2Server,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from "node:http2";
import type { Socket } from "node:net";

/** The client connection preface every HTTP/2 connection starts with (RFC 9113 §3.4). */
export const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** Concurrent streams one HTTP/2 connection may open (SETTINGS_MAX_CONCURRENT_STREAMS). */
export const H2_MAX_CONCURRENT_STREAMS = 1000;

export interface H2cFront {
  readonly http2: Http2Server;
  /** Open HTTP/2 sessions (each is one client connection). */
  readonly sessions: ReadonlySet<ServerHttp2Session>;
  /** GOAWAY to every session: streams in flight finish, no new ones start. */
  closeSessions(): void;
}

/**
 * Makes `server` (before it listens, and before other 'connection' listeners are added) accept
 * h2c prior-knowledge connections too, handled by `handler`. A connection that sends nothing for
 * `peekTimeoutMs` is closed (node:http's headers timeout only starts once it has it).
 */
export function acceptH2c(
  server: Server,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  peekTimeoutMs: number,
): H2cFront {
  const http2 = createHttp2Server(
    { settings: { maxConcurrentStreams: H2_MAX_CONCURRENT_STREAMS } },
    // The compatibility objects are used where node:http's are; the differences that matter
    // (connection headers, the socket) are handled where they arise (isHttp2 below).
    handler as unknown as Parameters<typeof createHttp2Server>[1],
  );
  const sessions = new Set<ServerHttp2Session>();
  http2.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
    s.on("error", () => {}); // a broken client connection ends only its own streams
  });
  const http1 = server.listeners("connection") as Array<(s: Socket) => void>;
  server.removeAllListeners("connection");
  server.on("connection", (socket: Socket) => {
    let seen: Buffer = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), peekTimeoutMs);
    const hand = (h2: boolean) => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("error", onError);
      socket.pause();
      socket.unshift(seen);
      if (h2) http2.emit("connection", socket);
      else {
        for (const l of http1) l.call(server, socket);
        socket.resume(); // node:http reads the peeked bytes back from the stream buffer
      }
    };
    const onData = (chunk: Buffer) => {
      seen = seen.length ? Buffer.concat([seen, chunk]) : chunk;
      const n = Math.min(seen.length, H2_PREFACE.length);
      if (!seen.subarray(0, n).equals(H2_PREFACE.subarray(0, n))) hand(false);
      else if (n === H2_PREFACE.length) hand(true);
    };
    const onError = () => clearTimeout(timer);
    socket.on("data", onData);
    socket.on("error", onError);
  });
  return {
    http2,
    sessions,
    closeSessions: () => {
      for (const s of sessions) s.close();
    },
  };
}

/** True for a response of the HTTP/2 compatibility API. */
export function isHttp2(res: ServerResponse): boolean {
  return (res as unknown as { stream?: unknown }).stream !== undefined;
}

const streamOf = (res: ServerResponse) => (res as unknown as { stream: ServerHttp2Stream }).stream;

/**
 * True once the client can no longer get this response: `res.destroyed` for HTTP/1.1; an
 * Http2ServerResponse has no `destroyed`, its stream does (closed, or reset by the client).
 */
export function responseGone(res: ServerResponse): boolean {
  return isHttp2(res) ? streamOf(res).destroyed : res.destroyed;
}

/**
 * On 'close': true when the response did not go out whole (the client left first). An
 * Http2ServerResponse reports `writableFinished` on every close, even after a reset (RST_STREAM).
 */
export function closedEarly(res: ServerResponse): boolean {
  return isHttp2(res) ? !res.writableEnded || streamOf(res).aborted : !res.writableFinished;
}

/** HTTP/2's `connection: close`: a GOAWAY to `res`'s session once `res`'s stream closed. */
export function closeSessionAfter(res: ServerResponse): void {
  const session = streamOf(res).session; // a closed stream no longer names its session
  res.once("close", () => {
    if (!session || session.closed) return;
    session.goaway(); // the client learns now that no new stream is taken; close() waits for the rest
    session.close();
  });
}

/** Headers HTTP/2 forbids in a message (RFC 9113 §8.2.2); node:http2 refuses to send them. */
const CONNECTION_SPECIFIC = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
]);

/** `headers` without the connection-specific ones when `res` is HTTP/2; as is otherwise. */
export function headersFor<T extends Record<string, unknown>>(res: ServerResponse, headers: T): T {
  if (!isHttp2(res)) return headers;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(headers)) if (!CONNECTION_SPECIFIC.has(k.toLowerCase())) out[k] = v;
  return out as T;
}
