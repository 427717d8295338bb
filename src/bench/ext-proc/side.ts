/**
 * One direction (request or response) of an exchange through the Envoy-like proxy: its headers,
 * where it is in the ext_proc conversation (Envoy's `ProcessorState` callback state: waiting for a
 * headers reply, for body replies, or idle), the body bytes held back, and the messages it sends.
 * End of stream is known the way Envoy's HTTP/1 codec knows it: from content-length when there is
 * one (the chunk that completes it carries end_of_stream), else from the end of the message (an empty
 * end_of_stream chunk).
 */

import { type HeaderList, toHeaderMap } from "./headers.ts";
import type { ExtProcCall } from "./types.ts";

const EMPTY = Buffer.alloc(0);

export interface SideEnv {
  mode: "FULL_DUPLEX_STREAMED" | "BUFFERED";
  messageTimeoutMs: number;
}

export class Side {
  /** Envoy's callback state for this direction. */
  state: "idle" | "headers" | "body" = "idle";
  /** Body bytes not yet sent on (BUFFERED: the whole body; bypass: what arrived meanwhile). */
  buffered: Buffer[] = [];
  /** Body data has been sent to the processor (fail-open is then off in FULL_DUPLEX_STREAMED). */
  bodyReceived = false;
  /** The whole body has arrived. */
  complete: boolean;
  #seen = 0;
  #ended: boolean;
  #timer: NodeJS.Timeout | null = null;

  constructor(
    readonly kind: "request" | "response",
    private readonly env: SideEnv,
    readonly headers: HeaderList,
    readonly noBody: boolean,
    private readonly expected: number | null,
    private readonly onTimeout: () => void,
  ) {
    this.complete = noBody;
    this.#ended = noBody;
  }

  /** Records an arriving chunk (null: the message ended); null when there is nothing to send. */
  take(chunk: Buffer | null): { chunk: Buffer; end: boolean } | null {
    if (this.#ended) return null;
    if (chunk === null) {
      this.#ended = this.complete = true;
      return { chunk: EMPTY, end: true };
    }
    this.#seen += chunk.length;
    const end = this.expected !== null && this.#seen >= this.expected;
    if (end) this.#ended = this.complete = true;
    this.buffered.push(chunk);
    return { chunk, end };
  }

  /** Returns and forgets the held bytes. */
  drain(): Buffer[] {
    const out = this.buffered;
    this.buffered = [];
    return out;
  }

  /** `first`: the stream's first message, which carries protocol_config as current Envoy sends it. */
  sendHeaders(call: ExtProcCall, metadata: object | undefined, first = false): void {
    const mode = this.env.mode === "FULL_DUPLEX_STREAMED" ? 4 : 2;
    const protocol = {
      request_body_mode: mode,
      response_body_mode: mode,
      send_body_without_waiting_for_header_response: false,
    };
    call.write({
      [`${this.kind}_headers`]: { headers: toHeaderMap(this.headers), end_of_stream: this.noBody },
      metadata_context: metadata ?? {},
      ...(first ? { protocol_config: protocol } : {}),
    });
    this.state = "headers";
    this.#startTimer();
  }

  /** FULL_DUPLEX_STREAMED: sends the chunk now (and drops it); BUFFERED: only holds it. */
  sendBody(call: ExtProcCall, chunk: Buffer, end: boolean): void {
    if (this.env.mode !== "FULL_DUPLEX_STREAMED") return;
    this.buffered = [];
    call.write({ [`${this.kind}_body`]: { body: chunk, end_of_stream: end }, metadata_context: {} });
    this.bodyReceived = true;
    if (this.state !== "headers") this.state = "body";
  }

  /** BUFFERED: the whole body in one message. */
  sendBuffered(call: ExtProcCall): void {
    const body = Buffer.concat(this.buffered);
    call.write({ [`${this.kind}_body`]: { body, end_of_stream: true }, metadata_context: {} });
    this.bodyReceived = true;
    this.state = "body";
    this.#startTimer();
  }

  /** The headers reply arrived: wait for body replies if body data went out, else idle. */
  headersAnswered(): void {
    this.stopTimer();
    this.state = this.env.mode === "FULL_DUPLEX_STREAMED" && this.bodyReceived ? "body" : "idle";
  }

  /** Envoy runs no per-message timer in FULL_DUPLEX_STREAMED (processor_state.cc). */
  #startTimer(): void {
    if (this.env.mode === "FULL_DUPLEX_STREAMED") return;
    this.stopTimer();
    this.#timer = setTimeout(this.onTimeout, this.env.messageTimeoutMs);
  }

  stopTimer(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }
}
