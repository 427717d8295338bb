/**
 * Prompt tokenization for the fleet simulator, with a cache of text chunks so a shared 6,000-token
 * system prompt is tokenized once, not once per request. The replicas' tokenizer is the simulator
 * tokenizer (src/engine/sim-tokenizer.ts), a pure function of the text.
 *
 * Why chunking is exact: the sim tokenizer's cuts depend only on the text up to one character past
 * the cut, and a single space followed by a non-space character always starts a new piece (" the").
 * So if the text is split just before such a space — and the space follows a non-space character
 * and is not followed by a special marker ("<|") — the pieces before the split are those of the
 * left part alone and the pieces after it are those of the right part alone:
 * tokens(A + B) = tokens(A) + tokens(B). Chunks end at the first such space at or after every
 * `chunkChars` characters, so two prompts sharing a prefix share every chunk inside the prefix.
 * test/fleet-tokens.test.ts checks the equality against whole-text encoding on every workload.
 * Whole prompts are cached too (workloads that cycle through a fixed prompt set, like
 * inference-perf's shared_prefix, repeat the very same string), up to a budget of tokens. Chunks
 * are kept as Int32Array, under a budget of tokens large enough for every distinct chunk of a
 * 512-replica shared-prefix run (9,600 system prompts, 48,000 questions: 115M tokens, 460 MB), since
 * such a run cycles through more distinct prompts than the whole-prompt cache holds and every miss
 * there is rebuilt from chunks; the oldest chunks go first past the budget.
 * Returned arrays are shared: callers must not modify them.
 */
import { createSimTokenizer, SIM_BOS_ID } from "../../engine/sim-tokenizer.ts";
import type { ChatMessage, Tokenizer } from "../../engine/tokenizer.ts";
import { TextMap } from "./text-map.ts";

export interface PromptTokenizerOptions {
  /** Characters per chunk before the next split point (default 1024). */
  chunkChars?: number;
  /** Chunks kept; the oldest go first past this (default 2^22). */
  maxChunks?: number;
  /** Tokens of chunks kept; the oldest go first past this (default 2^27: 512 MB). */
  maxChunkTokens?: number;
  /** Tokens of whole prompts kept; the cache is emptied when it grows past this (default 2^24). */
  maxPromptTokens?: number;
}

const SPACE = 32;

function isSpace(c: number): boolean {
  return c === SPACE || (c >= 9 && c <= 13);
}

export class PromptTokenizer {
  readonly tokenizer: Tokenizer;
  readonly #chunkChars: number;
  readonly #maxChunks: number;
  readonly #maxChunkTokens: number;
  readonly #maxPromptTokens: number;
  readonly #chunks = new Map<string, Int32Array>();
  #chunkTokens = 0;
  /** Whole completion prompts (with BOS) and rendered chat templates (without). */
  readonly #prompts = new TextMap<number[]>();
  readonly #templates = new TextMap<number[]>();
  #promptTokens = 0;
  /** Chunk lookups that hit and missed the cache. */
  hits = 0;
  misses = 0;

  constructor(opts: PromptTokenizerOptions = {}) {
    // Nothing here decodes: the tokenizer need not remember pieces for it.
    this.tokenizer = createSimTokenizer({ reverseMapSize: 0 });
    this.#chunkChars = opts.chunkChars ?? 1024;
    this.#maxChunks = opts.maxChunks ?? 1 << 22;
    this.#maxChunkTokens = opts.maxChunkTokens ?? 2 ** 27;
    this.#maxPromptTokens = opts.maxPromptTokens ?? 1 << 24;
    if (!(this.#chunkChars >= 16)) throw new RangeError("chunkChars must be ≥ 16");
  }

  /** What a /v1/completions replica sees: BOS, then the prompt's tokens (add_special_tokens true). */
  completion(prompt: string): number[] {
    return this.#cached(prompt, true);
  }

  /** What a /v1/chat/completions replica sees: the chat template, encoded without extra specials. */
  chat(messages: ChatMessage[]): number[] {
    return this.#cached(this.tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true }), false);
  }

  #cached(text: string, bos: boolean): number[] {
    const map = bos ? this.#prompts : this.#templates;
    let ids = map.get(text);
    if (ids === undefined) {
      ids = this.#encode(text, bos);
      if (this.#promptTokens + ids.length > this.#maxPromptTokens) {
        this.#prompts.clear();
        this.#templates.clear();
        this.#promptTokens = 0;
      }
      map.set(text, ids);
      this.#promptTokens += ids.length;
    }
    return ids;
  }

  #encode(text: string, bos: boolean): number[] {
    const parts: Int32Array[] = [];
    let total = bos ? 1 : 0;
    const n = text.length;
    let start = 0;
    while (start < n) {
      const end = this.#splitAfter(text, start + this.#chunkChars);
      const chunk = start === 0 && end === n ? text : text.slice(start, end);
      let ids = this.#chunks.get(chunk);
      if (ids === undefined) {
        this.misses++;
        ids = Int32Array.from(this.tokenizer.encode(chunk, false));
        this.#keepChunk(chunk, ids);
      } else this.hits++;
      parts.push(ids);
      total += ids.length;
      start = end;
    }
    // One allocation of the final size: prompts run to tens of thousands of tokens.
    const out = new Array<number>(total);
    let k = 0;
    if (bos) out[k++] = SIM_BOS_ID;
    for (const ids of parts) for (let i = 0; i < ids.length; i++) out[k++] = ids[i];
    return out;
  }

  #keepChunk(chunk: string, ids: Int32Array): void {
    const chunks = this.#chunks;
    while (
      chunks.size > 0 &&
      (chunks.size >= this.#maxChunks || this.#chunkTokens + ids.length > this.#maxChunkTokens)
    ) {
      const [oldest, old] = chunks.entries().next().value as [string, Int32Array];
      chunks.delete(oldest);
      this.#chunkTokens -= old.length;
    }
    chunks.set(chunk, ids);
    this.#chunkTokens += ids.length;
  }

  /** The first safe split point at or after `from` (see the header), or the text's end. */
  #splitAfter(text: string, from: number): number {
    const n = text.length;
    for (let i = Math.max(1, from); i < n - 1; i++) {
      if (text.charCodeAt(i) !== SPACE) continue;
      if (isSpace(text.charCodeAt(i - 1))) continue;
      const next = text.charCodeAt(i + 1);
      if (isSpace(next)) continue;
      if (next === 60 /* < */ && text.charCodeAt(i + 2) === 124 /* | */) continue;
      return i;
    }
    return n;
  }
}
