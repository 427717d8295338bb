/**
 * Request parsing and error bodies of the simulated replica's OpenAI-compatible API, following vLLM's
 * wire format (vllm/entrypoints/openai/protocol.py; completion/ and chat_completion/protocol.py
 * in newer trees): the fields vLLM accepts on /v1/completions and
 * /v1/chat/completions (extras such as cache_salt, priority, request_id, ignore_eos, return_token_ids),
 * unknown fields ignored, and errors as {"error": {message, type, param, code}}.
 */
import type { ServerResponse } from "node:http";
import type { ChatMessage } from "../engine/tokenizer.ts";

const ERROR_TYPES: Record<number, string> = {
  400: "BadRequestError",
  404: "NotFoundError",
  405: "MethodNotAllowedError",
  413: "RequestEntityTooLargeError",
  500: "InternalServerError",
  503: "ServiceUnavailableError",
};

/** An error answered as vLLM's ErrorResponse. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: number;
  readonly param: string | null;
  readonly type: string;
  constructor(status: number, message: string, param: string | null = null, type?: string) {
    super(message);
    this.status = status;
    this.param = param;
    this.type = type ?? ERROR_TYPES[status] ?? "BadRequestError";
  }
}

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: number };
}

export function errorBody(err: ApiError): ErrorBody {
  return { error: { message: err.message, type: err.type, param: err.param, code: err.status } };
}

const bad = (param: string, why: string): ApiError => new ApiError(400, `${param}: ${why}`, param);

type Body = Record<string, unknown>;

function isPlainObject(v: unknown): v is Body {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Parses a JSON request body that must be an object. */
export function parseJsonObject(text: string): Body {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, `Invalid JSON in request body: ${(err as Error).message}`);
  }
  if (!isPlainObject(v)) throw new ApiError(400, "Request body must be a JSON object");
  return v;
}

/** Reads an optional field; null counts as absent, as with pydantic Optional fields. */
function opt<T>(b: Body, key: string, check: (v: unknown) => v is T, what: string): T | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (!check(v)) throw bad(key, `must be ${what}, got ${JSON.stringify(v)?.slice(0, 80)}`);
  return v;
}

const isBool = (v: unknown): v is boolean => typeof v === "boolean";
const isNum = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
const isInt = (v: unknown): v is number => Number.isInteger(v);
const isStr = (v: unknown): v is string => typeof v === "string";
const isPosInt = (v: unknown): v is number => isInt(v) && (v as number) >= 1;
const isNonNegInt = (v: unknown): v is number => isInt(v) && (v as number) >= 0;
const isTokenList = (v: unknown): v is number[] => Array.isArray(v) && v.every(isNonNegInt);
const isObj = (v: unknown): v is Body => isPlainObject(v);

/** Fields shared by completions and chat. */
export interface GenerationParams {
  model: string | undefined;
  /** null = as many as fit in max-model-len. */
  maxTokens: number | null;
  n: number;
  ignoreEos: boolean;
  minTokens: number;
  seed: number | undefined;
  cacheSalt: string | undefined;
  priority: number;
  requestId: string | undefined;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  returnTokenIds: boolean;
  addSpecialTokens: boolean;
  /** vLLM's kv_transfer_params (P/D), passed through as given; unknown keys kept. */
  kvTransferParams: Body | undefined;
}

export type PromptInput = { text: string } | { tokenIds: number[] };

export interface CompletionParams extends GenerationParams {
  kind: "completion";
  prompts: PromptInput[];
  echo: boolean;
}

export interface ChatParams extends GenerationParams {
  kind: "chat";
  messages: ChatMessage[];
  addGenerationPrompt: boolean;
}

function generationParams(b: Body, kind: "completion" | "chat"): GenerationParams {
  const maxTokensKey =
    kind === "chat" && b["max_completion_tokens"] != null ? "max_completion_tokens" : "max_tokens";
  const maxTokens = opt(b, maxTokensKey, isPosInt, "a positive integer") ?? null;
  const n = opt(b, "n", isPosInt, "a positive integer") ?? 1;
  if (n > 128) throw bad("n", "must be at most 128");
  const minTokens = opt(b, "min_tokens", isNonNegInt, "an integer ≥ 0") ?? 0;
  if (maxTokens !== null && minTokens > maxTokens)
    throw bad("min_tokens", `must be less than or equal to max_tokens=${maxTokens}, got ${minTokens}`);
  const stream = opt(b, "stream", isBool, "a boolean") ?? false;
  const streamOptions = opt(b, "stream_options", isObj, "an object");
  if (streamOptions && !stream)
    throw bad("stream_options", "Stream options can only be defined when `stream=True`.");
  const cacheSalt = opt(b, "cache_salt", isStr, "a string");
  if (cacheSalt !== undefined && (cacheSalt.length < 1 || cacheSalt.length > 1024))
    throw bad("cache_salt", "must be 1 to 1024 characters");
  // Sampling knobs the simulator does not model are still type-checked, as vLLM would.
  for (const k of [
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
  ])
    opt(b, k, isNum, "a number");
  opt(b, "top_k", isInt, "an integer");
  opt(b, "ignore_eos", isBool, "a boolean");
  const stop = b["stop"];
  if (stop != null && !isStr(stop) && !(Array.isArray(stop) && stop.every(isStr)))
    throw bad("stop", "must be a string or a list of strings");
  if (b["stop_token_ids"] != null && !isTokenList(b["stop_token_ids"]))
    throw bad("stop_token_ids", "must be a list of integers");
  const kvTransferParams = opt(b, "kv_transfer_params", isObj, "an object");
  return {
    kvTransferParams,
    model: opt(b, "model", isStr, "a string"),
    maxTokens,
    n,
    ignoreEos: opt(b, "ignore_eos", isBool, "a boolean") ?? false,
    minTokens,
    seed: opt(b, "seed", isInt, "an integer"),
    cacheSalt,
    priority: opt(b, "priority", isInt, "an integer") ?? 0,
    requestId: opt(b, "request_id", isStr, "a string"),
    stream,
    includeUsage: streamOptions ? (opt(streamOptions, "include_usage", isBool, "a boolean") ?? true) : false,
    continuousUsage: streamOptions
      ? (opt(streamOptions, "continuous_usage_stats", isBool, "a boolean") ?? false)
      : false,
    returnTokenIds: opt(b, "return_token_ids", isBool, "a boolean") ?? false,
    addSpecialTokens: opt(b, "add_special_tokens", isBool, "a boolean") ?? kind === "completion",
  };
}

/** Parses a /v1/completions body. Prompts: string, string[], token ids, or a list of token-id lists. */
export function parseCompletionRequest(b: Body): CompletionParams {
  const p = b["prompt"];
  let prompts: PromptInput[];
  if (typeof p === "string") prompts = [{ text: p }];
  else if (Array.isArray(p) && p.length > 0 && p.every(isStr)) prompts = p.map((text) => ({ text }));
  else if (Array.isArray(p) && p.length > 0 && p.every(isInt)) {
    if (!isTokenList(p)) throw bad("prompt", "token ids must be integers ≥ 0");
    prompts = [{ tokenIds: p }];
  } else if (Array.isArray(p) && p.length > 0 && p.every((x) => Array.isArray(x))) {
    if (!p.every(isTokenList)) throw bad("prompt", "token ids must be integers ≥ 0");
    prompts = (p as number[][]).map((tokenIds) => ({ tokenIds }));
  } else if (p === undefined || p === null) {
    throw bad("prompt", "field required");
  } else {
    throw bad(
      "prompt",
      "must be a string, a list of strings, a list of token ids or a list of token-id lists",
    );
  }
  if (opt(b, "suffix", isStr, "a string")) throw bad("suffix", "suffix is not currently supported");
  const params = generationParams(b, "completion");
  const echo = opt(b, "echo", isBool, "a boolean") ?? false;
  return { kind: "completion", ...params, prompts, echo };
}

/** Parses chat messages: a non-empty list of {role, content} with string or text-part content. */
export function parseMessages(v: unknown, param = "messages"): ChatMessage[] {
  if (!Array.isArray(v)) throw bad(param, v === undefined ? "field required" : "must be a list of messages");
  if (v.length === 0) throw bad(param, "must contain at least one message");
  return v.map((m, i) => {
    if (!isPlainObject(m)) throw bad(`${param}[${i}]`, "must be an object");
    if (typeof m["role"] !== "string") throw bad(`${param}[${i}].role`, "must be a string");
    const c = m["content"];
    const contentOk =
      c === undefined ||
      c === null ||
      typeof c === "string" ||
      (Array.isArray(c) && c.every((part) => isPlainObject(part) && typeof part["type"] === "string"));
    if (!contentOk) throw bad(`${param}[${i}].content`, "must be a string or a list of content parts");
    return m as unknown as ChatMessage;
  });
}

/** Parses a /v1/chat/completions body. */
export function parseChatRequest(b: Body): ChatParams {
  const messages = parseMessages(b["messages"]);
  const params = generationParams(b, "chat");
  const addGenerationPrompt = opt(b, "add_generation_prompt", isBool, "a boolean") ?? true;
  opt(b, "logprobs", isBool, "a boolean");
  return { kind: "chat", ...params, messages, addGenerationPrompt };
}

export type TokenizeParams =
  | {
      kind: "completion";
      model: string | undefined;
      prompt: string;
      addSpecialTokens: boolean;
      returnTokenStrs: boolean;
    }
  | {
      kind: "chat";
      model: string | undefined;
      messages: ChatMessage[];
      addGenerationPrompt: boolean;
      addSpecialTokens: boolean;
      returnTokenStrs: boolean;
    };

/** Parses a /tokenize body, completion form ({prompt}) or chat form ({messages}). */
export function parseTokenizeRequest(b: Body): TokenizeParams {
  const model = opt(b, "model", isStr, "a string");
  const returnTokenStrs = opt(b, "return_token_strs", isBool, "a boolean") ?? false;
  if (b["messages"] !== undefined) {
    return {
      kind: "chat",
      model,
      messages: parseMessages(b["messages"]),
      addGenerationPrompt: opt(b, "add_generation_prompt", isBool, "a boolean") ?? true,
      addSpecialTokens: opt(b, "add_special_tokens", isBool, "a boolean") ?? false,
      returnTokenStrs,
    };
  }
  const prompt = b["prompt"];
  if (typeof prompt !== "string")
    throw bad("prompt", prompt === undefined ? "field required" : "must be a string");
  return {
    kind: "completion",
    model,
    prompt,
    addSpecialTokens: opt(b, "add_special_tokens", isBool, "a boolean") ?? true,
    returnTokenStrs,
  };
}

/** Parses a /detokenize body: {model?, tokens: int[]}. */
export function parseDetokenizeRequest(b: Body): { model: string | undefined; tokens: number[] } {
  const tokens = b["tokens"];
  if (!isTokenList(tokens))
    throw bad("tokens", tokens === undefined ? "field required" : "must be a list of integers ≥ 0");
  return { model: opt(b, "model", isStr, "a string"), tokens };
}

/** vLLM-style message for a request that does not fit the context window. */
export function contextLengthMessage(
  maxModelLen: number,
  promptTokens: number,
  maxTokens: number | null,
): string {
  if (maxTokens === null || promptTokens >= maxModelLen)
    return (
      `This model's maximum context length is ${maxModelLen} tokens. However, your request has ` +
      `${promptTokens} input tokens. Please reduce the length of the input messages.`
    );
  return (
    `This model's maximum context length is ${maxModelLen} tokens. However, you requested ` +
    `${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). ` +
    "Please reduce the length of the messages or completion."
  );
}

/** Writes a JSON response (Content-Length set, so keep-alive clients can reuse the connection). */
export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent || res.destroyed) return;
  const data = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { "content-type": "application/json", "content-length": data.length });
  res.end(data);
}

/** Answers an error as vLLM's ErrorResponse; any non-ApiError becomes a 500. */
export function sendError(res: ServerResponse, err: unknown): void {
  const api =
    err instanceof ApiError
      ? err
      : new ApiError(500, `Internal server error: ${(err as Error)?.message ?? err}`);
  sendJson(res, api.status, errorBody(api));
}
