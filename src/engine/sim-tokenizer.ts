/**
 * The simulator's tokenizer: deterministic, no model files, about 4 characters per token, and a
 * pure function of the text, so the gateway and every simulated replica (separate processes) agree
 * on token ids, and a shared text prefix gives a shared token-id prefix (prefix caching needs it).
 *
 * Segmentation, left to right, in UTF-16 code units (a surrogate pair counts as one character):
 * - special markers (`<|im_start|>` …) become their reserved id;
 * - a single space directly before a non-space character leads the next piece (" the");
 * - a word piece is up to 6 word characters ([A-Za-z0-9_] or any non-ASCII character), which
 *   gives about 4.2 characters per token on English prose, like real BPE vocabularies;
 * - a punctuation piece is up to 4 other ASCII non-space characters;
 * - a whitespace piece is up to 4 whitespace characters, ending before a space that leads a piece.
 * Every cut depends only on the characters up to one past the cut, so for texts A and A+B the ids
 * of A are a prefix of the ids of A+B except possibly A's last one (unless B completes a special
 * marker begun at the end of A). A piece's id is FNV-1a 32-bit over its UTF-16 code units, mod
 * (vocabSize − 16), plus 16: ids 0–15 are reserved for special tokens.
 */
import { type ChatMessage, messageText, type Tokenizer } from "./tokenizer.ts";

/** Number of ids reserved for special tokens at the bottom of the vocabulary. */
export const SIM_RESERVED_IDS = 16;

/** The special tokens and their ids; `<|im_start|>role\ncontent<|im_end|>\n` is the chat format. */
export const SIM_SPECIAL_TOKENS = {
  "<|pad|>": 0,
  "<|begin_of_text|>": 1,
  "<|endoftext|>": 2,
  "<|im_start|>": 3,
  "<|im_end|>": 4,
} as const;

export const SIM_BOS_ID = 1;
export const SIM_EOS_ID = 2;
const DEFAULT_VOCAB = 128256;
const DEFAULT_REVERSE_MAP = 65536;

const MARKERS = Object.entries(SIM_SPECIAL_TOKENS) as Array<[string, number]>;
const SPECIAL_TEXT: string[] = Array.from({ length: SIM_RESERVED_IDS }, (_, id) => {
  const m = MARKERS.find(([, v]) => v === id);
  return m ? m[0] : `<|reserved_${id}|>`;
});

export interface SimTokenizerOptions {
  /** Must be the same in the gateway and the replicas. Default 128256. */
  vocabSize?: number;
  /** Whether encode(text, true) and the chat template start with BOS. Default true. */
  bos?: boolean;
  /**
   * How many id → piece entries decode remembers (oldest dropped first). Default 65536; 0 remembers
   * none (decode gives pseudo-words), for callers that only encode.
   */
  reverseMapSize?: number;
}

const PUNCT = 1;
const WORD = 2;
const SPACE = 3;

function classOf(c: number): number {
  if (c >= 128) return WORD;
  if (c === 32 || (c >= 9 && c <= 13)) return SPACE;
  if ((c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95) return WORD;
  return PUNCT;
}

/** The id of the special marker starting at i, or -1. */
function markerAt(text: string, i: number): number {
  if (text.charCodeAt(i) !== 60 /* < */ || text.charCodeAt(i + 1) !== 124 /* | */) return -1;
  for (const [m, id] of MARKERS) if (text.startsWith(m, i)) return id;
  return -1;
}

/** True if the space at i leads the next piece: it is followed by a non-space that starts no marker. */
function spaceLeads(text: string, i: number, n: number): boolean {
  return i + 1 < n && classOf(text.charCodeAt(i + 1)) !== SPACE && markerAt(text, i + 1) < 0;
}

/** End (exclusive) of the ordinary piece starting at i (no marker starts at i). */
function pieceEnd(text: string, i: number, n: number): number {
  let j = i;
  let c = text.charCodeAt(j);
  if (c === 32 && spaceLeads(text, j, n)) c = text.charCodeAt(++j);
  const cls = classOf(c);
  const max = cls === WORD ? 6 : 4;
  for (let k = 0; j < n && k < max; k++) {
    const d = text.charCodeAt(j);
    if (classOf(d) !== cls) break;
    if (cls === SPACE) {
      if (d === 32 && j > i && spaceLeads(text, j, n)) break;
    } else if (d === 60 && markerAt(text, j) >= 0) break;
    const pair = d >= 0xd800 && d <= 0xdbff && j + 1 < n && (text.charCodeAt(j + 1) & 0xfc00) === 0xdc00;
    j += pair ? 2 : 1;
  }
  return j;
}

/** Walks the text: `special` for markers, `piece` for ordinary pieces [start, end). */
function segment(
  text: string,
  special: (id: number) => void,
  piece: (start: number, end: number) => void,
): void {
  const n = text.length;
  let i = 0;
  while (i < n) {
    const id = markerAt(text, i);
    if (id >= 0) {
      special(id);
      i += SPECIAL_TEXT[id]!.length;
      continue;
    }
    const end = pieceEnd(text, i, n);
    piece(i, end);
    i = end;
  }
}

/** The pieces the sim tokenizer cuts `text` into (special markers included as text). */
export function simPieces(text: string): string[] {
  const out: string[] = [];
  segment(
    text,
    (id) => out.push(SPECIAL_TEXT[id]!),
    (s, e) => out.push(text.slice(s, e)),
  );
  return out;
}

function fnv1a(text: string, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let k = start; k < end; k++) {
    h ^= text.charCodeAt(k);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

const CONSONANTS = "bdfgklmnprstvz";
const VOWELS = "aeiou";

/** A readable stand-in for an id never seen by encode: " " + 1 to 3 syllables, fixed per id. */
function pseudoWord(id: number): string {
  let x = Math.floor(id / 3);
  let w = " ";
  for (let s = 0; s <= id % 3; s++) {
    w += CONSONANTS[x % CONSONANTS.length]! + VOWELS[Math.floor(x / CONSONANTS.length) % VOWELS.length]!;
    x = Math.floor(x / (CONSONANTS.length * VOWELS.length));
  }
  return w;
}

/**
 * encode: ids as above (BOS first when `addSpecialTokens`, default true, and `bos`). decode: special
 * ids give their marker text (vLLM's skip_special_tokens is the caller's business), ids seen by this
 * instance's encode give their piece back, any other id in range a fixed pseudo-word, and ids out of
 * range nothing. The chat template is ChatML: [BOS] then `<|im_start|>{role}\n{text}<|im_end|>\n` per
 * message, then `<|im_start|>assistant\n` when addGenerationPrompt (default true).
 */
export function createSimTokenizer(opts: SimTokenizerOptions = {}): Tokenizer {
  const vocabSize = opts.vocabSize ?? DEFAULT_VOCAB;
  if (!Number.isInteger(vocabSize) || vocabSize < SIM_RESERVED_IDS * 2 || vocabSize > 2 ** 32) {
    throw new RangeError(`sim tokenizer: vocabSize must be an integer in [${SIM_RESERVED_IDS * 2}, 2^32]`);
  }
  const bos = opts.bos ?? true;
  const reverseCap = Math.max(0, opts.reverseMapSize ?? DEFAULT_REVERSE_MAP);
  const span = vocabSize - SIM_RESERVED_IDS;
  const reverse = new Map<number, string>();

  /** Remembers text[s, e) as id's piece; a piece already held is compared in place, not copied. */
  function remember(id: number, text: string, s: number, e: number): void {
    const held = reverse.get(id);
    if (held !== undefined && held.length === e - s && text.startsWith(held, s)) return;
    reverse.delete(id);
    reverse.set(id, text.slice(s, e));
    if (reverse.size > reverseCap) reverse.delete(reverse.keys().next().value as number);
  }

  return {
    name: "sim",
    vocabSize,
    eosTokenId: SIM_EOS_ID,
    encode(text: string, addSpecialTokens = true): number[] {
      const ids: number[] = [];
      if (addSpecialTokens && bos) ids.push(SIM_BOS_ID);
      if (typeof text !== "string") return ids;
      segment(
        text,
        (id) => ids.push(id),
        (s, e) => {
          const id = SIM_RESERVED_IDS + (fnv1a(text, s, e) % span);
          ids.push(id);
          if (reverseCap > 0) remember(id, text, s, e);
        },
      );
      return ids;
    },
    decode(ids: number[]): string {
      let out = "";
      if (!Array.isArray(ids)) return out;
      for (const id of ids) {
        if (!Number.isInteger(id) || id < 0 || id >= vocabSize) continue;
        out += id < SIM_RESERVED_IDS ? SPECIAL_TEXT[id] : (reverse.get(id) ?? pseudoWord(id));
      }
      return out;
    },
    applyChatTemplate(messages: ChatMessage[], o?: { addGenerationPrompt?: boolean }): string {
      let s = bos ? SPECIAL_TEXT[SIM_BOS_ID]! : "";
      for (const m of Array.isArray(messages) ? messages : []) {
        s += `<|im_start|>${m?.role ?? "user"}\n${m ? messageText(m) : ""}<|im_end|>\n`;
      }
      if (o?.addGenerationPrompt ?? true) s += "<|im_start|>assistant\n";
      return s;
    },
  };
}
