/**
 * One decided request's life after the pick, as the ext_proc server watches it go by: the response
 * headers name the endpoint that served it (the proxy's `envoy.lb` metadata, after any retry); the
 * first response body byte starts it (scheduler.onResponseStarted, which releases its prompt tokens,
 * endpoint marked answering, TTFT), as in `kvgate serve` — vLLM sends a stream's headers before its
 * prefill ends — or the headers do when the proxy sends no body; response bytes are counted,
 * scanned for usage and get the client's model name back; the end — response end of stream,
 * trailers, or the stream going away (client disconnect, proxy error) — calls
 * scheduler.onResponseComplete exactly once, so in-flight load and the prefix index learn exactly as
 * they do behind `kvgate serve`.
 */
import { monotonicSeconds } from "../../datalayer/datastore.ts";
import { promptTokensOf } from "../autoscale.ts";
import type { Decision } from "../decide.ts";
import { prefilledFlow } from "../flow-gate.ts";
import { reportUsage } from "../flow-usage.ts";
import type { Gateway } from "../gateway.ts";
import { encodeSessionToken } from "../routing.ts";
import { first, type Headers, setHeader, streamedBody } from "./messages.ts";
import type { EppTokenMetrics } from "./metrics.ts";
import { BodySendMode, type HeaderMutation, type ProcessingResponse } from "./proto.ts";
import { ModelNameRestorer, UsageScanner } from "./response-body.ts";

export class Flight {
  readonly decision: Decision;
  /** The endpoint serving the request: the pick, until the proxy says otherwise. */
  served: string;
  status = 0;
  streaming: boolean;
  readonly restorer: ModelNameRestorer | null;
  readonly #gw: Gateway;
  readonly #metrics: EppTokenMetrics;
  readonly #t0: number;
  readonly #usage = new UsageScanner();
  #bytes = 0;
  #started = false;
  #done = false;
  /** Seconds to the response's first byte, once it started. */
  #ttft: number | null = null;

  constructor(gw: Gateway, metrics: EppTokenMetrics, decision: Decision, t0: number) {
    this.#gw = gw;
    this.#metrics = metrics;
    this.decision = decision;
    this.#t0 = t0;
    this.served = decision.targets[0];
    this.streaming = decision.facts.stream;
    const rw = decision.rewrite;
    this.restorer =
      rw && rw.target !== decision.clientModel ? new ModelNameRestorer(rw.target, rw.model) : null;
    gw.metrics.requestRunning.inc(decision.labels);
    gw.traffic.attempt(this.served, 0);
    gw.autoscale?.arrived(promptTokensOf(decision.facts));
  }

  get done(): boolean {
    return this.#done;
  }

  /**
   * Response headers arrived: `served` is the proxy's served endpoint when it reports one. With
   * `bodyFollows` (the proxy sends the response body) the request starts at its first body byte.
   */
  started(served: string | null, status: number, eventStream: boolean, bodyFollows: boolean): void {
    if (this.#started || this.#done) return;
    this.#started = true;
    if (served && served !== this.served) {
      this.#gw.traffic.attempt(served, 1);
      this.served = served;
    }
    this.status = status;
    if (eventStream) this.streaming = true;
    if (!bodyFollows) this.#firstByte();
  }

  /** The response's first byte (or its headers, when no body is seen): TTFT, prompt tokens released. */
  #firstByte(): void {
    if (this.#ttft !== null) return;
    const d = this.decision;
    this.#ttft = (performance.now() - this.#t0) / 1000;
    if (this.status > 0 && this.status < 500) this.#gw.data.store.reportRequestSuccess(this.served);
    this.#gw.metrics.ttft.observe({ ...d.labels, streaming: String(this.streaming) }, this.#ttft);
    d.routing.scheduler.onResponseStarted(d.facts, this.served, monotonicSeconds());
    prefilledFlow(this.#gw, d.routing, d.facts.requestId);
  }

  /** The bytes to pass on for a response chunk. */
  body(chunk: Buffer, end: boolean): Buffer {
    if (this.#started && chunk.length > 0) this.#firstByte();
    this.#bytes += chunk.length;
    this.#usage.push(chunk);
    return this.restorer ? this.restorer.push(chunk, end) : chunk;
  }

  /** The response ended (`natural`) or the stream went away; only the first call counts. */
  complete(natural: boolean): void {
    if (this.#done) return;
    // A response that ended cleanly with no body byte starts here; one that went away before its
    // first byte never started (no TTFT, no prefill sample), and completing it releases its load.
    if (this.#started && natural) this.#firstByte();
    this.#done = true;
    const d = this.decision;
    const m = this.#gw.metrics;
    d.routing.scheduler.onResponseComplete(d.facts, this.served, monotonicSeconds(), {
      outputTokens: this.#usage.completionTokens ?? undefined,
    });
    m.requestRunning.dec(d.labels);
    reportUsage(this.#gw, d.routing, d.facts.requestId, this.#usage);
    if (!natural) return;
    m.requestDuration.observe(d.labels, (performance.now() - this.#t0) / 1000);
    m.responseSize.observe(d.labels, this.#bytes);
    if (this.status >= 400) m.requestErrorTotal.inc({ ...d.labels, error_code: `upstream-${this.status}` });
    const u = this.#usage;
    if (u.promptTokens !== null) this.#metrics.inputTokens.observe(d.labels, u.promptTokens);
    if (u.completionTokens !== null) this.#metrics.outputTokens.observe(d.labels, u.completionTokens);
    this.#gw.autoscale?.finished({
      promptTokens: u.promptTokens ?? 0,
      outputTokens: u.completionTokens,
      ttft: this.#ttft,
      e2e: (performance.now() - this.#t0) / 1000,
    });
  }
}

/**
 * The answer to response headers: for a decided request, starts its flight, sets the session-token
 * header when session affinity is configured, and drops content-length when the model name will be
 * restored (it can change the body's length).
 */
export function answerResponseHeaders(
  f: Flight | null,
  hs: Headers,
  served: string | null,
  bodyFollows: boolean,
): ProcessingResponse {
  const mutation: HeaderMutation = {};
  if (f) {
    const eventStream = (first(hs, "content-type") ?? "").includes("text/event-stream");
    f.started(served, Number(first(hs, ":status") ?? 0), eventStream, bodyFollows);
    const tokenHeader = f.decision.routing.sessionTokenHeader;
    if (tokenHeader) mutation.set_headers = [setHeader(tokenHeader, encodeSessionToken(f.served))];
    if (f.restorer && hs["content-length"] !== undefined) mutation.remove_headers = ["content-length"];
  }
  return { response_headers: { response: { header_mutation: mutation } } };
}

/** The answer to a response body chunk: re-sent at once (streamed_response in FULL_DUPLEX_STREAMED). */
export function answerResponseBody(
  f: Flight | null,
  mode: number,
  chunk: Buffer,
  end: boolean,
): ProcessingResponse[] {
  const out = f ? f.body(chunk, end) : chunk;
  if (mode === BodySendMode.FULL_DUPLEX_STREAMED) return streamedBody("response_body", [out], end);
  return [{ response_body: { response: out === chunk ? {} : { body_mutation: { body: out } } } }];
}
