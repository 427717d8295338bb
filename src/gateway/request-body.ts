/**
 * The request body, read once and decoded once: a bounded read of the raw bytes (which are
 * forwarded unchanged), then one JSON.parse to pull out only what scheduling needs — model, stream,
 * prompt or messages, max tokens, cache_salt, and the two flags that change the prompt's token ids
 * (add_generation_prompt, add_special_tokens). Everything else is the replica's business.
 */
import type { IncomingMessage } from "node:http";
import type { ChatMessage, PromptInput } from "../scheduler/types.ts";
import { badRequest, GatewayError } from "./errors.ts";

export type ApiRoute = "completions" | "chat" | "embeddings";

const ROUTES: Array<[string, ApiRoute]> = [
  ["/chat/completions", "chat"],
  ["/completions", "completions"],
  ["/embeddings", "embeddings"],
];

/** The OpenAI route a path ends with (llm-d resolves parsers by path suffix), or null: passthrough. */
export function routeOf(path: string): ApiRoute | null {
  const p = path.split("?")[0];
  for (const [suffix, route] of ROUTES) if (p.endsWith(suffix)) return route;
  return null;
}

export interface ParsedRequest {
  route: ApiRoute;
  model: string;
  stream: boolean;
  prompt: PromptInput;
  maxTokens?: number;
  cacheSalt?: string;
  /** vLLM's `add_generation_prompt` (chat; vLLM's default true), when the body sets it. */
  addGenerationPrompt?: boolean;
  /** vLLM's `add_special_tokens` (default true for completions, false for chat), when the body sets it. */
  addSpecialTokens?: boolean;
  /** The decoded body itself, for a caller that must rewrite a field (model rewrite) without decoding twice. */
  json: Record<string, unknown>;
}

/**
 * Reads the body up to `limit` bytes. A declared Content-Length over the limit fails before
 * reading; a body that grows past it fails as soon as it does. Rejects with GatewayError 413.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"]);
  if (Number.isFinite(declared) && declared > limit)
    return Promise.reject(tooLarge(limit, `${declared} bytes declared`));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        cleanup();
        reject(tooLarge(limit, "body"));
        return;
      }
      chunks.push(c);
    };
    const onEnd = () => {
      cleanup();
      resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size));
    };
    const onError = (err: Error) => {
      cleanup();
      reject(new GatewayError(400, `could not read the request body: ${err.message}`));
    };
    const onAborted = () => onError(new Error("client closed the connection"));
    const cleanup = () => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
    };
    const onClose = () => {
      if (!req.complete) onAborted();
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

function tooLarge(limit: number, what: string): GatewayError {
  return new GatewayError(
    413,
    `Request body too large: the limit is ${limit} bytes (${what}); send a smaller body, or restart kvgate with a larger --max-body-bytes`,
    { headers: { connection: "close" } },
  );
}

/** A minimal valid body for the route, quoted in 400s so the client sees the expected shape. */
const EXAMPLE_BODY: Record<ApiRoute, string> = {
  completions: '{"model": "<id>", "prompt": "hi"}',
  chat: '{"model": "<id>", "messages": [{"role": "user", "content": "hi"}]}',
  embeddings: '{"model": "<id>", "input": "hi"}',
};

/** What the required prompt field of a completions or embeddings body holds. */
const PROMPT_FIELD: Record<"prompt" | "input", string> = {
  prompt:
    'set "prompt" to the text to complete: a string, an array of strings, an array of token ids or an array of token-id arrays',
  input:
    'set "input" to the text to embed: a string, an array of strings, an array of token ids or an array of token-id arrays',
};

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);
const isIntArray = (v: unknown): v is number[] => Array.isArray(v) && v.every(isInt);

function checkPrompt(v: unknown, param: string): PromptInput & { kind: "completion" } {
  if (typeof v === "string" || isIntArray(v)) return { kind: "completion", prompt: v };
  if (Array.isArray(v) && v.length > 0) {
    if (v.every((x) => typeof x === "string")) return { kind: "completion", prompt: v as string[] };
    if (v.every(isIntArray)) return { kind: "completion", prompt: v as number[][] };
  }
  throw badRequest(
    `${param} must be a string, an array of strings, an array of token ids or an array of token-id arrays`,
    param,
  );
}

function checkMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw badRequest("messages must be a non-empty array", "messages");
  v.forEach((m, i) => {
    if (!isRecord(m) || typeof m.role !== "string")
      throw badRequest(`messages[${i}] must be an object with a string role`, `messages[${i}]`);
    const c = m.content;
    if (c !== undefined && c !== null && typeof c !== "string" && !Array.isArray(c))
      throw badRequest(
        `messages[${i}].content must be a string or an array of parts`,
        `messages[${i}].content`,
      );
  });
  return v as ChatMessage[];
}

function optionalTokens(body: Record<string, unknown>, key: string): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (!isInt(v) || v < 0) throw badRequest(`${key} must be a non-negative integer`, key);
  return v;
}

/**
 * Decodes and checks the fields the gateway needs; throws GatewayError 400 naming the field. `raw` is
 * the body's bytes, or its text when the caller decoded it as it arrived (the ext_proc server).
 */
export function parseRequestBody(route: ApiRoute, raw: Buffer | string): ParsedRequest {
  let body: unknown;
  try {
    body = JSON.parse(typeof raw === "string" ? raw : raw.toString("utf8"));
  } catch (err) {
    throw badRequest(
      `Invalid JSON in request body: ${(err as Error).message}; send one JSON object, e.g. ${EXAMPLE_BODY[route]}`,
    );
  }
  if (!isRecord(body))
    throw badRequest(`Request body must be a JSON object; send one, e.g. ${EXAMPLE_BODY[route]}`);
  const model = body.model;
  if (model === undefined || model === null)
    throw badRequest(
      'model is required; set "model" to a served model id (GET /v1/models lists them)',
      "model",
    );
  if (typeof model !== "string" || model.trim() === "")
    throw badRequest("model must be a non-empty string", "model");
  const stream = body.stream ?? false;
  if (typeof stream !== "boolean") throw badRequest("stream must be a boolean", "stream");

  let prompt: PromptInput;
  if (route === "chat") {
    prompt = { kind: "chat", messages: checkMessages(body.messages) };
    if (body.tools !== undefined && body.tools !== null) {
      if (!Array.isArray(body.tools)) throw badRequest("tools must be an array", "tools");
      prompt.tools = body.tools;
    }
  } else {
    const key = route === "embeddings" ? "input" : "prompt";
    if (body[key] === undefined || body[key] === null)
      throw badRequest(`${key} is required; ${PROMPT_FIELD[key]}`, key);
    prompt = checkPrompt(body[key], key);
  }
  const out: ParsedRequest = { route, model, stream, prompt, json: body };
  const maxTokens = optionalTokens(body, "max_completion_tokens") ?? optionalTokens(body, "max_tokens");
  if (route !== "embeddings" && maxTokens !== undefined) out.maxTokens = maxTokens;
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null) {
    if (typeof salt !== "string" || salt.length === 0)
      throw badRequest("cache_salt must be a non-empty string", "cache_salt");
    out.cacheSalt = salt;
  }
  for (const [key, field] of [
    ["add_generation_prompt", "addGenerationPrompt"],
    ["add_special_tokens", "addSpecialTokens"],
  ] as const) {
    const v = body[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== "boolean") throw badRequest(`${key} must be a boolean`, key);
    out[field] = v;
  }
  return out;
}
