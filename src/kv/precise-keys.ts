/**
 * The request-key table of the precise index: 64-bit request keys (as lo/hi uint32 halves) interned
 * into records, each record heading the list of its (key, endpoint) entries. Open addressing with
 * linear probing and backward-shift deletion; a slot packs an 8-bit fingerprint of the hash with the
 * 24-bit record index, so a probe passing other records rarely touches their arrays. Also the hashing
 * helpers the entry store's engine-hash table shares. Pure.
 */

export const NIL = -1;
/** Record bits of a table slot. */
export const REC = 0xffffff;
/** Records are 24-bit in table slots. */
export const MAX_ENTRIES = 0xfffffe;

export function mix(a: number, b: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ b;
  h = Math.imul(h ^ (h >>> 16), 0xc2b2ae35);
  return (h ^ (h >>> 13)) >>> 0;
}

export function pow2AtLeast(n: number): number {
  let p = 16;
  while (p < n) p *= 2;
  return p;
}

/** True when `home` lies cyclically in (hole, j]: the record at j must stay (it cannot move before its home). */
export function between(hole: number, home: number, j: number): boolean {
  return hole <= j ? hole < home && home <= j : hole < home || home <= j;
}

/** A freed record's head (a live record's head is its first entry, ≥ 0). */
const FREE = -2;

export class KeyTable {
  count = 0;
  /**
   * Records, 4 int32s each, so a probe reads one cache line: [4k] = key lo, [4k+1] = key hi (int32
   * bits), [4k+2] = head: the first entry of the key's list (FREE for a freed record), [4k+3] = the
   * next free record of a freed one. A run of keys stored together gets consecutive records, which
   * findNext() exploits.
   */
  rec = new Int32Array(0);
  private cap = 0;
  private free = NIL;
  private used = 0;
  private slots = new Int32Array(16);

  constructor(
    initial: number,
    private readonly max: number,
  ) {
    this.grow(initial);
  }

  clear(): void {
    this.count = this.used = 0;
    this.free = NIL;
    this.slots.fill(0);
  }

  bytes(): number {
    return this.slots.byteLength + this.rec.byteLength;
  }

  lo(k: number): number {
    return this.rec[4 * k];
  }

  hi(k: number): number {
    return this.rec[4 * k + 1];
  }

  /** First entry of the key's list (NIL if empty). */
  head(k: number): number {
    return this.rec[4 * k + 2];
  }

  setHead(k: number, e: number): void {
    this.rec[4 * k + 2] = e;
  }

  find(lo: number, hi: number): number {
    lo |= 0;
    hi |= 0;
    const slots = this.slots;
    const rec = this.rec;
    const mask = slots.length - 1;
    const h = mix(lo, hi);
    const fp = h >>> 24;
    for (let i = h & mask; ; i = (i + 1) & mask) {
      const v = slots[i];
      if (v === 0) return NIL;
      if (v >>> 24 === fp) {
        const r = (v & REC) - 1;
        if (rec[4 * r] === lo && rec[4 * r + 1] === hi) return r;
      }
    }
  }

  /**
   * find(lo, hi), trying first the record after `prev` (the previous block's): the next block of a
   * chain stored in one run. Any live record holding (lo, hi) is its record, so the shortcut is exact.
   */
  findNext(prev: number, lo: number, hi: number): number {
    const n = prev + 1;
    const rec = this.rec;
    if (n < this.used && rec[4 * n + 2] >= 0 && rec[4 * n] === (lo | 0) && rec[4 * n + 1] === (hi | 0))
      return n;
    return this.find(lo, hi);
  }

  /** The record of (lo, hi), added (with an empty entry list) if absent. */
  getOrAdd(lo: number, hi: number): number {
    lo |= 0;
    hi |= 0;
    // Grow before probing: growth rehashes and would move the slot found below.
    if (this.free === NIL && this.used === this.cap) this.grow(Math.min(this.cap * 2, this.max));
    if ((this.count + 1) * 2 > this.slots.length) this.rehash(this.slots.length * 2);
    const slots = this.slots;
    const rec = this.rec;
    const mask = slots.length - 1;
    const h = mix(lo, hi);
    const fp = h >>> 24;
    let i = h & mask;
    for (; ; i = (i + 1) & mask) {
      const v = slots[i];
      if (v === 0) break;
      if (v >>> 24 === fp) {
        const r = (v & REC) - 1;
        if (rec[4 * r] === lo && rec[4 * r + 1] === hi) return r;
      }
    }
    let k = this.free;
    if (k !== NIL) this.free = rec[4 * k + 3];
    else k = this.used++;
    rec[4 * k] = lo;
    rec[4 * k + 1] = hi;
    rec[4 * k + 2] = NIL;
    this.count++;
    slots[i] = (fp << 24) | (k + 1);
    return k;
  }

  /** Frees a record whose entry list is empty. */
  remove(k: number): void {
    const slots = this.slots;
    const rec = this.rec;
    const mask = slots.length - 1;
    let i = mix(rec[4 * k], rec[4 * k + 1]) & mask;
    while ((slots[i] & REC) !== k + 1) i = (i + 1) & mask;
    let hole = i;
    slots[hole] = 0;
    for (let j = (hole + 1) & mask; slots[j] !== 0; j = (j + 1) & mask) {
      const r = (slots[j] & REC) - 1;
      if (between(hole, mix(rec[4 * r], rec[4 * r + 1]) & mask, j)) continue;
      slots[hole] = slots[j];
      slots[j] = 0;
      hole = j;
    }
    rec[4 * k + 2] = FREE;
    rec[4 * k + 3] = this.free;
    this.free = k;
    this.count--;
  }

  private grow(cap: number): void {
    const rec = new Int32Array(cap * 4);
    rec.set(this.rec);
    this.rec = rec;
    this.cap = cap;
    if (cap * 2 > this.slots.length) this.rehash(pow2AtLeast(cap * 2));
  }

  private rehash(size: number): void {
    const old = this.slots;
    const rec = this.rec;
    this.slots = new Int32Array(size);
    const mask = size - 1;
    for (const r of old) {
      if (r === 0) continue;
      const k = (r & REC) - 1;
      let i = mix(rec[4 * k], rec[4 * k + 1]) & mask;
      while (this.slots[i] !== 0) i = (i + 1) & mask;
      this.slots[i] = r;
    }
  }
}
