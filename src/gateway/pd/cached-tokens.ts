/**
 * The decode response's `usage.prompt_tokens_details.cached_tokens`, reported as llm-d's routing
 * sidecar reports it (llm-d/llm-d-router `pkg/sidecar/proxy/cached_tokens_usage_rewriter.go`): the
 * prefiller's prefix-cache hits (0 when it reported none), not the decoder's count, which includes
 * every token pulled over the KV transfer. A JSON body is rewritten whole; an SSE stream line by
 * line, only `data:` lines that carry a `"usage"` object (the last chunk, with stream_options
 * include_usage). A usage object without prompt_tokens_details gets one. Anything that is not JSON,
 * or a body beyond the buffering limit, passes through unchanged.
 */
import type { ResponseRewriter } from "../proxy.ts";
import type { JsonObject } from "./bodies.ts";

const isObject = (v: unknown): v is JsonObject => typeof v === "object" && v !== null && !Array.isArray(v);

/** Sets the count in a parsed response; false when it has no usage object (nothing to rewrite). */
function setCachedTokens(response: JsonObject, cachedTokens: number): boolean {
  const usage = response.usage;
  if (!isObject(usage)) return false;
  const details = usage.prompt_tokens_details;
  if (!isObject(details)) {
    usage.prompt_tokens_details = { cached_tokens: cachedTokens };
    return true;
  }
  if (details.cached_tokens === cachedTokens) return false;
  details.cached_tokens = cachedTokens;
  return true;
}

/** A whole JSON body with the count rewritten; the same bytes when it is not JSON or has no usage. */
export function rewriteCachedTokensJson(body: Buffer, cachedTokens: number): Buffer {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch {
    return body;
  }
  if (!isObject(parsed) || !setCachedTokens(parsed, cachedTokens)) return body;
  return Buffer.from(JSON.stringify(parsed), "utf8");
}

const DATA = "data:";

/** One SSE line (with its line ending, if any) rewritten. */
export function rewriteCachedTokensSseLine(line: string, cachedTokens: number): string {
  if (!line.startsWith(DATA) || !line.includes('"usage"')) return line;
  const body = line.replace(/\r?\n$/, "");
  const ending = line.slice(body.length);
  const data = body.slice(DATA.length).replace(/^ /, "");
  let parsed: unknown;
  try {
    parsed = JSON.parse(data);
  } catch {
    return line;
  }
  if (!isObject(parsed) || !setCachedTokens(parsed, cachedTokens)) return line;
  return `data: ${JSON.stringify(parsed)}${ending}`;
}

/** A whole SSE text rewritten line by line. */
export function rewriteCachedTokensSse(text: string, cachedTokens: number): string {
  return text
    .split(/(?<=\n)/)
    .map((l) => rewriteCachedTokensSseLine(l, cachedTokens))
    .join("");
}

/** JSON bodies above this pass through unrewritten (an answer's usage is not worth unbounded memory). */
const MAX_JSON_BYTES = 8 * 1024 * 1024;

const USAGE = Buffer.from('"usage"');
const NL = 0x0a;

/** Complete SSE lines rewritten; lines without a usage key keep their exact bytes. */
function rewriteSseLines(b: Buffer, cachedTokens: number): Buffer {
  if (!b.includes(USAGE)) return b;
  const out: Buffer[] = [];
  let from = 0;
  while (from < b.length) {
    const nl = b.indexOf(NL, from);
    const end = nl < 0 ? b.length : nl + 1;
    const line = b.subarray(from, end);
    out.push(
      line.includes(USAGE)
        ? Buffer.from(rewriteCachedTokensSseLine(line.toString("utf8"), cachedTokens))
        : line,
    );
    from = end;
  }
  return Buffer.concat(out);
}

/** The rewriter for proxy.ts's forward(): streams SSE through line-wise, holds a JSON body until its end. */
export class CachedTokensRewriter implements ResponseRewriter {
  readonly #cached: number;
  #sse = false;
  /** SSE: the bytes after the last newline seen (a newline byte never occurs inside a UTF-8 sequence). */
  #line: Buffer = Buffer.alloc(0);
  #held: Buffer[] | null = [];
  #heldBytes = 0;

  constructor(cachedTokens: number) {
    this.#cached = cachedTokens;
  }

  start(_status: number, sse: boolean): void {
    this.#sse = sse;
  }

  chunk(b: Buffer): Buffer {
    if (this.#sse) {
      const data = this.#line.length ? Buffer.concat([this.#line, b]) : b;
      const cut = data.lastIndexOf(NL) + 1;
      this.#line = data.subarray(cut);
      return rewriteSseLines(data.subarray(0, cut), this.#cached);
    }
    if (this.#held === null) return b;
    this.#held.push(b);
    this.#heldBytes += b.length;
    if (this.#heldBytes <= MAX_JSON_BYTES) return Buffer.alloc(0);
    const all = Buffer.concat(this.#held);
    this.#held = null;
    return all;
  }

  end(): Buffer {
    if (this.#sse) {
      const rest = this.#line;
      this.#line = Buffer.alloc(0);
      return rewriteSseLines(rest, this.#cached);
    }
    if (this.#held === null) return Buffer.alloc(0);
    const all = Buffer.concat(this.#held);
    this.#held = null;
    return all.length === 0 ? all : rewriteCachedTokensJson(all, this.#cached);
  }
}
