/**
 * Reading and writing ext_proc messages the way llm-d's endpoint picker does
 * (llm-d/llm-d-router@ebab6879 `pkg/epp/handlers/`, `pkg/common/envoy/`): request headers read from
 * `raw_value` (what Envoy sends) or `value`, lower-cased; headers written in `raw_value` with
 * OVERWRITE_IF_EXISTS_OR_ADD; the pick in the `x-gateway-destination-endpoint` header and the
 * `envoy.lb` dynamic metadata (GIE endpoint-picker protocol); bodies re-sent as streamed_response
 * chunks of at most 62,000 bytes (`pkg/common/envoy/chunking.go`: some Envoy builds cap a streamed
 * chunk at 64 KiB); errors as an ImmediateResponse with an OpenAI-format JSON body and llm-d's
 * `x-llm-d-request-dropped-reason`.
 */
import { DROPPED_REASON_HEADER, errorJson, type GatewayError } from "../errors.ts";
import {
  type HeaderMap,
  type HeaderMutation,
  type HeaderValueOption,
  OVERWRITE_IF_EXISTS_OR_ADD,
  type PbStruct,
  type PbValue,
  type ProcessingResponse,
} from "./proto.ts";

export const DESTINATION_HEADER = "x-gateway-destination-endpoint";
export const SUBSET_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_KEY = "x-gateway-destination-endpoint-subset";
export const LB_NAMESPACE = "envoy.lb";
export const SERVED_KEY = "x-gateway-destination-endpoint-served";
/** llm-d's BodyByteLimit. */
export const MAX_CHUNK_BYTES = 62_000;

/** Request or response headers as a lower-cased map; a repeated name keeps every value. */
export type Headers = Record<string, string | string[]>;

export function readHeaders(map: HeaderMap | undefined): Headers {
  const out: Headers = {};
  for (const h of map?.headers ?? []) {
    if (!h.key) continue;
    const k = h.key.toLowerCase();
    const v = h.raw_value && h.raw_value.length > 0 ? h.raw_value.toString("latin1") : (h.value ?? "");
    const prev = out[k];
    if (prev === undefined) out[k] = v;
    else if (Array.isArray(prev)) prev.push(v);
    else out[k] = [prev, v];
  }
  return out;
}

export function first(h: Headers, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

export function setHeader(key: string, value: string): HeaderValueOption {
  return {
    header: { key, raw_value: Buffer.from(value, "latin1") },
    append_action: OVERWRITE_IF_EXISTS_OR_ADD,
  };
}

const str = (v: string): PbValue => ({ stringValue: v });

/** `{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port,ip:port"}}` as a google.protobuf.Struct. */
export function lbMetadata(targets: readonly string[]): PbStruct {
  return {
    fields: {
      [LB_NAMESPACE]: { structValue: { fields: { [DESTINATION_HEADER]: str(targets.join(",")) } } },
    },
  };
}

/** A Struct value's strings: a list of strings, or one string (comma-separated accepted). */
function strings(v: PbValue | undefined): string[] | null {
  if (!v) return null;
  if (v.listValue) return (v.listValue.values ?? []).flatMap((x) => (x.stringValue ? [x.stringValue] : []));
  if (typeof v.stringValue === "string")
    return v.stringValue
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
  return null;
}

type FilterMetadata = Record<string, PbStruct> | undefined;

/** The proxy's subset hint, or null when it sent none (then every endpoint is eligible). */
export function subsetHint(meta: FilterMetadata): string[] | null {
  return strings(meta?.[SUBSET_NAMESPACE]?.fields?.[SUBSET_KEY]);
}

/** The endpoint the proxy says served the request, if it says. */
export function servedEndpoint(meta: FilterMetadata): string | null {
  const s = strings(meta?.[LB_NAMESPACE]?.fields?.[SERVED_KEY]);
  return s && s.length > 0 ? s[0] : null;
}

/**
 * `body` split into ≤ 62,000-byte chunks for streamed_response: runs of small chunks are joined (one
 * copy of at most a chunk's worth), a large chunk is sliced without copying. Never empty: a bodiless
 * end still sends one empty chunk carrying end_of_stream.
 */
export function rechunk(parts: readonly Buffer[], limit = MAX_CHUNK_BYTES): Buffer[] {
  const out: Buffer[] = [];
  let run: Buffer[] = [];
  let runBytes = 0;
  const flush = () => {
    if (run.length === 0) return;
    out.push(run.length === 1 ? run[0] : Buffer.concat(run, runBytes));
    run = [];
    runBytes = 0;
  };
  for (const p of parts) {
    let off = 0;
    while (off < p.length) {
      const take = Math.min(limit - runBytes, p.length - off);
      run.push(off === 0 && take === p.length ? p : p.subarray(off, off + take));
      runBytes += take;
      off += take;
      if (runBytes === limit) flush();
    }
  }
  flush();
  if (out.length === 0) out.push(Buffer.alloc(0));
  return out;
}

/** The streamed_response messages that re-send `parts` (end_of_stream on the last when `end`). */
export function streamedBody(
  kind: "request_body" | "response_body",
  parts: readonly Buffer[],
  end: boolean,
): ProcessingResponse[] {
  const chunks = rechunk(parts);
  return chunks.map((body, i) => ({
    [kind]: {
      response: {
        body_mutation: { streamed_response: { body, end_of_stream: end && i === chunks.length - 1 } },
      },
    },
  }));
}

/** An ImmediateResponse carrying `err` as an OpenAI error with llm-d's status and drop reason. */
export function immediate(err: GatewayError): ProcessingResponse {
  const set = [setHeader("content-type", "application/json")];
  if (err.reason) set.push(setHeader(DROPPED_REASON_HEADER, err.reason));
  for (const [k, v] of Object.entries(err.headers)) set.push(setHeader(k, v));
  const headers: HeaderMutation = { set_headers: set };
  return {
    immediate_response: {
      status: { code: err.status },
      headers,
      body: Buffer.from(errorJson(err.status, err.message, err.param), "utf8"),
      details: err.message,
    },
  };
}
