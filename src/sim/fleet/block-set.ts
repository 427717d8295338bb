/**
 * The blocks computeLimits has seen, each with a reused flag: an open-addressing table over 53-bit
 * block hashes in two typed arrays. A 512-replica shared-prefix run has 7M distinct blocks, which a
 * Map holds in about 350 MB (boxed keys, then twice that while it grows); this holds them in 9 bytes
 * a slot at most half full.
 */

export const ABSENT = -1;
export const COMPUTED = 0;
export const REUSED = 1;

export class BlockSet {
  #keys = new Float64Array(1 << 12);
  /** 0: empty slot; else 1 + COMPUTED or 1 + REUSED. */
  #states = new Uint8Array(1 << 12);
  #size = 0;

  get size(): number {
    return this.#size;
  }

  /** ABSENT, COMPUTED or REUSED. */
  state(block: number): number {
    const s = this.#states[this.#slot(block)];
    return s === 0 ? ABSENT : s - 1;
  }

  /** Records `block` as COMPUTED unless it is already there. */
  add(block: number): void {
    const i = this.#slot(block);
    if (this.#states[i] !== 0) return;
    this.#keys[i] = block;
    this.#states[i] = 1 + COMPUTED;
    if (2 * ++this.#size > this.#keys.length) this.#grow();
  }

  /** Marks a present block REUSED. */
  markReused(block: number): void {
    const i = this.#slot(block);
    if (this.#states[i] === 0) throw new Error(`BlockSet: block ${block} is not there`);
    this.#states[i] = 1 + REUSED;
  }

  /** The slot holding `block`, or the empty one where it would go. */
  #slot(block: number): number {
    const keys = this.#keys;
    const states = this.#states;
    const mask = keys.length - 1;
    // murmur3's finaliser over the key's low 32 bits mixed with its high ones.
    let h = (block >>> 0) ^ Math.imul(Math.floor(block / 4294967296), 0x9e3779b1);
    h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    let i = (h ^ (h >>> 16)) & mask;
    while (states[i] !== 0 && keys[i] !== block) i = (i + 1) & mask;
    return i;
  }

  #grow(): void {
    const keys = this.#keys;
    const states = this.#states;
    this.#keys = new Float64Array(keys.length * 2);
    this.#states = new Uint8Array(keys.length * 2);
    for (let i = 0; i < keys.length; i++)
      if (states[i] !== 0) {
        const j = this.#slot(keys[i]);
        this.#keys[j] = keys[i];
        this.#states[j] = states[i];
      }
  }
}
