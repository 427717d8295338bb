/**
 * One ext_proc Process stream = one HTTP request, as llm-d's endpoint picker speaks it
 * (llm-d/llm-d-router@ebab6879 `pkg/epp/handlers/server.go`, `request.go`, `response.go`):
 * request_headers (nothing sent yet, unless the request has no body) → request_body chunks,
 * kept as they arrive and decoded once at the first end_of_stream (later body messages ignored:
 * Envoy can repeat end_of_stream, gateway-api-inference-extension#2988) → the pool the model goes
 * to (the context's: the one pool, or with --pools the one serving the rewritten model) → the
 * decision `kvgate serve` makes (decide.ts) → a request_headers answer carrying the pick, then the body re-sent as
 * streamed_response chunks → response headers, body and trailers observed and passed straight on.
 * Replies keep Envoy's order, headers → body → trailers; messages that arrive while a decision is
 * being made wait their turn. BUFFERED request bodies get one BodyResponse carrying the pick instead.
 * A message out of order ends the stream with a gRPC error saying what went wrong, never the process.
 */
import { randomUUID } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { status as GrpcStatus } from "@grpc/grpc-js";
import type { Rng } from "../../scheduler/rng.ts";
import { type DecideResult, decide } from "../decide.ts";
import { GatewayError } from "../errors.ts";
import type { Gateway } from "../gateway.ts";
import type { RewriteDecision } from "../model-rewrite.ts";
import { type ApiRoute, type ParsedRequest, parseRequestBody, routeOf } from "../request-body.ts";
import { answerResponseBody, answerResponseHeaders, Flight } from "./flight.ts";
import {
  first,
  type Headers,
  immediate,
  readHeaders,
  servedEndpoint,
  setHeader,
  subsetHint,
} from "./messages.ts";
import type { EppStreamMetrics, EppTokenMetrics, StreamOutcome } from "./metrics.ts";
import {
  BodySendMode,
  type HeaderMutation,
  type HttpBody,
  type HttpHeaders,
  type PbStruct,
  type ProcessingRequest,
  type ProcessingResponse,
} from "./proto.ts";
import { answerRequest, BodyCollector, pickMutation } from "./request-answer.ts";

/** Where a decoded request goes: its pool's Gateway and what that pool decides with. */
export interface EppTarget {
  readonly gw: Gateway;
  readonly tokens: EppTokenMetrics;
  /** The InferenceModelRewrite applied to the body's model, if any. */
  readonly rewrite: RewriteDecision | null;
  /** InferenceObjective name → priority; undefined = the pool config's. */
  readonly objectives: ReadonlyMap<string, number> | undefined;
}

/** What a stream needs from the server around it. */
export interface EppContext {
  readonly metrics: EppStreamMetrics;
  readonly rng: Rng;
  readonly maxBodyBytes: number;
  /** Request headers removed on the way to the replica besides the control headers (lower case). */
  strip(): readonly string[];
  /** The pool a decoded request goes to, or the error to answer (e.g. 404 for a model no pool serves). */
  target(parsed: ParsedRequest, headers: Headers): EppTarget | GatewayError;
  /** A ready endpoint for a request kvgate does not decode (no body, or a path it does not parse). */
  anyReady(subset: readonly string[] | null): string | GatewayError;
  shuttingDown(): boolean;
  log(line: string): void;
}

/** How a stream talks back: a message, a clean end, or an end with a gRPC error. */
export interface StreamIo {
  send(r: ProcessingResponse): void;
  end(): void;
  fail(code: GrpcStatus, message: string): void;
}

type Phase =
  | "request-headers"
  | "request-body"
  | "deciding"
  | "request-done"
  | "response"
  | "response-done"
  | "closed";

const EMPTY = Buffer.alloc(0);
const MODE_NAMES = ["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED", "GRPC"];
export class ProcessStream {
  readonly #ctx: EppContext;
  readonly #io: StreamIo;
  #phase: Phase = "request-headers";
  /** Aborted when the stream goes away. */
  readonly #gone = new AbortController();
  #queue: ProcessingRequest[] | null = null;
  #reqMode: number = BodySendMode.FULL_DUPLEX_STREAMED;
  #respMode: number = BodySendMode.FULL_DUPLEX_STREAMED;
  #silent = false;
  #headers: Headers = {};
  #route: ApiRoute | null = null;
  #requestId: string | null = null;
  #meta: Record<string, PbStruct> | undefined;
  #body = new BodyCollector(false);
  #flight: Flight | null = null;
  #t0 = 0;

  constructor(ctx: EppContext, io: StreamIo) {
    this.#ctx = ctx;
    this.#io = io;
    ctx.metrics.active.inc();
  }

  onMessage(m: ProcessingRequest): void {
    if (this.#phase === "closed") return;
    if (this.#queue) {
      this.#queue.push(m);
      return;
    }
    try {
      this.#handle(m);
    } catch (err) {
      this.#internal(err);
    }
  }

  /** The client ended its side (`end`) or the stream is gone (cancelled, error). */
  onClose(clean: boolean): void {
    if (this.#phase === "closed") return;
    // With response_body_mode NONE the response ends when Envoy closes the stream.
    if (clean && this.#phase === "response" && this.#respMode === BodySendMode.NONE) this.#responseEnded();
    const answered = this.#phase === "response-done" || (this.#phase === "request-done" && !this.#flight);
    this.#close(!answered ? "client-disconnect" : this.#flight ? "completed" : "passthrough");
    this.#gone.abort(); // a request still queued by flow control leaves the queue
    this.#flight?.complete(false);
    if (clean) this.#io.end();
  }

  #handle(m: ProcessingRequest) {
    const pc = m.protocol_config;
    if (pc) {
      this.#reqMode = pc.request_body_mode ?? BodySendMode.NONE;
      this.#respMode = pc.response_body_mode ?? BodySendMode.NONE;
    }
    if (m.observability_mode) this.#silent = true;
    if (m.metadata_context?.filter_metadata) this.#meta = m.metadata_context.filter_metadata;
    switch (m.request) {
      case "request_headers":
        return this.#onRequestHeaders(m.request_headers ?? {});
      case "request_body":
        return this.#onRequestBody(m.request_body ?? {});
      case "request_trailers":
        return this.#onRequestTrailers(m);
      case "response_headers":
        return this.#onResponseHeaders(m.response_headers ?? {});
      case "response_body":
        return this.#onResponseBody(m.response_body ?? {});
      case "response_trailers":
        return this.#onResponseTrailers();
      default:
        return this.#protocolError(
          "a ProcessingRequest carried none of request_headers, request_body, request_trailers, response_headers, response_body or response_trailers; check that the proxy speaks envoy.service.ext_proc.v3",
        );
    }
  }

  #send(r: ProcessingResponse) {
    if (!this.#silent) this.#io.send(r);
  }

  #onRequestHeaders(h: HttpHeaders) {
    if (this.#phase !== "request-headers")
      return this.#protocolError(
        "request_headers arrived twice on one stream; each Process stream carries one HTTP request (check the proxy's ext_proc filter)",
      );
    this.#t0 = performance.now();
    this.#headers = readHeaders(h.headers);
    this.#route = routeOf(first(this.#headers, ":path") ?? "/");
    if (!first(this.#headers, "x-request-id")) this.#requestId = randomUUID();
    if (this.#ctx.shuttingDown())
      return this.#reject(
        new GatewayError(
          503,
          "this kvgate epp is shutting down; the proxy should use another endpoint picker",
          {
            reason: "rejected-shutting-down",
          },
        ),
      );
    if (h.end_of_stream || this.#reqMode === BodySendMode.NONE) return this.#passthrough(false, true);
    if (this.#reqMode !== BodySendMode.FULL_DUPLEX_STREAMED && this.#reqMode !== BodySendMode.BUFFERED)
      return this.#protocolError(
        `request_body_mode ${MODE_NAMES[this.#reqMode] ?? this.#reqMode} is not supported: configure the ext_proc filter with request_body_mode FULL_DUPLEX_STREAMED (or BUFFERED)`,
        GrpcStatus.UNIMPLEMENTED,
      );
    // BUFFERED: Envoy waits for this answer before it sends the body; the pick rides on the body's.
    if (this.#reqMode === BodySendMode.BUFFERED) this.#send({ request_headers: { response: {} } });
    this.#phase = "request-body";
    this.#body = new BodyCollector(this.#route !== null);
  }

  #onRequestBody(b: HttpBody) {
    if (this.#phase === "request-headers")
      return this.#protocolError(
        "request_body arrived before request_headers; the proxy must send headers first",
      );
    if (this.#phase !== "request-body") return; // after the first end_of_stream: ignored (GIE#2988)
    const chunk = b.body ?? EMPTY;
    if (chunk.length > 0) {
      const limit = this.#ctx.maxBodyBytes;
      if (this.#body.bytes + chunk.length > limit)
        return this.#reject(
          new GatewayError(
            413,
            `Request body too large: the limit is ${limit} bytes; send a smaller body, or restart kvgate with a larger --max-body-bytes`,
          ),
        );
      this.#body.push(chunk);
    }
    const end = b.end_of_stream === true || b.end_of_stream_without_message === true;
    if (end || this.#reqMode === BodySendMode.BUFFERED) this.#decideNow(true);
  }

  #onRequestTrailers(m: ProcessingRequest) {
    if (this.#phase === "request-headers")
      return this.#protocolError("request_trailers arrived before request_headers");
    if (this.#phase === "request-body") {
      // The body ends with trailers: decide now, and answer the trailers after the body.
      this.#decideNow(false);
      this.#queue?.push(m);
      return;
    }
    this.#send({ request_trailers: {} });
  }

  #decideNow(end: boolean) {
    this.#phase = "deciding";
    this.#queue = [];
    if (!this.#route) {
      this.#passthrough(true, end);
      this.#drain();
      return;
    }
    const text = this.#body.text();
    const chosen = this.#choose(this.#route, text);
    if (chosen instanceof GatewayError) {
      this.#reject(chosen);
      this.#drain();
      return;
    }
    const { parsed, target } = chosen;
    decide(target.gw, this.#route, text, this.#headers as IncomingHttpHeaders, {
      subset: subsetHint(this.#meta),
      pre: { parsed, rewrite: target.rewrite },
      objectives: target.objectives,
      bodyBytes: this.#body.bytes,
      signal: this.#gone.signal,
    })
      .then(
        (r) => this.#applyDecision(target, r, end),
        (err) => this.#internal(err),
      )
      .finally(() => this.#drain());
  }

  /** The body decoded, and the pool it goes to; a GatewayError for a bad body or an unserved model. */
  #choose(route: ApiRoute, text: string): { parsed: ParsedRequest; target: EppTarget } | GatewayError {
    let parsed: ParsedRequest;
    try {
      parsed = parseRequestBody(route, text);
    } catch (err) {
      if (err instanceof GatewayError) return err;
      throw err;
    }
    const target = this.#ctx.target(parsed, this.#headers);
    return target instanceof GatewayError ? target : { parsed, target };
  }

  #drain() {
    const q = this.#queue ?? [];
    this.#queue = null;
    for (const m of q) this.onMessage(m);
  }

  #answer(
    dest: readonly string[],
    mutation: HeaderMutation,
    body: Buffer[] | null,
    replaced: Buffer | null,
    end: boolean,
  ) {
    for (const r of answerRequest(this.#reqMode, dest, mutation, body, replaced, end)) this.#send(r);
    this.#body.clear();
    this.#phase = "request-done";
  }

  #applyDecision(target: EppTarget, r: DecideResult, end: boolean) {
    if (!r.ok) {
      if (this.#phase !== "closed") this.#reject(r.error);
      return;
    }
    const d = r.decision;
    this.#flight = new Flight(target.gw, target.tokens, d, this.#t0);
    if (this.#phase === "closed") return this.#flight.complete(false); // the stream went away meanwhile
    const dest = d.targets.slice(0, d.picked);
    const extra = [];
    // Whenever there is a body, as llm-d's generateHeaders does: the length of exactly the bytes sent on.
    const length = d.body ? d.body.length : this.#body.bytes;
    if (length > 0) extra.push(setHeader("content-length", String(length)));
    if (d.prefillHost) extra.push(setHeader("x-prefiller-host-port", d.prefillHost));
    this.#answer(
      dest,
      pickMutation(this.#headers, dest, extra, this.#requestId, this.#ctx.strip()),
      d.body ? [d.body] : this.#body.chunks,
      d.body,
      end,
    );
  }

  /** No body to decide on, or a path kvgate does not parse. */
  #passthrough(withBody: boolean, end: boolean) {
    const pick = this.#ctx.anyReady(subsetHint(this.#meta));
    if (pick instanceof GatewayError) return this.#reject(pick);
    const extra =
      withBody && this.#body.bytes > 0 ? [setHeader("content-length", String(this.#body.bytes))] : [];
    const mutation = pickMutation(this.#headers, [pick], extra, this.#requestId, this.#ctx.strip());
    this.#answer([pick], mutation, withBody ? this.#body.chunks : null, null, end);
  }

  #onResponseHeaders(h: HttpHeaders) {
    if (this.#phase === "response" || this.#phase === "response-done")
      return this.#protocolError("response_headers arrived twice on one stream");
    if (this.#phase !== "request-done")
      return this.#protocolError(
        "response_headers arrived before kvgate answered the request; the proxy must wait for the request's answer",
      );
    const bodyFollows = !h.end_of_stream && this.#respMode !== BodySendMode.NONE;
    this.#send(
      answerResponseHeaders(this.#flight, readHeaders(h.headers), servedEndpoint(this.#meta), bodyFollows),
    );
    this.#phase = "response";
    if (h.end_of_stream) this.#responseEnded();
  }

  #onResponseBody(b: HttpBody) {
    if (this.#phase === "response-done") return; // a repeated end_of_stream
    if (this.#phase !== "response")
      return this.#protocolError("response_body arrived before response_headers");
    const chunk = b.body ?? EMPTY;
    const end = b.end_of_stream === true || b.end_of_stream_without_message === true;
    for (const r of answerResponseBody(this.#flight, this.#respMode, chunk, end)) this.#send(r);
    if (end) this.#responseEnded();
  }

  #onResponseTrailers() {
    if (this.#phase !== "response" && this.#phase !== "response-done")
      return this.#protocolError("response_trailers arrived before response_headers");
    this.#responseEnded();
    this.#send({ response_trailers: {} });
  }

  #responseEnded() {
    this.#phase = "response-done";
    this.#flight?.complete(true);
  }

  #close(outcome: StreamOutcome) {
    this.#phase = "closed";
    this.#body.clear();
    this.#ctx.metrics.active.dec();
    this.#ctx.metrics.streams.inc({ outcome });
  }

  #reject(err: GatewayError) {
    this.#send(immediate(err));
    this.#close(err.status >= 500 && err.reason === null ? "internal-error" : "rejected");
    this.#io.end();
  }

  #protocolError(message: string, code: GrpcStatus = GrpcStatus.FAILED_PRECONDITION) {
    this.#flight?.complete(false);
    this.#close("protocol-error");
    this.#io.fail(code, `kvgate epp: ${message}`);
  }

  #internal(err: unknown) {
    if (this.#phase === "closed") return;
    this.#ctx.log(`kvgate epp: internal error: ${(err as Error)?.stack ?? err}`);
    if (this.#phase === "request-headers" || this.#phase === "request-body" || this.#phase === "deciding")
      return this.#reject(new GatewayError(500, "internal error in kvgate's endpoint picker; see its log"));
    this.#flight?.complete(false);
    this.#close("internal-error");
    this.#io.fail(GrpcStatus.INTERNAL, "kvgate epp: internal error; see its log");
  }
}
