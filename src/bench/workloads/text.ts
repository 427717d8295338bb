/**
 * Seeded pseudo-word text of a requested token length. Every word is three lowercase letters
 * (consonant-vowel-consonant) and words are joined by single spaces, so n words are 4n − 1
 * characters: about n tokens for the simulator tokenizer (~4 characters per token) and a
 * whitespace-word tokenizer alike. Real BPE tokenizers give a different but stable count.
 */
import type { Rng } from "./sampling.ts";
import { streamRng } from "./sampling.ts";

/** Characters per generated token (word plus its separating space). */
export const CHARS_PER_TOKEN = 4;

const CONSONANTS = "bcdfghjklmnprstvwz";
const VOWELS = "aeiou";

/** The 1,620 CVC words. */
export const WORDS: readonly string[] = (() => {
  const out: string[] = [];
  for (const a of CONSONANTS) for (const b of VOWELS) for (const c of CONSONANTS) out.push(a + b + c);
  return out;
})();

/** n random words joined by spaces ("" for n ≤ 0). */
export function randomWords(rng: Rng, n: number): string {
  if (n <= 0) return "";
  const parts = new Array<string>(n);
  for (let i = 0; i < n; i++) parts[i] = WORDS[rng.int(WORDS.length)];
  return parts.join(" ");
}

/** Approximate token count of generated text (exact for randomWords output with the 4-char rule). */
export function approxTokens(text: string): number {
  return Math.ceil(text.length / CHARS_PER_TOKEN);
}

/** Joins non-empty pieces with one space, as a prefix and a question are joined in a prompt. */
export function joinText(...pieces: string[]): string {
  return pieces.filter((p) => p.length > 0).join(" ");
}

/**
 * A long seeded text from which requests take word-aligned slices. Slicing shares memory with the
 * pool, so tens of thousands of long unique-looking prompts cost little; callers put a fresh random
 * head in front of each slice so no two prompts share a first block.
 */
export class TextPool {
  readonly text: string;
  readonly words: number;

  constructor(seed: number, words: number) {
    this.words = words;
    this.text = randomWords(streamRng(seed, "text-pool"), words);
  }

  /** n words starting at word `offset` (taken modulo the pool; n must be ≤ pool size). */
  slice(offset: number, n: number): string {
    if (n <= 0) return "";
    if (n > this.words) throw new RangeError(`TextPool.slice: ${n} words asked, pool has ${this.words}`);
    const start = offset % (this.words - n + 1);
    return this.text.slice(start * CHARS_PER_TOKEN, (start + n) * CHARS_PER_TOKEN - 1);
  }
}

/**
 * Text that is a pure function of (seed, key): the same key gives the same words in any workload
 * generated with that seed. Used for trace block hashes and shared prefixes named by a key.
 */
export class KeyedText {
  readonly #seed: number;
  readonly #cache = new Map<string, string>();

  constructor(seed: number) {
    this.#seed = seed;
  }

  get(key: string, words: number): string {
    const k = `${key}\u0000${words}`;
    let t = this.#cache.get(k);
    if (t === undefined) {
      t = randomWords(streamRng(this.#seed, `keyed:${key}`), words);
      this.#cache.set(k, t);
    }
    return t;
  }
}
