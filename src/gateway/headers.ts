/**
 * Which client headers may reach a replica. Hop-by-hop headers (RFC 9110 §7.6.1) are connection
 * state, not request state. llm-d's routing-control headers are outputs of the router or inputs
 * only a trusted proxy may set (llm-d/llm-d-router@ebab6879; sources below): kvgate never obeys them
 * from a client and, unlike llm-d (which only skips re-setting them), removes them before
 * forwarding so a client cannot steer a replica's sidecar (e.g. the P/D prefiller) either.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";

/** RFC 9110 hop-by-hop headers, plus ones undici/node set themselves. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "content-length",
  "expect",
  "http2-settings",
]);

/**
 * Routing-control headers by exact name. Sources (llm-d/llm-d-router@ebab6879 unless named): system-owned
 * headers
 * (`pkg/epp/util/request/headers.go`), the EPP protocol (gateway-api-inference-extension v1.0.0
 * `docs/proposals/004-endpoint-picker-protocol/README.md`), the data-parallel handler
 * (`pkg/epp/framework/plugins/scheduling/profilehandler/dataparallel/`), P/D headers
 * (`pkg/epp/framework/plugins/scheduling/profilehandler/disagg/`) and the sidecar's inputs
 * (`pkg/sidecar/proxy/`).
 */
export const CONTROL_HEADERS: readonly string[] = [
  "x-gateway-destination-endpoint",
  "x-gateway-destination-endpoint-served",
  "x-gateway-destination-endpoint-subset",
  "x-gateway-destination-endpoint-fallbacks",
  "x-gateway-destination-endpoint-scores",
  "x-gateway-inference-objective",
  "x-gateway-inference-fairness-id",
  "x-gateway-model-name-rewrite",
  "x-llm-d-request-dropped-reason",
  "x-llm-d-inference-objective",
  "x-llm-d-inference-fairness-id",
  "x-llm-d-model-name-rewrite",
  "x-llm-d-slo-ttft-ms",
  "x-llm-d-slo-tpot-ms",
  "x-slo-ttft-ms",
  "x-slo-tpot-ms",
  "x-prefiller-host-port",
  "x-prefiller-url",
  "x-data-parallel-host-port",
  "x-encoder-host-port",
  "x-encoder-hosts-ports",
  "x-kv-cache-source-host-port",
  "x-went-into-resp-headers",
];

/**
 * The response header naming the endpoint that served the request (llm-d's name for the proxy's
 * report of the endpoint it used, GIE's endpoint-picker protocol). The gateway owns it: a client's is
 * stripped like every control header, and a replica's never reaches the client.
 */
export const SERVED_ENDPOINT_HEADER = "x-gateway-destination-endpoint-served";

/** Whole families: every `x-llm-d-*` (incl. `x-llm-d-video-*`), `x-gateway-*` and kvgate's own. */
const CONTROL_PREFIXES = ["x-llm-d-", "x-gateway-", "x-kvgate-"];

const CONTROL = new Set(CONTROL_HEADERS);

export function isControlHeader(name: string): boolean {
  const n = name.toLowerCase();
  return CONTROL.has(n) || CONTROL_PREFIXES.some((p) => n.startsWith(p));
}

/** Names listed in `Connection:` are hop-by-hop for this message too. */
function connectionTokens(value: string | string[] | undefined): Set<string> {
  const out = new Set<string>();
  for (const v of Array.isArray(value) ? value : value ? [value] : [])
    for (const t of v.split(",")) if (t.trim()) out.add(t.trim().toLowerCase());
  return out;
}

/** Client request headers to forward upstream (node lowercases incoming names). */
export function forwardRequestHeaders(h: IncomingHttpHeaders): Record<string, string | string[]> {
  const listed = connectionTokens(h.connection);
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) {
    // `:method`, `:path`, `:authority`…: HTTP/2 pseudo-headers describe this hop's request line.
    if (v === undefined || k.startsWith(":") || HOP_BY_HOP.has(k) || listed.has(k) || isControlHeader(k))
      continue;
    out[k] = v;
  }
  return out;
}

/** Upstream response headers to pass to the client: everything but hop-by-hop and the served header. */
export function forwardResponseHeaders(
  h: Record<string, string | string[] | undefined>,
): OutgoingHttpHeaders {
  const listed = connectionTokens(h.connection);
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined) continue;
    const n = k.toLowerCase();
    if ((HOP_BY_HOP.has(n) && n !== "content-length") || listed.has(n) || n === SERVED_ENDPOINT_HEADER)
      continue;
    out[n] = v;
  }
  return out;
}

/** The value of a single-valued request header, or undefined. */
export function headerValue(h: IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}
