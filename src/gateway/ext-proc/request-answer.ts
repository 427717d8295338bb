/**
 * What kvgate tells Envoy once it knows where a request goes: the header mutation (the destination
 * list, a generated x-request-id, the body's content-length, x-prefiller-host-port when a
 * prefill endpoint was chosen, and removal of every control header the client sent — llm-d only skips
 * re-setting them, so a forged one still reaches the replica), the `envoy.lb` dynamic metadata, and
 * the body: streamed_response chunks in FULL_DUPLEX_STREAMED, one BodyResponse in BUFFERED (where a
 * body response's header mutation still applies, the headers being held with the body). Also the pick
 * for requests kvgate does not decode (no body, or a path it does not parse): a ready endpoint at
 * random, as llm-d does. And the body as it arrives: chunks kept as they are (to be sent on without
 * a copy) and, for a route kvgate parses, decoded to text chunk by chunk, so JSON.parse runs once.
 */

export class BodyCollector {
  readonly chunks: Buffer[] = [];
  bytes = 0;
  #text = "";
  #decoder: StringDecoder | null;

  constructor(decode: boolean) {
    this.#decoder = decode ? new StringDecoder("utf8") : null;
  }

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.bytes += chunk.length;
    if (this.#decoder) this.#text += this.#decoder.write(chunk);
  }

  /** The whole body's text (once: the decoder is finished and released). */
  text(): string {
    const t = this.#text + (this.#decoder?.end() ?? "");
    this.#text = "";
    this.#decoder = null;
    return t;
  }

  clear(): void {
    this.chunks.length = 0;
  }
}

import { StringDecoder } from "node:string_decoder";
import { monotonicSeconds } from "../../datalayer/datastore.ts";
import type { Rng } from "../../scheduler/rng.ts";
import { hostOf } from "../decide.ts";
import { GatewayError } from "../errors.ts";
import type { Gateway } from "../gateway.ts";
import { isControlHeader } from "../headers.ts";
import { DESTINATION_HEADER, type Headers, lbMetadata, setHeader, streamedBody } from "./messages.ts";
import {
  BodySendMode,
  type HeaderMutation,
  type HeaderValueOption,
  type ProcessingResponse,
} from "./proto.ts";

export function pickMutation(
  clientHeaders: Headers,
  dest: readonly string[],
  extra: HeaderValueOption[],
  generatedRequestId: string | null,
  strip: readonly string[] = [],
): HeaderMutation {
  const set = [setHeader(DESTINATION_HEADER, dest.join(",")), ...extra];
  if (generatedRequestId) set.push(setHeader("x-request-id", generatedRequestId));
  const remove = Object.keys(clientHeaders).filter((k) => isControlHeader(k) || strip.includes(k));
  return { set_headers: set, remove_headers: remove };
}

/**
 * The messages answering the request side, in Envoy's order. `body`: the bytes to send on (null when
 * the request has none); `replaced`: set when they differ from what the client sent.
 */
export function answerRequest(
  mode: number,
  dest: readonly string[],
  mutation: HeaderMutation,
  body: readonly Buffer[] | null,
  replaced: Buffer | null,
  end: boolean,
): ProcessingResponse[] {
  const dynamic_metadata = lbMetadata(dest);
  if (body && mode === BodySendMode.BUFFERED) {
    const response = {
      header_mutation: mutation,
      clear_route_cache: true,
      ...(replaced ? { body_mutation: { body: replaced } } : {}),
    };
    return [{ request_body: { response }, dynamic_metadata }];
  }
  const head: ProcessingResponse = {
    request_headers: { response: { header_mutation: mutation, clear_route_cache: true } },
    dynamic_metadata,
  };
  return body ? [head, ...streamedBody("request_body", body, end)] : [head];
}

/** A ready endpoint of any of `pools` at random (within the proxy's subset hint), or a 503 saying none is. */
export function randomReady(
  pools: Iterable<Gateway>,
  subset: readonly string[] | null,
  rng: Rng,
): string | GatewayError {
  const now = monotonicSeconds();
  const hosts = subset ? new Set(subset.map(hostOf)) : null;
  const eligible = [];
  for (const gw of pools) {
    const c = gw.data.store.candidates(null, now);
    if (c.ok) eligible.push(...(hosts ? c.candidates.filter((e) => hosts.has(hostOf(e.id))) : c.candidates));
  }
  if (eligible.length === 0)
    return new GatewayError(
      503,
      subset
        ? "no ready endpoint is in the proxy's subset hint (x-gateway-destination-endpoint-subset); check that the proxy and kvgate see the same pool"
        : "no endpoint is ready to serve this request; wait for the pool's replicas to become ready",
      { reason: "rejected-no-endpoints" },
    );
  return eligible[rng.int(eligible.length)].id;
}
