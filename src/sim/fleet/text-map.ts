/**
 * A Map keyed by long texts (whole prompts). V8 hashes a string by its contents only up to 16,383
 * characters and by its length beyond, so a Map of 48,000 same-length 29,000-character prompts puts
 * them all in one bucket and every lookup compares against most of them: quadratic, and the
 * slowest part of a 512-replica run. Here texts are bucketed by a hash of a sample of their
 * characters — 64 spread over the whole text and the last 256, since prompts of one group share a
 * long head and differ in their tail — and compared only within their bucket: a lookup costs a few
 * hundred characters, not the prompt's 29,000. Texts that differ only between sampled characters
 * share a bucket and are told apart by comparison, so the map is exact whatever the texts.
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

const SPREAD = 64;
const TAIL = 256;

/** FNV-1a over the sampled UTF-16 code units (every one of a short text), with the length folded in. */
function textHash(text: string): number {
  const n = text.length;
  let h = 0x811c9dc5 ^ n;
  if (n <= SPREAD + TAIL) {
    for (let i = 0; i < n; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
    return h >>> 0;
  }
  const head = n - TAIL;
  for (let k = 0; k < SPREAD; k++)
    h = Math.imul(h ^ text.charCodeAt(Math.floor((k * head) / SPREAD)), 0x01000193);
  for (let i = head; i < n; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
