/**
 * Reading an OpenAI-compatible streaming response, pure: a Server-Sent Events splitter, the
 * interpretation of each `data:` payload (chat delta or completion text, usage, error, [DONE]),
 * and the assignment of output tokens to chunks. Kept apart from the network driver so it can be
 * tested on bytes alone.
 */
import type { RequestKind } from "./workloads/types.ts";

/** Splits an SSE byte stream into the data payloads of its events (multi-line data joined by "\n"). */
export class SseSplitter {
  readonly #decoder = new TextDecoder();
  #buf = "";
  #data: string[] = [];

  /** Feeds bytes; returns the payloads of the events completed by them. */
  push(bytes: Uint8Array): string[] {
    return this.#lines(this.#decoder.decode(bytes, { stream: true }), false);
  }

  /** Flushes at end of stream (an unterminated last event still counts). */
  end(): string[] {
    return this.#lines(this.#decoder.decode(), true);
  }

  #lines(text: string, final: boolean): string[] {
    this.#buf += text;
    const out: string[] = [];
    let nl = this.#buf.search(/\r\n|\r|\n/);
    while (nl >= 0) {
      const line = this.#buf.slice(0, nl);
      const sep = this.#buf.startsWith("\r\n", nl) ? 2 : 1;
      this.#buf = this.#buf.slice(nl + sep);
      this.#line(line, out);
      nl = this.#buf.search(/\r\n|\r|\n/);
    }
    if (final) {
      if (this.#buf) this.#line(this.#buf, out);
      this.#buf = "";
      this.#line("", out);
    }
    return out;
  }

  #line(line: string, out: string[]): void {
    if (line === "") {
      if (this.#data.length) out.push(this.#data.join("\n"));
      this.#data = [];
    } else if (line.startsWith("data:")) this.#data.push(line.slice(line.charCodeAt(5) === 32 ? 6 : 5));
  }
}

export interface Usage {
  promptTokens?: number;
  completionTokens?: number;
  cachedTokens?: number;
}

/** What one data payload carried. */
export interface StreamEvent {
  done?: boolean;
  /** Generated text of the first choice ("" for a role-only chat chunk). */
  text?: string;
  /** Length of the chunk's token_ids (vLLM with return_token_ids). */
  tokenIds?: number;
  usage?: Usage;
  error?: string;
}

const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : undefined);

export function interpretPayload(data: string, kind: RequestKind): StreamEvent {
  if (data.trim() === "[DONE]") return { done: true };
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(data) as Record<string, unknown>;
  } catch {
    return { error: `unparsable stream payload: ${data.slice(0, 120)}` };
  }
  if (v === null || typeof v !== "object") return { error: "stream payload is not an object" };
  const ev: StreamEvent = {};
  if (v["error"] !== undefined || v["object"] === "error") {
    const e = (v["error"] ?? v) as Record<string, unknown>;
    ev.error = typeof e["message"] === "string" ? e["message"] : JSON.stringify(e).slice(0, 200);
    return ev;
  }
  const choice = Array.isArray(v["choices"])
    ? (v["choices"][0] as Record<string, unknown> | undefined)
    : undefined;
  if (choice) {
    const delta = choice["delta"] as Record<string, unknown> | undefined;
    const text = kind === "chat" ? delta?.["content"] : choice["text"];
    if (typeof text === "string") ev.text = text;
    const ids = choice["token_ids"] ?? delta?.["token_ids"];
    if (Array.isArray(ids)) ev.tokenIds = ids.length;
  }
  const u = v["usage"] as Record<string, unknown> | null | undefined;
  if (u && typeof u === "object") {
    const details = u["prompt_tokens_details"] as Record<string, unknown> | null | undefined;
    ev.usage = {
      promptTokens: num(u["prompt_tokens"]),
      completionTokens: num(u["completion_tokens"]),
      cachedTokens: details ? num(details["cached_tokens"]) : undefined,
    };
  }
  return ev;
}

/**
 * Output tokens per content chunk. With usage.completion_tokens = total and c chunks: every chunk
 * gets one token and the remaining total − c are shared in proportion to each chunk's text length
 * (largest remainder, ties to the earlier chunk); with total < c only the first `total` chunks
 * count. Without usage, one token per chunk. (vLLM streams one engine step per chunk: usually one
 * token, several with speculative decoding or stream intervals.)
 */
export function distributeTokens(chunkChars: number[], total: number | undefined): number[] {
  const c = chunkChars.length;
  if (total === undefined) return new Array(c).fill(1);
  if (c === 0) return [];
  if (total <= c) return chunkChars.map((_, i) => (i < total ? 1 : 0));
  const extra = total - c;
  const chars = chunkChars.reduce((a, b) => a + b, 0);
  const weights = chars > 0 ? chunkChars : chunkChars.map(() => 1);
  const wsum = chars > 0 ? chars : c;
  const out = weights.map((w) => 1 + Math.floor((extra * w) / wsum));
  let left = total - out.reduce((a, b) => a + b, 0);
  const order = weights
    .map((w, i) => ({ i, rem: (extra * w) / wsum - Math.floor((extra * w) / wsum) }))
    .sort((a, b) => b.rem - a.rem || a.i - b.i);
  for (let k = 0; left > 0; k = (k + 1) % c, left--) out[order[k].i]++;
  return out;
}
