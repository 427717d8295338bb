/**
 * What one ext_proc reply means for the direction it answers, as Envoy's `ProcessorState` decides
 * (envoyproxy/envoy `source/extensions/filters/http/ext_proc/processor_state.cc`): checked against
 * that direction's callback state (a reply nobody is waiting for is "spurious"), header mutations
 * applied to its held headers, a BUFFERED body replaced (with Envoy's content-length check), a
 * FULL_DUPLEX_STREAMED chunk taken out of `streamed_response` (anything else there is spurious).
 * The exchange then acts on the outcome.
 */
import { applyHeaderMutation, first } from "./headers.ts";
import type { CommonResponse, ImmediateResponse, ProcessingResponse } from "./protos.ts";
import type { Side } from "./side.ts";

export type Outcome =
  /** A reply Envoy refuses: `spurious` ones may fail open, rejected mutations never do. */
  | { kind: "fail"; details: string; spurious: boolean }
  /** The headers reply was applied. */
  | { kind: "headers" }
  /** FULL_DUPLEX_STREAMED: a body chunk to pass on. */
  | { kind: "chunk"; body: Buffer; end: boolean }
  /** BUFFERED: the body reply was applied; the side's `buffered` holds the final body. */
  | { kind: "body" }
  | { kind: "immediate"; response: ImmediateResponse };

export type Direction = "request" | "response";

const spurious = (details: string): Outcome => ({
  kind: "fail",
  details: `spurious message: ${details}`,
  spurious: true,
});

/** Interprets `m` for the side it answers (`res` is null before the upstream response exists). */
export function interpret(
  fullDuplex: boolean,
  m: ProcessingResponse,
  req: Side,
  res: Side | null,
): { dir: Direction; out: Outcome } {
  switch (m.response) {
    case "request_headers":
      return { dir: "request", out: headersReply(fullDuplex, req, m.request_headers?.response) };
    case "response_headers":
      return {
        dir: "response",
        out: res ? headersReply(fullDuplex, res, m.response_headers?.response) : spurious("response headers"),
      };
    case "request_body":
      return { dir: "request", out: bodyReply(fullDuplex, req, m.request_body?.response) };
    case "response_body":
      return {
        dir: "response",
        out: res ? bodyReply(fullDuplex, res, m.response_body?.response) : spurious("response body"),
      };
    case "immediate_response":
      return { dir: "request", out: { kind: "immediate", response: m.immediate_response ?? {} } };
    default:
      // Trailers replies (no trailers are ever sent) and an unset oneof.
      return { dir: "request", out: spurious(m.response ?? "unhandled message") };
  }
}

function headersReply(fullDuplex: boolean, side: Side, common: CommonResponse | undefined): Outcome {
  if (side.state !== "headers") return spurious(`${side.kind} headers`);
  const bad = mutate(fullDuplex, side, common);
  if (bad) return bad;
  side.headersAnswered();
  return { kind: "headers" };
}

function bodyReply(fullDuplex: boolean, side: Side, common: CommonResponse | undefined): Outcome {
  if (side.state !== "body") return spurious(`${side.kind} body`);
  if (fullDuplex) {
    const s = common?.body_mutation?.streamed_response;
    if (!s) {
      return spurious("Normal body mutation response is received while body_mode_ is FULL_DUPLEX_STREAMED");
    }
    if (s.end_of_stream) side.state = "idle";
    return { kind: "chunk", body: s.body ?? Buffer.alloc(0), end: Boolean(s.end_of_stream) };
  }
  side.stopTimer();
  const bad = mutate(fullDuplex, side, common) ?? replaceBody(side, common);
  if (bad) return bad;
  side.state = "idle";
  return { kind: "body" };
}

/** Applies the header mutation; an Outcome when Envoy would reject it. */
function mutate(fullDuplex: boolean, side: Side, common: CommonResponse | undefined): Outcome | undefined {
  const result = applyHeaderMutation(side.headers, common?.header_mutation, fullDuplex);
  return result.error ? { kind: "fail", details: result.error, spurious: false } : undefined;
}

/** BUFFERED `body` / `clear_body`: the new body must match a held content-length. */
function replaceBody(side: Side, common: CommonResponse | undefined): Outcome | undefined {
  const bm = common?.body_mutation;
  if (!bm || (bm.mutation !== "body" && bm.mutation !== "clear_body")) return undefined;
  const next = bm.mutation === "body" ? (bm.body ?? Buffer.alloc(0)) : Buffer.alloc(0);
  const cl = first(side.headers, "content-length");
  if (cl !== undefined && Number(cl) !== (bm.body?.length ?? 0)) {
    return {
      kind: "fail",
      details: "mismatch between content length and the length of the mutated body",
      spurious: false,
    };
  }
  if (bm.mutation === "body" || bm.clear_body) side.buffered = next.length ? [next] : [];
  return undefined;
}
