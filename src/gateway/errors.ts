/**
 * Gateway errors and how they reach the client: an OpenAI-format body
 * `{"error": {"message", "type", "param", "code"}}` (vLLM's newer ErrorResponse shape,
 * vllm/entrypoints/openai/protocol.py, engine/protocol.py in
 * newer trees,
 * so clients see one format from the gateway and the replicas), the HTTP status, and llm-d's
 * `x-llm-d-request-dropped-reason` header where llm-d sets one (llm-d/llm-d-router@ebab6879
 * `pkg/common/error/error.go`).
 */
import type { ServerResponse } from "node:http";
import { headersFor, responseGone } from "./h2c.ts";

export const DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason";

/** llm-d's drop reasons (llm-d-router@ebab6879 pkg/common/error/error.go); kvgate emits the first three. */
export type DropReason =
  | "rejected-saturated"
  | "rejected-no-endpoints"
  | "rejected-shutting-down"
  | "rejected-ttl-expired"
  | "rejected-context-cancelled";

const TYPES: Record<number, string> = {
  400: "BadRequestError",
  403: "PermissionDeniedError",
  404: "NotFoundError",
  405: "MethodNotAllowedError",
  408: "RequestTimeoutError",
  413: "RequestEntityTooLargeError",
  415: "UnsupportedMediaTypeError",
  429: "RateLimitError",
  500: "InternalServerError",
  502: "BadGatewayError",
  503: "ServiceUnavailableError",
  504: "GatewayTimeoutError",
};

/** llm-d's error-code names (pkg/common/error), used as the `error_code` metric label. */
const CODES: Record<number, string> = {
  400: "BadRequest",
  404: "NotFound",
  405: "BadRequest",
  408: "BadRequest",
  413: "BadRequest",
  415: "BadRequest",
  429: "ResourceExhausted",
  500: "Internal",
  502: "ServiceUnavailable",
  503: "ServiceUnavailable",
  504: "ServiceUnavailable",
};

export class GatewayError extends Error {
  override name = "GatewayError";
  readonly status: number;
  readonly param: string | null;
  readonly reason: DropReason | null;
  /** Extra response headers (e.g. `allow` on 405). */
  readonly headers: Record<string, string>;
  constructor(
    status: number,
    message: string,
    opts: { param?: string | null; reason?: DropReason | null; headers?: Record<string, string> } = {},
  ) {
    super(message);
    this.status = status;
    this.param = opts.param ?? null;
    this.reason = opts.reason ?? null;
    this.headers = opts.headers ?? {};
  }

  get type(): string {
    return TYPES[this.status] ?? "InternalServerError";
  }

  /** llm-d error-code name for metrics. */
  get code(): string {
    return CODES[this.status] ?? "Internal";
  }
}

export const badRequest = (message: string, param: string | null = null) =>
  new GatewayError(400, message, { param });

export function errorJson(status: number, message: string, param: string | null = null): string {
  const type = TYPES[status] ?? "InternalServerError";
  return JSON.stringify({ error: { message, type, param, code: status } });
}

/** Writes `err` as an OpenAI error response, unless headers already went out. */
export function sendError(res: ServerResponse, err: GatewayError, extra: Record<string, string> = {}): void {
  if (res.headersSent || responseGone(res)) return;
  const body = errorJson(err.status, err.message, err.param);
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    ...err.headers,
    ...extra,
  };
  if (err.reason) headers[DROPPED_REASON_HEADER] = err.reason;
  res.writeHead(err.status, headersFor(res, headers)).end(body);
}

/** The SSE event that ends a stream whose upstream failed mid-way (vLLM's mid-stream error shape). */
export function sseErrorEvent(message: string, status = 502): string {
  return `data: ${errorJson(status, message)}\n\ndata: [DONE]\n\n`;
}
