/**
 * Forwarding one request to a replica, with failover. Endpoints are tried in the scheduler's
 * order; a connection error, a 5xx, or a reset before the first response BODY byte moves on to the
 * next (bounded), reporting the failure. Client headers are held back until the first body byte,
 * so a replica that dies during prefill is retried transparently. After that the response streams
 * through as it arrives (SSE forwarded at event boundaries, with backpressure), and a failure
 * becomes a closing SSE error event or a cut-off JSON response, never a hang. A client disconnect
 * aborts the upstream request. Optionally the body passes through a rewriter (P/D's cached_tokens
 * rewrite), and the last endpoint's 5xx can be passed on verbatim (the P/D sidecar, which has one).
 */
import type { ServerResponse } from "node:http";
import type { Dispatcher, Pool } from "undici";
import type { RequestFailureKind } from "../datalayer/datastore.ts";
import { sseErrorEvent } from "./errors.ts";
import { responseGone } from "./h2c.ts";
import { forwardResponseHeaders } from "./headers.ts";

export interface AttemptFailure {
  endpoint: string;
  kind: RequestFailureKind;
  message: string;
}

export interface ForwardRequest {
  path: string;
  method: string;
  headers: Record<string, string | string[]>;
  body: Buffer;
  /** Endpoint ids, best first. */
  targets: readonly string[];
  maxAttempts: number;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
  res: ServerResponse;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  pool(id: string): Pool;
  /** About to send to `endpoint`; `attempt` counts from 0 (> 0: a failover retry). */
  onAttempt?(endpoint: string, attempt: number): void;
  onAttemptFailed(f: AttemptFailure): void;
  /** First response byte from `endpoint`; it is now the serving endpoint. */
  onStarted(endpoint: string, status: number): void;
  /** Rewrites the response body on its way (SSE: whole events; otherwise chunks); drops Content-Length. */
  rewriter?: ResponseRewriter;
  /** The last endpoint's 5xx goes to the client as is, instead of ending the attempts as "exhausted". */
  passLastError?: boolean;
  /**
   * Mid-stream migration (migrate.ts): after `failed` broke an SSE stream, an upstream on another
   * endpoint that continues it (its chunks go through the same rewriter), or null to give up.
   */
  migrate?(
    failed: string,
    message: string,
  ): Promise<{ endpoint: string; up: Dispatcher.ResponseData } | null>;
}

/** A response-body transform: `start` once before the first chunk, then `chunk` per piece, `end` once. */
export interface ResponseRewriter {
  /** `sse`: the body is an unencoded text/event-stream, and each chunk ends at an event boundary. */
  start(status: number, sse: boolean): void;
  /** What to write for this piece now (may be empty: the rewriter holds it). */
  chunk(b: Buffer): Buffer;
  /** What is left to write once the upstream body ended. */
  end(): Buffer;
}

export type ForwardOutcome =
  | { kind: "completed"; endpoint: string; status: number; bytes: number; failures: AttemptFailure[] }
  | { kind: "failed-midstream"; endpoint: string; status: number; bytes: number; error: string }
  | { kind: "client-gone"; endpoint: string | null }
  | { kind: "exhausted"; failures: AttemptFailure[] };

const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
]);
const TIMEOUT_CODES = new Set(["UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT"]);

export function classify(err: unknown): RequestFailureKind {
  const code = (err as { code?: string }).code ?? "";
  if (CONNECT_CODES.has(code)) return "connect";
  if (TIMEOUT_CODES.has(code)) return "timeout";
  return "reset";
}

const describe = (err: unknown) => {
  const e = err as { code?: string; message?: string };
  return e.code ? `${e.code}: ${e.message}` : String(e.message ?? err);
};

/** Up to the first 2 KiB of an error body, read for at most a second, for the failure message. */
async function errorExcerpt(body: Dispatcher.ResponseData["body"]): Promise<string> {
  let text = "";
  const timer = setTimeout(() => body.destroy(), 1000);
  try {
    for await (const c of body) {
      text += (c as Buffer).toString("utf8");
      if (text.length > 2048) break;
    }
  } catch {
    /* a truncated error body is still an error */
  }
  clearTimeout(timer);
  body.destroy();
  const m = /"message"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(text);
  return (m ? m[1] : text).slice(0, 300);
}

function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

/** End offset of the last complete SSE event in `b` ("\n\n" or "\r\n\r\n"), or -1. */
function lastEventEnd(b: Buffer): number {
  const lf = b.lastIndexOf("\n\n");
  const crlf = b.lastIndexOf("\r\n\r\n");
  return Math.max(lf < 0 ? -1 : lf + 2, crlf < 0 ? -1 : crlf + 4);
}

/** Above this an unterminated SSE tail is passed on as is rather than held. */
const MAX_PENDING = 1 << 20;

type Body = Dispatcher.ResponseData["body"];

/**
 * The body's first chunk, or null for an empty body; rejects on an error before it. The body is
 * left paused with nothing consumed beyond that chunk.
 */
function firstChunk(body: Body): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const done = () => {
      body.off("data", onData);
      body.off("end", onEnd);
      body.off("error", onError);
      body.off("close", onClose);
    };
    const onData = (c: Buffer) => {
      body.pause();
      done();
      resolve(c);
    };
    const onEnd = () => {
      done();
      resolve(null);
    };
    const onError = (err: Error) => {
      done();
      reject(err);
    };
    const onClose = () => {
      done();
      if (body.readableEnded) resolve(null);
      else reject(new Error("the response body closed before its end"));
    };
    body.on("data", onData);
    body.once("end", onEnd);
    body.once("error", onError);
    body.once("close", onClose);
    settledAlready(body, onEnd, onError);
  });
}

/** A body that ended or failed before anyone listened settles at once (its events are past). */
function settledAlready(body: Body, onEnd: () => void, onError: (err: Error) => void): void {
  if (body.readableEnded) onEnd();
  else if (body.errored) onError(body.errored);
  else if (body.destroyed) onError(new Error("the response body closed before its end"));
}

/**
 * Reads `body` to its end, handing each chunk to `onChunk` as it arrives (no promise per chunk:
 * one relayed token is one chunk); while `onChunk` answers "wait", the body is paused until
 * `resumeWhen` settles. `onChunk` answering "stop" ends the read early (resolves false).
 * Resolves true at the body's end; rejects on its error.
 */
function pump(
  body: Body,
  onChunk: (b: Buffer) => "more" | "wait" | "stop",
  resumeWhen: () => Promise<void>,
): Promise<boolean> {
  return new Promise((resolve, reject) => {
    let settled = false;
    const settle = (f: () => void) => {
      if (settled) return;
      settled = true;
      body.off("data", onData);
      body.off("end", onEnd);
      body.off("error", onError);
      body.off("close", onClose);
      f();
    };
    const onData = (c: Buffer) => {
      const next = onChunk(c);
      if (next === "more") return;
      if (next === "stop") return settle(() => resolve(false));
      body.pause();
      void resumeWhen().then(() => {
        if (!settled) body.resume();
      });
    };
    const onEnd = () => settle(() => resolve(true));
    const onError = (err: Error) => settle(() => reject(err));
    const onClose = () =>
      settle(() =>
        body.readableEnded ? resolve(true) : reject(new Error("the response body closed before its end")),
      );
    body.on("data", onData);
    body.once("end", onEnd);
    body.once("error", onError);
    body.once("close", onClose);
    settledAlready(body, onEnd, onError);
    if (!settled) body.resume();
  });
}

export async function forward(r: ForwardRequest): Promise<ForwardOutcome> {
  const failures: AttemptFailure[] = [];
  const fail = (endpoint: string, kind: RequestFailureKind, message: string) => {
    const f = { endpoint, kind, message };
    failures.push(f);
    r.onAttemptFailed(f);
  };
  const targets = r.targets.slice(0, Math.max(1, r.maxAttempts));
  for (let attempt = 0; attempt < targets.length; attempt++) {
    const id = targets[attempt]!;
    if (r.signal.aborted) return { kind: "client-gone", endpoint: null };
    r.onAttempt?.(id, attempt);
    let up: Dispatcher.ResponseData;
    try {
      up = await r.pool(id).request({
        path: r.path,
        method: r.method as Dispatcher.HttpMethod,
        headers: r.headers,
        body: r.body,
        signal: r.signal,
        headersTimeout: r.headersTimeoutMs,
        bodyTimeout: r.bodyTimeoutMs,
      });
    } catch (err) {
      if (r.signal.aborted) return { kind: "client-gone", endpoint: null };
      fail(id, classify(err), describe(err));
      continue;
    }
    up.body.on("error", () => {}); // errors surface through firstChunk() and pump()
    if (up.statusCode >= 500 && !(r.passLastError && attempt === targets.length - 1)) {
      fail(id, "status", `HTTP ${up.statusCode}: ${await errorExcerpt(up.body)}`);
      continue;
    }
    let first: Buffer | null;
    try {
      first = await firstChunk(up.body);
    } catch (err) {
      if (r.signal.aborted) return { kind: "client-gone", endpoint: null };
      fail(id, classify(err), `before the first byte: ${describe(err)}`);
      continue;
    }
    r.onStarted(id, up.statusCode);
    return stream(r, id, up, first, failures);
  }
  return { kind: "exhausted", failures };
}

async function stream(
  r: ForwardRequest,
  id: string,
  up: Dispatcher.ResponseData,
  first: Buffer | null,
  failures: AttemptFailure[],
): Promise<ForwardOutcome> {
  const { res } = r;
  // Event boundaries are only visible in an unencoded stream; a compressed one passes through opaque.
  const encoding = String(up.headers["content-encoding"] ?? "identity").toLowerCase();
  const sse =
    String(up.headers["content-type"] ?? "").startsWith("text/event-stream") && encoding === "identity";
  const rw = r.rewriter;
  const headers = forwardResponseHeaders(up.headers);
  if (rw) {
    delete headers["content-length"]; // the rewritten body's length differs
    rw.start(up.statusCode, sse);
  }
  res.writeHead(up.statusCode, headers);
  let bytes = 0;
  let pending: Buffer | null = null;
  // The last two pieces written, for the end of the stream a failure is judged by.
  let last: Buffer | null = null;
  let beforeLast: Buffer | null = null;
  /** Writes a piece to the client; false when the client's buffer is full (wait for 'drain'). */
  const write = (raw: Buffer): boolean => {
    const b = rw ? rw.chunk(raw) : raw;
    if (b.length === 0) return true;
    bytes += b.length;
    beforeLast = last;
    last = b;
    return res.write(b);
  };
  /** SSE goes out at event boundaries: a partial event is held until its end arrives. */
  const push = (chunk: Buffer): boolean => {
    if (!sse) return write(chunk);
    const data = pending ? Buffer.concat([pending, chunk]) : chunk;
    const end = lastEventEnd(data);
    if (end < 0 && data.length < MAX_PENDING) {
      pending = data;
      return true;
    }
    const cut = end < 0 ? data.length : end;
    pending = cut < data.length ? data.subarray(cut) : null;
    return write(cut === data.length ? data : data.subarray(0, cut));
  };
  let gone = false;
  const onChunk = (chunk: Buffer): "more" | "wait" | "stop" => {
    const room = push(chunk);
    if (responseGone(res)) {
      gone = true;
      return "stop";
    }
    return room ? "more" : "wait";
  };
  const status = up.statusCode;
  for (;;) {
    try {
      if (first !== null) {
        const next = onChunk(first);
        first = null;
        // The headers go out in one write with the first whole event; only a first chunk held
        // for its event's end sends them alone, so the client sees the response start meanwhile.
        if (sse && bytes === 0 && !gone) res.flushHeaders();
        if (next === "wait") await drained(res);
      }
      if (!gone) await pump(up.body, onChunk, () => drained(res));
      if (gone) {
        up.body.destroy();
        return { kind: "client-gone", endpoint: id };
      }
      break;
    } catch (err) {
      if (r.signal.aborted || responseGone(res)) return { kind: "client-gone", endpoint: id };
      const message = `upstream ${id} failed mid-response: ${describe(err)}`;
      const resumed = sse && r.migrate ? await r.migrate(id, message) : null;
      if (resumed === null)
        return failedMidstream(r, sse, tailOf(beforeLast, last), id, status, bytes, message);
      // The dead upstream's partial event is dropped; the new one continues after the last whole one.
      pending = null;
      id = resumed.endpoint;
      up = resumed.up;
      up.body.on("error", () => {});
    }
  }
  if (pending) write(pending);
  const rest = rw?.end();
  if (rest?.length) {
    bytes += rest.length;
    res.write(rest);
  }
  res.end();
  return { kind: "completed", endpoint: id, status, bytes, failures };
}

/** The last 32 bytes written, as text. */
function tailOf(beforeLast: Buffer | null, last: Buffer | null): string {
  if (last === null) return "";
  const t = last.length >= 32 || beforeLast === null ? last : Buffer.concat([beforeLast, last]);
  return t.subarray(-32).toString("latin1");
}

function failedMidstream(
  r: ForwardRequest,
  sse: boolean,
  tail: string,
  id: string,
  status: number,
  bytes: number,
  message: string,
): ForwardOutcome {
  const { res } = r;
  if (sse) {
    // A partial event is dropped: the client's parser would choke on it.
    if (!/data: ?\[DONE\]\s*$/.test(tail)) res.write(sseErrorEvent(message));
    res.end();
  } else {
    res.destroy(); // a truncated body the client sees as an error, not a hang
  }
  return { kind: "failed-midstream", endpoint: id, status, bytes, error: message };
}
