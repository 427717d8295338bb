/**
 * The cheapest client that still checks the answer: one raw TCP connection per streaming request
 * (HTTP/1.1, `connection: close`), the status line parsed, the body scanned for SSE `data:` events
 * and the final `data: [DONE]`. bench:streams opens thousands of these at once, so it keeps no body
 * beyond what a non-200 answer needs for its error JSON. streamRequestH2 is the same check for one
 * stream of a shared HTTP/2 connection.
 */
import { type ClientHttp2Session, type ClientHttp2Stream, constants } from "node:http2";
import { connect } from "node:net";

export interface StreamResult {
  /** HTTP status, or 0 when the connection failed before a status line. */
  status: number;
  /** The response ended with `data: [DONE]` (a complete SSE stream). */
  done: boolean;
  /** SSE data events seen, [DONE] excluded. */
  events: number;
  /** The body of a non-200 answer (an OpenAI error JSON), cut at 4 KB. */
  errorBody: string;
  /** Connection or protocol error, if any. */
  error: string | null;
  startedAt: number;
  firstByteAt: number;
  endedAt: number;
}

export interface StreamHooks {
  /** The status line arrived (the stream is open from the client's point of view). */
  onHead?: (status: number) => void;
}

function newResult(): StreamResult {
  return {
    status: 0,
    done: false,
    events: 0,
    errorBody: "",
    error: null,
    startedAt: performance.now(),
    firstByteAt: 0,
    endedAt: 0,
  };
}

/**
 * A body reader for `r`: an error body is kept (4 KiB at most); a 200 body is scanned for SSE events
 * and the `[DONE]` marker, judged once all 12 bytes of "data: [DONE]" could be seen (the unjudged end
 * is carried to the next chunk).
 */
function bodyScanner(r: StreamResult): (chunk: string) => void {
  let tail = "";
  return (chunk) => {
    if (r.status !== 200) {
      if (r.errorBody.length < 4096) r.errorBody += chunk.slice(0, 4096 - r.errorBody.length);
      return;
    }
    const text = tail + chunk;
    let from = 0;
    for (let i = text.indexOf("data: "); i >= 0 && i + 12 <= text.length; i = text.indexOf("data: ", from)) {
      if (text.startsWith("data: [DONE]", i)) r.done = true;
      else r.events++;
      from = i + 6;
    }
    tail = text.slice(Math.max(from, text.length - 11));
  };
}

export function streamRequest(
  port: number,
  path: string,
  body: string,
  hooks: StreamHooks = {},
  timeoutMs = 600_000,
): Promise<StreamResult> {
  return new Promise((resolve) => {
    const r = newResult();
    let head = "";
    let inBody = false;
    const s = connect({ host: "127.0.0.1", port });
    s.setNoDelay(true);
    s.setTimeout(timeoutMs, () => s.destroy(new Error(`no byte for ${timeoutMs} ms`)));
    s.setEncoding("latin1");
    s.on("connect", () => {
      s.write(
        `POST ${path} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\n` +
          `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    });
    const scan = bodyScanner(r);
    s.on("data", (chunk: string) => {
      if (!r.firstByteAt) r.firstByteAt = performance.now();
      if (inBody) return scan(chunk);
      head += chunk;
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(head);
      r.status = m ? Number(m[1]) : 0;
      inBody = true;
      hooks.onHead?.(r.status);
      const rest = head.slice(end + 4);
      head = "";
      scan(rest);
    });
    s.on("error", (e) => {
      r.error ??= e.message;
    });
    s.on("close", () => {
      r.endedAt = performance.now();
      resolve(r);
    });
  });
}

/**
 * The same request as one stream of a shared HTTP/2 connection (h2c prior knowledge, as the
 * gateway's public port accepts it): `--http2` runs thousands of these over a few sessions.
 */
export function streamRequestH2(
  session: ClientHttp2Session,
  path: string,
  body: string,
  hooks: StreamHooks = {},
  timeoutMs = 600_000,
): Promise<StreamResult> {
  return new Promise((resolve) => {
    const r = newResult();
    let s: ClientHttp2Stream;
    try {
      s = session.request({ ":method": "POST", ":path": path, "content-type": "application/json" });
    } catch (e) {
      r.error = (e as Error).message;
      r.endedAt = performance.now();
      return resolve(r);
    }
    s.setTimeout(timeoutMs, () => s.close(constants.NGHTTP2_CANCEL));
    s.setEncoding("latin1");
    s.on("response", (h) => {
      r.firstByteAt = performance.now();
      r.status = Number(h[":status"]);
      hooks.onHead?.(r.status);
    });
    s.on("data", bodyScanner(r));
    s.on("error", (e) => {
      r.error ??= e.message;
    });
    s.on("close", () => {
      if (s.rstCode && s.rstCode !== constants.NGHTTP2_NO_ERROR)
        r.error ??= `stream reset (code ${s.rstCode})`;
      r.endedAt = performance.now();
      resolve(r);
    });
    s.end(body);
  });
}
