/**
 * Typed-array storage behind the approximate prefix index (indexer.ts): block records with their
 * holders, and the per-endpoint LRU lists. No JS object or Map per block or per (endpoint, block)
 * entry: in steady state nothing is allocated, and a match walk reads one cache line per two
 * blocks of a chain (bench:picker).
 *
 * Block b is a 32-byte record at b·STRIDE in `m`: its hash (LO, HI); field 2 unused; SUCC, the
 * block that followed it last time (a walk hint); COUNT holders (−1 once released); the slots of
 * holders 0 and 1 in S0 and S1; holders from 2 on in a pool chunk at MORE.
 * Each holder also has an LRU entry id: holders 0 and 1 in `ent` (two per block), the rest next to
 * their slots in the pool chunk, as (slot, entry) pairs.
 */

export const NONE = -1;

const LO = 0;
const HI = 1;
const SUCC = 3;
const COUNT = 4;
const S0 = 5;
const MORE = 7;
/** int32 fields per block: two records per 64-byte cache line. */
const STRIDE = 8;
/** A pool chunk of class c holds CHUNK0 << c (slot, entry) pairs after a header word (c). */
const CHUNK0 = 4;

export class Blocks {
  m = new Int32Array(1024 * STRIDE);
  ent = new Int32Array(1024 * 2);
  pool = new Int32Array(1024);
  #poolUsed = 0;
  readonly #poolFree: number[][] = [];
  #used = 0;
  readonly #free: number[] = [];

  alloc(lo: number, hi: number): number {
    let b = this.#free.pop();
    if (b === undefined) {
      if ((this.#used + 1) * STRIDE > this.m.length) this.#grow();
      b = this.#used++;
    }
    const o = b * STRIDE;
    const m = this.m;
    m[o + LO] = lo;
    m[o + HI] = hi;
    m[o + SUCC] = NONE;
    m[o + COUNT] = 0;
    m[o + MORE] = NONE;
    return b;
  }

  /** Frees a block with no holders. */
  release(b: number): void {
    const o = b * STRIDE;
    this.m[o + COUNT] = NONE;
    this.m[o + SUCC] = NONE;
    this.#free.push(b);
  }

  lo(b: number): number {
    return this.m[b * STRIDE + LO];
  }

  hi(b: number): number {
    return this.m[b * STRIDE + HI];
  }

  setSucc(b: number, v: number): void {
    this.m[b * STRIDE + SUCC] = v;
  }

  count(b: number): number {
    return this.m[b * STRIDE + COUNT];
  }

  /** Whether `b` is a live block with hash (lo, hi) (false past the allocated ids). */
  is(b: number, lo: number, hi: number): boolean {
    if (b >= this.#used) return false;
    const m = this.m;
    const o = b * STRIDE;
    return m[o + LO] === lo && m[o + HI] === hi && m[o + COUNT] >= 0;
  }

  /** `prev`'s successor hint if it is live and has hash (lo, hi), else NONE. */
  successor(prev: number, lo: number, hi: number): number {
    const m = this.m;
    const s = m[prev * STRIDE + SUCC];
    if (s === NONE) return NONE;
    const o = s * STRIDE;
    return m[o + LO] === lo && m[o + HI] === hi && m[o + COUNT] >= 0 ? s : NONE;
  }

  /** Adds 1 to counts[slot] of each holder of `b`; records slots seen for the first time. */
  countHolders(b: number, counts: Int32Array, touched: Int32Array, nTouched: number): number {
    const m = this.m;
    const o = b * STRIDE;
    const h = m[o + COUNT];
    for (let k = 0; k < h && k < 2; k++) {
      const s = m[o + S0 + k];
      if (counts[s]++ === 0) touched[nTouched++] = s;
    }
    if (h > 2) {
      const pool = this.pool;
      const p = m[o + MORE] + 1;
      const end = p + 2 * (h - 2);
      for (let q = p; q < end; q += 2) {
        const s = pool[q];
        if (counts[s]++ === 0) touched[nTouched++] = s;
      }
    }
    return nTouched;
  }

  /** The LRU entry of holder `slot` of block `b`, or NONE if `slot` does not hold it. */
  entryOf(b: number, slot: number): number {
    const k = this.#indexOf(b, slot);
    if (k < 0) return NONE;
    return k < 2 ? this.ent[2 * b + k] : this.pool[this.m[b * STRIDE + MORE] + 2 + 2 * (k - 2)];
  }

  /** Adds holder `slot` (its LRU entry `entry`) to block `b`. */
  push(b: number, slot: number, entry: number): void {
    const m = this.m;
    const o = b * STRIDE;
    const k = m[o + COUNT];
    if (k < 2) {
      m[o + S0 + k] = slot;
      this.ent[2 * b + k] = entry;
    } else {
      let p = m[o + MORE];
      if (p === NONE) p = m[o + MORE] = this.#chunk(0);
      else if (k - 2 === CHUNK0 << this.pool[p]) p = m[o + MORE] = this.#regrow(p, k - 2);
      this.pool[p + 1 + 2 * (k - 2)] = slot;
      this.pool[p + 2 + 2 * (k - 2)] = entry;
    }
    m[o + COUNT] = k + 1;
  }

  /** Removes holder `slot` from `b` (the last holder takes its place); false if it was none. */
  remove(b: number, slot: number): boolean {
    const k = this.#indexOf(b, slot);
    if (k < 0) return false;
    const m = this.m;
    const o = b * STRIDE;
    const last = m[o + COUNT] - 1;
    const pool = this.pool;
    const p = m[o + MORE];
    if (k !== last) {
      const s = last < 2 ? m[o + S0 + last] : pool[p + 1 + 2 * (last - 2)];
      const e = last < 2 ? this.ent[2 * b + last] : pool[p + 2 + 2 * (last - 2)];
      if (k < 2) {
        m[o + S0 + k] = s;
        this.ent[2 * b + k] = e;
      } else {
        pool[p + 1 + 2 * (k - 2)] = s;
        pool[p + 2 + 2 * (k - 2)] = e;
      }
    }
    if (last === 2) {
      this.#poolFree[pool[p]].push(p);
      m[o + MORE] = NONE;
    }
    m[o + COUNT] = last;
    return true;
  }

  #indexOf(b: number, slot: number): number {
    const m = this.m;
    const o = b * STRIDE;
    const h = m[o + COUNT];
    if (h > 0 && m[o + S0] === slot) return 0;
    if (h > 1 && m[o + S0 + 1] === slot) return 1;
    if (h > 2) {
      const pool = this.pool;
      const p = m[o + MORE] + 1;
      for (let k = 2; k < h; k++) if (pool[p + 2 * (k - 2)] === slot) return k;
    }
    return NONE;
  }

  /** A free pool chunk of class c. */
  #chunk(c: number): number {
    const free = (this.#poolFree[c] ??= []);
    const reused = free.pop();
    if (reused !== undefined) return reused;
    const size = 1 + 2 * (CHUNK0 << c);
    if (this.#poolUsed + size > this.pool.length) {
      const grown = new Int32Array(Math.max(this.pool.length * 2, this.#poolUsed + size));
      grown.set(this.pool);
      this.pool = grown;
    }
    const p = this.#poolUsed;
    this.#poolUsed += size;
    this.pool[p] = c;
    return p;
  }

  /** Moves the `n` pairs of full chunk `p` into a chunk of the next class. */
  #regrow(p: number, n: number): number {
    const c = this.pool[p];
    const q = this.#chunk(c + 1);
    const pool = this.pool; // after #chunk, which may have grown it
    pool.copyWithin(q + 1, p + 1, p + 1 + 2 * n);
    this.#poolFree[c].push(p);
    return q;
  }

  #grow(): void {
    const m = new Int32Array(this.m.length * 2);
    m.set(this.m);
    this.m = m;
    const ent = new Int32Array(this.ent.length * 2);
    ent.set(this.ent);
    this.ent = ent;
  }
}

const PREV = 0;
const ENEXT = 1;
const BLOCK = 2;
const ESTRIDE = 4;

/** One endpoint's LRU list of its entries: head is the least recently used, tail the most. */
export interface LruList {
  head: number;
  tail: number;
  size: number;
}

/** (endpoint, block) entries, each in its endpoint's doubly linked LRU list. */
export class Entries {
  e = new Int32Array(1024 * ESTRIDE);
  #used = 0;
  #free = NONE;

  block(x: number): number {
    return this.e[x * ESTRIDE + BLOCK];
  }

  /** A new entry for `block`, appended as the most recently used of `list`. */
  add(list: LruList, block: number): number {
    let x = this.#free;
    if (x !== NONE) this.#free = this.e[x * ESTRIDE + ENEXT];
    else {
      if ((this.#used + 1) * ESTRIDE > this.e.length) {
        const grown = new Int32Array(this.e.length * 2);
        grown.set(this.e);
        this.e = grown;
      }
      x = this.#used++;
    }
    this.e[x * ESTRIDE + BLOCK] = block;
    this.#append(list, x);
    list.size++;
    return x;
  }

  /** Makes `x` the most recently used of `list`. */
  touch(list: LruList, x: number): void {
    if (list.tail === x) return;
    this.#unlink(list, x);
    this.#append(list, x);
  }

  /** Unlinks and frees `x`. */
  delete(list: LruList, x: number): void {
    this.#unlink(list, x);
    list.size--;
    this.e[x * ESTRIDE + ENEXT] = this.#free;
    this.#free = x;
  }

  #append(list: LruList, x: number): void {
    const e = this.e;
    e[x * ESTRIDE + PREV] = list.tail;
    e[x * ESTRIDE + ENEXT] = NONE;
    if (list.tail !== NONE) e[list.tail * ESTRIDE + ENEXT] = x;
    else list.head = x;
    list.tail = x;
  }

  #unlink(list: LruList, x: number): void {
    const e = this.e;
    const p = e[x * ESTRIDE + PREV];
    const n = e[x * ESTRIDE + ENEXT];
    if (p !== NONE) e[p * ESTRIDE + ENEXT] = n;
    else list.head = n;
    if (n !== NONE) e[n * ESTRIDE + PREV] = p;
    else list.tail = p;
  }
}
