/**
 * One HTTP request through the Envoy-like proxy: the ext_proc filter's state machine as Envoy runs it
 * (envoyproxy/envoy `source/extensions/filters/http/ext_proc/ext_proc.cc`, `processor_state.cc`),
 * for request/response header mode SEND, trailer mode SEND and body mode FULL_DUPLEX_STREAMED or
 * BUFFERED in both directions.
 *
 * FULL_DUPLEX_STREAMED: headers go out at once and body chunks follow as they arrive, without waiting
 * for the header response (the last with end_of_stream, or an empty end_of_stream chunk when the
 * length was unknown); the request is forwarded only when the header response comes, and the
 * upstream body is exactly what the processor returns in `streamed_response` chunks (the originals are
 * drained). No per-message timer runs in this mode. Failure-open is allowed only until body data has
 * been sent, since drained bytes cannot be replayed (`Filter::failureModeAllow`).
 * BUFFERED: the header response is awaited before the whole body is sent as one message; the body
 * response may mutate the held headers and replace the body; each message has `messageTimeoutMs`.
 *
 * A reply of the wrong kind for the current state is "spurious": a 500 (or, with failOpen, ext_proc is
 * ignored from then on). A gRPC error is a 500 (or fail-open), a timeout a 504, a clean close by the
 * server means "carry on without ext_proc", and `immediate_response` is sent to the client at any point
 * (a reset if the response had already started). Response headers carry
 * `metadata_context.filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]`.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { PassThrough } from "node:stream";
import {
  applyHeaderMutation,
  first,
  type HeaderList,
  responseHeaderList,
  toHttp1Headers,
} from "./headers.ts";
import type { ImmediateResponse, ProcessingResponse } from "./protos.ts";
import { interpret } from "./replies.ts";
import { Side } from "./side.ts";
import type { ExchangeEnv, ExtProcCall } from "./types.ts";
import { destinationOf, localResponse, SERVED_KEY, sendUpstream, type UpstreamResponse } from "./upstream.ts";

/** processing: ext_proc drives; bypass: carry on without it; done: a reply was sent or the client left. */
type Phase = "processing" | "bypass" | "done";

export class Exchange {
  #phase: Phase = "processing";
  #call: ExtProcCall | null = null;
  readonly #req: Side;
  #res: Side | null = null;
  #upBody: PassThrough | null = null;
  #upStarted = false;
  #upResponse: UpstreamResponse | null = null;
  #headWritten = false;
  readonly #abort = new AbortController();

  constructor(
    private readonly env: ExchangeEnv,
    private readonly client: IncomingMessage,
    private readonly reply: ServerResponse,
    headers: HeaderList,
  ) {
    const cl = first(headers, "content-length");
    const chunked = headers.has("transfer-encoding");
    const noBody = !chunked && (cl === undefined || Number(cl) === 0);
    const expected = chunked ? null : Number(cl ?? 0);
    this.#req = new Side("request", env, headers, noBody, expected, () => this.#onTimeout());
  }

  start(): void {
    this.reply.on("close", () => {
      if (this.reply.writableFinished || this.#phase === "done") return;
      this.env.stats.clientAborts++;
      this.#terminate();
    });
    this.client.on("data", (c: Buffer) => this.#onClientChunk(c));
    this.client.on("end", () => this.#onClientChunk(null));
    const call = this.env.openStream();
    if (typeof call === "string") {
      if (call === "overflow") this.env.stats.overflows++;
      const why = call === "overflow" ? "upstream overflow" : "no healthy upstream";
      this.#failure(500, `ext_proc_error_gRPC_error_14{${why}}`);
      return;
    }
    this.#call = call;
    call.on("data", (m: ProcessingResponse) => this.#onMessage(m));
    call.on("error", (e: Error & { code?: number }) => {
      this.env.stats.grpcErrors++;
      this.#failure(500, `ext_proc_error_gRPC_error_${e.code ?? 2}{${e.message}}`);
    });
    call.on("status", (s: { code: number }) => {
      if (s.code === 0 && this.#phase === "processing") this.#bypass(); // a clean close: carry on without it
    });
    this.#req.sendHeaders(call, undefined, true);
  }

  #onClientChunk(chunk: Buffer | null): void {
    const eos = this.#req.take(chunk);
    if (eos === null) return;
    if (this.#phase === "done") return;
    if (this.#phase === "bypass") {
      this.#pipeRequest();
      return;
    }
    this.#req.sendBody(this.#call!, eos.chunk, eos.end);
    if (this.env.mode === "BUFFERED" && eos.end && this.#req.state === "idle")
      this.#req.sendBuffered(this.#call!);
  }

  #onMessage(m: ProcessingResponse): void {
    if (this.#phase !== "processing") return;
    const fullDuplex = this.env.mode === "FULL_DUPLEX_STREAMED";
    const { dir, out } = interpret(fullDuplex, m, this.#req, this.#res);
    const res = this.#res;
    switch (out.kind) {
      case "immediate":
        this.env.stats.immediateResponses++;
        this.#immediate(out.response);
        break;
      case "fail":
        if (out.spurious) this.env.stats.spurious++;
        this.#failure(500, out.details, !out.spurious);
        break;
      case "headers":
        if (dir === "request") {
          if (fullDuplex || this.#req.noBody) this.#startUpstream();
          else if (this.#req.complete) this.#req.sendBuffered(this.#call!);
        } else if (fullDuplex || res!.noBody) {
          this.#writeHead();
          if (res!.noBody) this.#finish();
        } else if (res!.complete) res!.sendBuffered(this.#call!);
        break;
      case "chunk":
        if (dir === "request") {
          if (out.body.length) this.#upBody?.write(out.body);
          if (out.end) this.#upBody?.end();
        } else {
          if (out.body.length) this.reply.write(out.body);
          if (out.end) this.#finish();
        }
        break;
      case "body":
        if (dir === "request") this.#startUpstream();
        else {
          this.#writeHead();
          for (const c of res!.buffered) this.reply.write(c);
          this.#finish();
        }
        break;
    }
  }

  #startUpstream(): void {
    if (this.#upStarted) return;
    this.#upStarted = true;
    const req = this.#req;
    let endpoint = destinationOf(req.headers);
    if (!endpoint && this.#phase === "bypass" && this.env.failOpen) endpoint = this.env.fallback();
    if (!endpoint) {
      this.#onUpstream(localResponse(503, "no healthy upstream", null));
      return;
    }
    if (!req.noBody) {
      this.#upBody = new PassThrough();
      if (this.#phase === "bypass" || this.env.mode === "BUFFERED") this.#pipeRequest();
    }
    sendUpstream({
      endpoint,
      headers: req.headers,
      body: this.#upBody,
      drop: this.env.mode === "FULL_DUPLEX_STREAMED" ? ["content-length"] : [],
      dispatcher: this.env.dispatcher,
      signal: this.#abort.signal,
    }).then(
      (r) => this.#onUpstream(r),
      () => this.#reset(),
    );
  }

  /** Moves held request bytes upstream (BUFFERED, or bypass), ending when the client has. */
  #pipeRequest(): void {
    if (!this.#upStarted) {
      this.#startUpstream();
      return;
    }
    const up = this.#upBody;
    if (!up || up.writableEnded) return;
    for (const c of this.#req.drain()) up.write(c);
    if (this.#req.complete) up.end();
  }

  #onUpstream(r: UpstreamResponse): void {
    if (this.#phase === "done") {
      r.body.destroy();
      return;
    }
    this.#upResponse = r;
    const headers = responseHeaderList(r.status, r.headers);
    const cl = first(headers, "content-length");
    const noBody = r.status === 204 || r.status === 304 || first(this.#req.headers, ":method") === "HEAD";
    const expected = cl === undefined ? null : Number(cl);
    const none = noBody || expected === 0;
    const res = new Side("response", this.env, headers, none, expected, () => this.#onTimeout());
    this.#res = res;
    r.body.on("data", (c: Buffer) => this.#onUpstreamChunk(c));
    r.body.on("end", () => this.#onUpstreamChunk(null));
    r.body.on("error", () => this.#reset());
    if (this.#phase === "bypass") {
      this.#pipeResponse();
      return;
    }
    const metadata = r.served
      ? { filter_metadata: { "envoy.lb": { fields: { [SERVED_KEY]: { stringValue: r.served } } } } }
      : undefined;
    res.sendHeaders(this.#call!, metadata);
  }

  #onUpstreamChunk(chunk: Buffer | null): void {
    const res = this.#res!;
    const eos = res.take(chunk);
    if (eos === null || this.#phase === "done") return;
    if (this.#phase === "bypass") {
      this.#pipeResponse();
      return;
    }
    if (res.noBody) return;
    res.sendBody(this.#call!, eos.chunk, eos.end);
    if (this.env.mode === "BUFFERED" && eos.end && res.state === "idle") res.sendBuffered(this.#call!);
  }

  #pipeResponse(): void {
    const res = this.#res;
    if (!res) return;
    this.#writeHead();
    for (const c of res.drain()) this.reply.write(c);
    if (res.complete || res.noBody) this.#finish();
  }

  #writeHead(): void {
    if (this.#headWritten) return;
    this.#headWritten = true;
    const res = this.#res!;
    const drop =
      this.env.mode === "FULL_DUPLEX_STREAMED" && this.#phase === "processing" ? ["content-length"] : [];
    this.reply.writeHead(Number(first(res.headers, ":status") ?? 200), toHttp1Headers(res.headers, drop));
  }

  /** The last message in both directions: end the response and close the stream gracefully. */
  #finish(): void {
    const wasProcessing = this.#phase === "processing";
    this.#phase = "done";
    if (!this.reply.writableEnded) this.reply.end();
    if (wasProcessing) this.#closeStream(false);
  }

  /** A stream failure, spurious message or timeout; `hard` ones (rejected mutations) never fail open. */
  #failure(status: number, details: string, hard = false): void {
    if (this.#phase !== "processing") return;
    const bodySent = this.#req.bodyReceived || (this.#res?.bodyReceived ?? false);
    const allow = this.env.failOpen && !hard && !(this.env.mode === "FULL_DUPLEX_STREAMED" && bodySent);
    if (allow) {
      this.#bypass();
      return;
    }
    this.env.log(`ext_proc: ${details}`);
    this.#localReply(status, Buffer.alloc(0), undefined);
  }

  #immediate(ir: ImmediateResponse): void {
    const code = Number(ir.status?.code ?? 200);
    this.#localReply(
      Number.isInteger(code) && code >= 200 ? code : 200,
      ir.body ?? Buffer.alloc(0),
      ir.headers,
    );
  }

  #localReply(status: number, body: Buffer, mutation: ImmediateResponse["headers"]): void {
    this.#terminate();
    if (this.reply.headersSent) {
      this.reply.destroy();
      return;
    }
    const headers = responseHeaderList(status, body.length ? { "content-type": "text/plain" } : {});
    applyHeaderMutation(headers, mutation, false);
    headers.set("content-length", [String(body.length)]);
    this.reply.writeHead(status, toHttp1Headers(headers));
    this.reply.end(body);
  }

  /** Carry on without ext_proc (fail-open, or the server closed the stream cleanly). */
  #bypass(): void {
    if (this.#phase !== "processing") return;
    this.#phase = "bypass";
    this.env.stats.bypassed++;
    this.#closeStream(true);
    if (this.#upResponse) this.#pipeResponse();
    else this.#pipeRequest();
  }

  #terminate(): void {
    this.#phase = "done";
    this.#closeStream(true);
    this.#abort.abort();
    this.#upResponse?.body.destroy();
  }

  /** Upstream reset mid-response: reset the client, as Envoy does. */
  #reset(): void {
    if (this.#phase === "done") return;
    this.#terminate();
    if (!this.reply.headersSent) this.#localReply(503, Buffer.from("upstream reset"), undefined);
    else this.reply.destroy();
  }

  #closeStream(cancel: boolean): void {
    const call = this.#call;
    if (!call) return;
    this.#call = null;
    this.#req.stopTimer();
    this.#res?.stopTimer();
    call.end();
    if (cancel) {
      call.cancel();
      return;
    }
    setTimeout(() => call.cancel(), this.env.deferredCloseMs).unref();
  }

  /** A BUFFERED message went unanswered for messageTimeoutMs. */
  #onTimeout(): void {
    this.env.stats.timeouts++;
    this.#failure(504, "ext_proc_error_per-message_timeout_exceeded");
  }
}
