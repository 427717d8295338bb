/**
 * Prefix-friendly tokenization cache for the gateway's local tokenizers (sim, Hugging Face).
 *
 * A rendered prompt is split at "safe boundaries": special tokens that the tokenizer matches before
 * any normalization or pre-tokenization, so no merge can cross them (the sim tokenizer's markers; a
 * tokenizer.json's special added tokens without lstrip/rstrip/single_word and with normalized=false).
 * Then encode(text) = encode(seg₀) + encode(marker₁) + encode(seg₁) + …, and each segment's ids are
 * cached by its exact text. A chat's shared system prompt is one segment (between `<|im_start|>` and
 * `<|im_end|>`), so only the new turns are encoded. Nothing is ever reused across a non-boundary cut:
 * BPE is not prefix-stable, so a cached prefix is only used where it ends at a special token.
 *
 * The split is verified once when the cache is built: a battery of probe texts (markers next to
 * words, spaces, newlines, unicode) must give identical ids split and whole, else splitting is off
 * and only whole texts are cached. Special tokens added by encode(text, true) (BOS, maybe EOS) are
 * learned the same way and verified, else such calls bypass the cache.
 */
import type { ChatMessage, Tokenizer } from "../engine/tokenizer.ts";

export interface TokenizerCacheOptions {
  /** Cache budget in bytes (keys at 2 B/char + ids at 8 B each + ~64 B overhead). Default 64 MiB; 0 disables. */
  maxBytes?: number;
  /** Segments shorter than this many characters are encoded directly, not cached. Default 64. */
  minSegmentChars?: number;
}

export interface TokenizerCacheStats {
  hits: number;
  misses: number;
  entries: number;
  bytes: number;
  /** Whether prompts are split at special tokens (false: whole texts only). */
  splitting: boolean;
}

/** A Tokenizer whose encode is cached; `stats()` for /metrics. */
export interface CachingTokenizer extends Tokenizer {
  readonly inner: Tokenizer;
  stats(): TokenizerCacheStats;
}

const ENTRY_OVERHEAD = 64;
export const DEFAULT_TOKENIZER_CACHE_BYTES = 64 * 1024 * 1024;

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Splits `text` into [seg, marker, seg, marker, …, seg] (segments may be empty). */
function splitAt(re: RegExp, text: string): string[] {
  return text.split(re);
}

/** Where `inner` occurs contiguously in `outer`, or -1. */
function indexOfRun(outer: readonly number[], inner: readonly number[]): number {
  scan: for (let i = 0; i + inner.length <= outer.length; i++) {
    for (let j = 0; j < inner.length; j++) if (outer[i + j] !== inner[j]) continue scan;
    return i;
  }
  return -1;
}

const PROBE_BODIES = [
  "hello world",
  " leading space",
  "trailing space ",
  "\n\nnewlines\n",
  "  two  spaces  ",
  "naïve 漢字 😀 mixed\tTabs",
  "x",
  "",
  "punct!?,.()",
  "\r\n",
];

/**
 * Wraps `tok` with a bounded LRU cache of segment ids. `boundaries` are the texts of safe special
 * tokens (see the module comment); an empty list caches whole texts only.
 */
export function createCachingTokenizer(
  tok: Tokenizer,
  boundaries: readonly string[],
  opts: TokenizerCacheOptions = {},
): CachingTokenizer {
  const maxBytes = Math.max(0, opts.maxBytes ?? DEFAULT_TOKENIZER_CACHE_BYTES);
  const minChars = Math.max(0, opts.minSegmentChars ?? 64);
  const cache = new Map<string, number[]>(); // insertion order = recency
  let bytes = 0;
  let hits = 0;
  let misses = 0;

  const sorted = [...new Set(boundaries)].filter((b) => b.length > 0).sort((a, b) => b.length - a.length);
  let re: RegExp | null = sorted.length > 0 ? new RegExp(`(${sorted.map(escapeRe).join("|")})`) : null;

  const cost = (key: string, ids: readonly number[]) => key.length * 2 + ids.length * 8 + ENTRY_OVERHEAD;

  function lookup(seg: string): number[] {
    if (seg.length < minChars || maxBytes === 0) return tok.encode(seg, false);
    const got = cache.get(seg);
    if (got !== undefined) {
      hits++;
      cache.delete(seg);
      cache.set(seg, got);
      return got;
    }
    misses++;
    const ids = tok.encode(seg, false);
    const c = cost(seg, ids);
    if (c <= maxBytes) {
      cache.set(seg, ids);
      bytes += c;
      while (bytes > maxBytes) {
        const oldest = cache.keys().next().value as string;
        bytes -= cost(oldest, cache.get(oldest)!);
        cache.delete(oldest);
      }
    }
    return ids;
  }

  function encodeSplit(text: string): number[] {
    if (re === null) return lookup(text).slice();
    const out: number[] = [];
    const parts = splitAt(re, text);
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i]!;
      if (p.length === 0) continue;
      for (const id of lookup(p)) out.push(id);
    }
    return out;
  }

  // Verify the split on probes; turn it off on any mismatch.
  if (re !== null) {
    const probes: string[] = [];
    const ms = sorted.slice(0, 8);
    for (const m of ms)
      for (const b of PROBE_BODIES) probes.push(`${b}${m}${b}`, `${m}${b}`, `${b}${m}`, `${m}${m}${b}`);
    probes.push(PROBE_BODIES.join(ms.join("")));
    for (const p of probes) {
      const split: number[] = [];
      for (const part of splitAt(re, p)) if (part.length > 0) split.push(...tok.encode(part, false));
      if (!sameIds(split, tok.encode(p, false))) {
        re = null;
        break;
      }
    }
  }

  // Special tokens encode(text, true) adds around the text, learned from probes and verified.
  let specials: { before: number[]; after: number[] } | null = null;
  {
    const learn = (t: string) => {
      const withS = tok.encode(t, true);
      const without = tok.encode(t, false);
      const at = without.length > 0 ? indexOfRun(withS, without) : -1;
      if (at < 0) return null;
      return { before: withS.slice(0, at), after: withS.slice(at + without.length) };
    };
    const a = learn("hello world");
    const b = learn("\nnaïve 漢字 😀 x");
    if (a && b && sameIds(a.before, b.before) && sameIds(a.after, b.after)) specials = a;
  }

  return {
    inner: tok,
    get name() {
      return tok.name;
    },
    get vocabSize() {
      return tok.vocabSize;
    },
    get eosTokenId() {
      return tok.eosTokenId;
    },
    encode(text: string, addSpecialTokens = true): number[] {
      if (typeof text !== "string") return tok.encode(text, addSpecialTokens);
      if (!addSpecialTokens) return encodeSplit(text);
      if (specials === null) return tok.encode(text, true);
      return [...specials.before, ...encodeSplit(text), ...specials.after];
    },
    decode(ids: number[]): string {
      return tok.decode(ids);
    },
    applyChatTemplate(messages: ChatMessage[], o?: { addGenerationPrompt?: boolean }): string {
      return tok.applyChatTemplate(messages, o);
    },
    stats(): TokenizerCacheStats {
      return { hits, misses, entries: cache.size, bytes, splitting: re !== null };
    },
  };
}
