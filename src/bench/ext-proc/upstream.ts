/**
 * The Envoy-like proxy's router: where a request goes and how it gets there. Like the llm-d
 * reference Envoy (llm-d-router `deploy/environments/dev/e2e-infra/envoy.yaml`: an `ORIGINAL_DST`
 * cluster with `original_dst_lb_config.use_http_header` on `x-gateway-destination-endpoint`), the
 * destination is the `ip:port` in that request header after ext_proc's mutations; of a comma-separated
 * list the first entry is used (the endpoint picker protocol's primary). No usable address is a 503
 * "no healthy upstream", and a failed connection a 503 "upstream connect error ...", both generated
 * as local replies that still pass through the response phase of ext_proc, as Envoy's router's do.
 */
import { isIP } from "node:net";
import { Readable } from "node:stream";
import { type Dispatcher, request } from "undici";
import { first, type HeaderList, toHttp1Headers } from "./headers.ts";

export const DESTINATION_HEADER = "x-gateway-destination-endpoint";
export const SERVED_KEY = "x-gateway-destination-endpoint-served";

/** `ip:port` → a URL origin, or null when it is not an IP address and a port. */
export function endpointOrigin(endpoint: string): string | null {
  const m = /^\[?([^\]]+?)\]?:(\d{1,5})$/.exec(endpoint.trim());
  if (!m) return null;
  const port = Number(m[2]);
  const family = isIP(m[1]!);
  if (family === 0 || port < 1 || port > 65535) return null;
  return family === 6 ? `http://[${m[1]}]:${port}` : `http://${m[1]}:${port}`;
}

/** The first entry of the destination header, when it names an address. */
export function destinationOf(headers: HeaderList): string | null {
  const value = first(headers, DESTINATION_HEADER);
  if (value === undefined) return null;
  const primary = value.split(",")[0]!.trim();
  return endpointOrigin(primary) ? primary : null;
}

export interface UpstreamResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Readable;
  /** The endpoint that answered (or was tried), for `x-gateway-destination-endpoint-served`. */
  served: string | null;
  /** True for a reply the proxy generated itself. */
  local: boolean;
}

/** A generated text/plain reply, shaped like one from upstream. */
export function localResponse(status: number, text: string, served: string | null): UpstreamResponse {
  const body = Buffer.from(text);
  return {
    status,
    headers: { "content-type": "text/plain", "content-length": String(body.length) },
    body: Readable.from(body.length > 0 ? [body] : []),
    served,
    local: true,
  };
}

export interface UpstreamRequest {
  endpoint: string;
  headers: HeaderList;
  /** Request body: null for none, else a stream the caller writes and ends. */
  body: Readable | null;
  /** Headers Envoy would not forward (e.g. content-length in the streamed body modes). */
  drop: string[];
  dispatcher: Dispatcher;
  signal: AbortSignal;
}

/** Sends the request; failures before a response resolve to Envoy's 503 local reply. */
export async function sendUpstream(req: UpstreamRequest): Promise<UpstreamResponse> {
  const origin = endpointOrigin(req.endpoint)!;
  const headers = toHttp1Headers(req.headers, ["host", ...req.drop]);
  headers["host"] = first(req.headers, ":authority") || req.endpoint;
  try {
    const res = await request(`${origin}${first(req.headers, ":path") ?? "/"}`, {
      method: (first(req.headers, ":method") ?? "GET") as Dispatcher.HttpMethod,
      headers,
      body: req.body ?? undefined,
      dispatcher: req.dispatcher,
      signal: req.signal,
    });
    return {
      status: res.statusCode,
      headers: res.headers,
      body: res.body,
      served: req.endpoint,
      local: false,
    };
  } catch (e) {
    if (req.signal.aborted) throw e;
    const reason = `${(e as { code?: string }).code ?? "error"}: ${(e as Error).message}`;
    return localResponse(
      503,
      `upstream connect error or disconnect/reset before headers. reset reason: ${reason}`,
      req.endpoint,
    );
  }
}
