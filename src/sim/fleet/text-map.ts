/**
 * A Map keyed by long texts (whole prompts). V8 hashes a string by its contents only up to 16,383
 * characters and by its length beyond, so a Map of 48,000 same-length 29,000-character prompts puts
 * them all in one bucket and every lookup compares against most of them: quadratic, and the
 * slowest part of a 512-replica run. Here texts are bucketed by a hash of every character and
 * compared only within their bucket.
 */

export class TextMap<V> {
  readonly #buckets = new Map<number, { text: string; value: V }[]>();
  #size = 0;

  get size(): number {
    return this.#size;
  }

  get(text: string): V | undefined {
    const bucket = this.#buckets.get(textHash(text));
    if (bucket !== undefined) for (const e of bucket) if (e.text === text) return e.value;
    return undefined;
  }

  set(text: string, value: V): void {
    const h = textHash(text);
    let bucket = this.#buckets.get(h);
    if (bucket === undefined) this.#buckets.set(h, (bucket = []));
    for (const e of bucket)
      if (e.text === text) {
        e.value = value;
        return;
      }
    bucket.push({ text, value });
    this.#size++;
  }

  clear(): void {
    this.#buckets.clear();
    this.#size = 0;
  }
}

/** FNV-1a over the UTF-16 code units, with the length folded in: a 32-bit bucket key. */
function textHash(text: string): number {
  let h = 0x811c9dc5 ^ text.length;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
