/**
 * The two request bodies of a prefill/decode split, as llm-d's routing sidecar builds them for its
 * NIXL v2 protocol (llm-d/llm-d-router@ebab6879 `pkg/sidecar/proxy/connector_nixlv2.go`, token-limit
 * fields from `pkg/common/request`), and what kvgate reads back from the prefiller's answer (vLLM's
 * NixlConnector `request_finished`, vllm-project/vllm `kv_connector/v1/nixl/scheduler.py`).
 *
 *   prefill: the client's body; every token-limit field of the API forced to 1 (present or not),
 *            `stream: false`, no `stream_options`, and `kv_transfer_params` asking for a remote decode
 *            (replacing any the client sent).
 *   decode:  the client's body exactly (its own stream / stream_options / limits, absent ones absent),
 *            with `kv_transfer_params` = the prefiller's returned object verbatim, unknown keys
 *            included; or with no `kv_transfer_params` at all when the decoder prefills locally.
 *
 * `min_tokens: 1` matters: it keeps vLLM from ending the one-token prefill on EOS or a stop string,
 * and vLLM returns kv_transfer_params only for a prefill that ended length-capped. (Newer llm-d
 * removes min_tokens instead; the one-token-EOS case then comes back without params.)
 */

export type JsonObject = Record<string, unknown>;

/** The OpenAI APIs kvgate splits: chat completions, completions and responses. */
export type PdApi = "chat" | "completions" | "responses";

const API_BY_PATH: Record<string, PdApi> = {
  "/v1/chat/completions": "chat",
  "/v1/completions": "completions",
  "/v1/responses": "responses",
};

/** The API of a request path (query ignored), or null for one kvgate does not split. */
export function pdApiOf(path: string): PdApi | null {
  return API_BY_PATH[path.split("?")[0]] ?? null;
}

/** The fields that limit output tokens, per API (llm-d-router@ebab6879 `TokenLimitFields`). */
export const TOKEN_LIMIT_FIELDS: Readonly<Record<PdApi, readonly string[]>> = {
  chat: ["max_tokens", "max_completion_tokens", "min_tokens"],
  completions: ["max_tokens", "max_completion_tokens", "min_tokens"],
  responses: ["max_output_tokens"],
};

/** What the prefill leg asks of the prefiller: prefill, keep the blocks for a remote decoder. */
export function remoteDecodeParams(): JsonObject {
  return {
    do_remote_decode: true,
    do_remote_prefill: false,
    remote_engine_id: null,
    remote_block_ids: null,
    remote_host: null,
    remote_port: null,
  };
}

/** The prefill leg's body; `original` is not modified. */
export function prefillBody(original: JsonObject, api: PdApi): JsonObject {
  const out: JsonObject = { ...original, kv_transfer_params: remoteDecodeParams() };
  for (const f of TOKEN_LIMIT_FIELDS[api]) out[f] = 1;
  out.stream = false;
  delete out.stream_options;
  return out;
}

/**
 * The decode leg's body: the original with `kv_transfer_params` = `kv` (the prefiller's object), or
 * without the field when `kv` is undefined (a local prefill; a client's own value never goes on).
 */
export function decodeBody(original: JsonObject, kv: JsonObject | undefined): JsonObject {
  const out: JsonObject = { ...original };
  if (kv === undefined) delete out.kv_transfer_params;
  else out.kv_transfer_params = kv;
  return out;
}

/**
 * A decode body for releasing the prefiller's blocks after the client left: one token, not streamed.
 * The decoder pulls the KV (vLLM's prefiller frees its blocks once they are read) and answers at once.
 */
export function releaseBody(original: JsonObject, api: PdApi, kv: JsonObject): JsonObject {
  const out = prefillBody(original, api);
  out.kv_transfer_params = kv;
  return out;
}

/** The keys vLLM's decoder needs before it pulls (`update_state_after_alloc`); without one it prefills locally. */
export const REQUIRED_KV_KEYS = [
  "remote_engine_id",
  "remote_request_id",
  "remote_host",
  "remote_port",
] as const;

export type PrefillAnswer =
  | { kind: "params"; params: JsonObject; cachedTokens: number }
  | { kind: "incomplete"; params: JsonObject; cachedTokens: number; missing: string[] }
  | { kind: "none"; cachedTokens: number };

const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

/** usage.prompt_tokens_details.cached_tokens of an OpenAI response, 0 when absent (vLLM sends null for 0). */
export function cachedTokensOf(response: JsonObject): number {
  const usage = response.usage;
  if (!isObject(usage)) return 0;
  const details = usage.prompt_tokens_details;
  if (!isObject(details)) return 0;
  const n = details.cached_tokens;
  return typeof n === "number" && Number.isFinite(n) ? Math.trunc(n) : 0;
}

/**
 * What the prefiller's JSON answer carries: vLLM's kv_transfer_params (an object, returned only for a
 * length-capped prefill), or none (absent or null: the one token was EOS, or the connector is off).
 */
export function readPrefillAnswer(response: JsonObject): PrefillAnswer {
  const cachedTokens = cachedTokensOf(response);
  const params = response.kv_transfer_params;
  if (!isObject(params)) return { kind: "none", cachedTokens };
  const missing = REQUIRED_KV_KEYS.filter((k) => params[k] === undefined || params[k] === null);
  if (missing.length > 0) return { kind: "incomplete", params, cachedTokens, missing };
  return { kind: "params", params, cachedTokens };
}
