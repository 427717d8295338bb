/**
 * The approximate prefix index: which endpoints were sent which prefix blocks. One LRU per
 * endpoint (a Map in insertion order: O(1) touch, insert and evict) plus, per block, the slots of
 * the endpoints holding it. Endpoints get small integer slots so matching counts into a typed array.
 *
 * Hot-path layout (the match walk is bound by cache misses, ~100 ns each): a block hash travels as
 * two 32-bit halves (lo, hi) packed in a plain array (PackedHashes, the little-endian layout of uint64s), never
 * as a BigInt. Blocks live in an arena of 32-byte records indexed by a small integer, so a
 * chain's blocks, created together, sit next to each other in memory; a Map from the low 30 bits
 * of the hash (a small-integer key, hashed inline by V8) finds a block, with the rare keys sharing
 * those bits chained. Each block remembers the block that followed it last time (`succ`), so a
 * walk along a known chain needs no table lookup. The bigint methods (add, match) are the same
 * operations for callers holding bigints.
 */

import type { PackedHashes } from "../../hash.ts";

interface EndpointEntry {
  slot: number;
  /** Block ids, least recently used first. */
  lru: Map<number, true>;
}

/** Per-endpoint matched block counts of one lookup, snapshotted (safe after later index edits). */
export interface PrefixMatch {
  /** Blocks walked before the first block no endpoint holds. */
  depth: number;
  counts: Map<string, number>;
}

const KEY_MASK = 0x3fffffff;
const NONE = -1;

/** bigint hashes → PackedHashes (int32 halves). */
export function packHashes(hashes: readonly bigint[]): number[] {
  const out = new Array<number>(hashes.length * 2);
  for (let i = 0; i < hashes.length; i++) {
    const h = BigInt.asUintN(64, hashes[i]);
    out[2 * i] = Number(BigInt.asIntN(32, h));
    out[2 * i + 1] = Number(BigInt.asIntN(32, h >> 32n));
  }
  return out;
}

/** Fields of a block's record in the arena (int32 each, STRIDE per block). */
const LO = 0;
const HI = 1;
const NEXT = 2;
const SUCC = 3;
const COUNT = 4;
const S0 = 5;
const S1 = 6;
const LIVE = 7;
/** 32 bytes: two block records per 64-byte cache line. */
const STRIDE = 8;

/**
 * The block arena: one Int32Array of fixed-size records, so everything a match walk reads about a
 * block (hash, successor hint, holder count, first two holders) is in one cache line, and a chain's
 * blocks, allocated together, are adjacent: a cold walk costs one miss per two blocks instead of
 * one per field. Block b's record starts at b·STRIDE: its hash (LO, HI); NEXT, the next block in
 * its table bucket; SUCC, the successor hint; COUNT holders kept in arrival order with
 * swap-remove, the first two in S0 and S1 (most blocks have one or two), the rest in more[b]; LIVE.
 */
class Blocks {
  m = new Int32Array(1024 * STRIDE);
  more: (number[] | null)[] = [];
  #used = 0;
  #free: number[] = [];

  alloc(lo: number, hi: number): number {
    let b = this.#free.pop();
    if (b === undefined) {
      if ((this.#used + 1) * STRIDE > this.m.length) this.#grow();
      b = this.#used++;
    }
    const m = this.m;
    const o = b * STRIDE;
    m[o + LO] = lo;
    m[o + HI] = hi;
    m[o + NEXT] = NONE;
    m[o + SUCC] = NONE;
    m[o + COUNT] = 0;
    m[o + LIVE] = 1;
    this.more[b] = null;
    return b;
  }

  release(b: number): void {
    const o = b * STRIDE;
    this.m[o + LIVE] = 0;
    this.m[o + SUCC] = NONE;
    this.m[o + NEXT] = NONE;
    this.more[b] = null;
    this.#free.push(b);
  }

  get(b: number, field: number): number {
    return this.m[b * STRIDE + field];
  }

  set(b: number, field: number, v: number): void {
    this.m[b * STRIDE + field] = v;
  }

  holder(b: number, k: number): number {
    return k < 2 ? this.m[b * STRIDE + S0 + k] : (this.more[b] as number[])[k - 2];
  }

  #setHolder(b: number, k: number, slot: number): void {
    if (k < 2) this.m[b * STRIDE + S0 + k] = slot;
    else (this.more[b] as number[])[k - 2] = slot;
  }

  push(b: number, slot: number): void {
    const o = b * STRIDE;
    const k = this.m[o + COUNT];
    if (k < 2) this.m[o + S0 + k] = slot;
    else if (k === 2) this.more[b] = [slot];
    else (this.more[b] as number[]).push(slot);
    this.m[o + COUNT] = k + 1;
  }

  /** Removes holder `slot` (swapping the last holder into its place); false if it was none. */
  remove(b: number, slot: number): boolean {
    const n = this.m[b * STRIDE + COUNT];
    let k = 0;
    while (k < n && this.holder(b, k) !== slot) k++;
    if (k === n) return false;
    const last = n - 1;
    this.#setHolder(b, k, this.holder(b, last));
    if (last >= 2) {
      const more = this.more[b] as number[];
      more.pop();
      if (more.length === 0) this.more[b] = null;
    }
    this.m[b * STRIDE + COUNT] = last;
    return true;
  }

  #grow(): void {
    const out = new Int32Array(this.m.length * 2);
    out.set(this.m);
    this.m = out;
  }
}

export class ApproxPrefixIndex {
  readonly #endpoints = new Map<string, EndpointEntry>();
  /** Low 30 bits of a hash → first block of that bucket. */
  readonly #table = new Map<number, number>();
  readonly #b = new Blocks();
  readonly #slotIds: (string | null)[] = [];
  readonly #freeSlots: number[] = [];
  #scratch = new Int32Array(64);
  #touched = new Int32Array(64);
  #resolved = new Int32Array(64);
  #entries = 0;
  #distinct = 0;

  /**
   * Records that `endpointId` now caches `hashes`. Inserted last block first, so block 0 is the
   * most recently used and a prefix outlives its suffix under eviction (llm-d inserts in order,
   * which evicts block 0 first and hides the rest of the chain from the walk).
   */
  add(endpointId: string, hashes: readonly bigint[], capacity: number): void {
    this.addPacked(endpointId, packHashes(hashes), capacity);
  }

  /** add() for hashes packed as (lo, hi) uint32 pairs. */
  addPacked(endpointId: string, packed: PackedHashes, capacity: number): void {
    const n = packed.length >>> 1;
    if (capacity <= 0 || n === 0) return;
    const e = this.#entry(endpointId);
    const lru = e.lru;
    const B = this.#b;
    const resolved = this.#resolve(packed, n);
    let after = NONE;
    for (let i = n - 1; i >= 0; i--) {
      let b = resolved[i];
      if (b === NONE) {
        const lo = packed[2 * i] | 0;
        const hi = packed[2 * i + 1] | 0;
        // Looked up again: the same hash may occur twice in one chain.
        b = this.#find(lo, hi);
        if (b === NONE) b = this.#insert(lo, hi);
      }
      if (after !== NONE) B.set(b, SUCC, after);
      after = b;
      if (lru.has(b)) {
        lru.delete(b);
        lru.set(b, true);
        continue;
      }
      lru.set(b, true);
      this.#entries++;
      B.push(b, e.slot);
    }
    while (lru.size > capacity) {
      const oldest = lru.keys().next().value as number;
      lru.delete(oldest);
      this.#entries--;
      this.#dropHolder(oldest, e.slot);
    }
  }

  /**
   * Walks `hashes` from block 0, stopping at the first block no endpoint holds; every holder of a
   * walked block gets +1 (llm-d matchLongestPrefix semantics).
   */
  match(hashes: readonly bigint[]): PrefixMatch {
    return this.matchPacked(packHashes(hashes));
  }

  /** match() for hashes packed as (lo, hi) uint32 pairs. */
  matchPacked(packed: PackedHashes): PrefixMatch {
    const slots = this.#slotIds.length;
    if (this.#scratch.length < slots) {
      this.#scratch = new Int32Array(slots * 2);
      this.#touched = new Int32Array(slots * 2);
    }
    const counts = this.#scratch;
    const touched = this.#touched;
    const B = this.#b;
    let nTouched = 0;
    const n = packed.length >>> 1;
    let depth = 0;
    let prev = NONE;
    for (; depth < n; depth++) {
      const b = this.#next(prev, packed[2 * depth] | 0, packed[2 * depth + 1] | 0);
      if (b === NONE) break;
      const o = b * STRIDE;
      const m = B.m;
      const h = m[o + COUNT];
      if (h > 0) {
        const s = m[o + S0];
        if (counts[s]++ === 0) touched[nTouched++] = s;
      }
      if (h > 1) {
        const s = m[o + S1];
        if (counts[s]++ === 0) touched[nTouched++] = s;
      }
      if (h > 2) {
        const more = B.more[b] as number[];
        for (let j = 0; j < more.length; j++) {
          const s = more[j];
          if (counts[s]++ === 0) touched[nTouched++] = s;
        }
      }
      prev = b;
    }
    const out = new Map<string, number>();
    for (let k = 0; k < nTouched; k++) {
      const s = touched[k];
      out.set(this.#slotIds[s] as string, counts[s]);
      counts[s] = 0;
    }
    return { depth, counts: out };
  }

  remove(endpointId: string): void {
    const e = this.#endpoints.get(endpointId);
    if (e === undefined) return;
    for (const b of e.lru.keys()) this.#dropHolder(b, e.slot);
    this.#entries -= e.lru.size;
    this.#endpoints.delete(endpointId);
    this.#slotIds[e.slot] = null;
    this.#freeSlots.push(e.slot);
  }

  /** Removes every endpoint not in `pool`. */
  retain(pool: ReadonlySet<string>): void {
    for (const id of [...this.#endpoints.keys()]) if (!pool.has(id)) this.remove(id);
  }

  /** (endpoint, block) entries across all endpoints. */
  get size(): number {
    return this.#entries;
  }

  /** Distinct block hashes held by at least one endpoint. */
  get distinctBlocks(): number {
    return this.#distinct;
  }

  get endpointCount(): number {
    return this.#endpoints.size;
  }

  blocksOf(endpointId: string): number {
    return this.#endpoints.get(endpointId)?.lru.size ?? 0;
  }

  #entry(endpointId: string): EndpointEntry {
    let e = this.#endpoints.get(endpointId);
    if (e === undefined) {
      const slot = this.#freeSlots.pop() ?? this.#slotIds.length;
      this.#slotIds[slot] = endpointId;
      e = { slot, lru: new Map() };
      this.#endpoints.set(endpointId, e);
    }
    return e;
  }

  /** The block ids of `packed` (NONE where not indexed), walking successor hints; reused buffer. */
  #resolve(packed: PackedHashes, n: number): Int32Array {
    if (this.#resolved.length < n) this.#resolved = new Int32Array(n * 2);
    const out = this.#resolved;
    let prev = NONE;
    for (let i = 0; i < n; i++) {
      const b = this.#next(prev, packed[2 * i] | 0, packed[2 * i + 1] | 0);
      out[i] = b;
      prev = b;
    }
    return out;
  }

  /** The block (lo, hi), trying `prev`'s successor hint before the table; records the hint. */
  #next(prev: number, lo: number, hi: number): number {
    const B = this.#b;
    if (prev !== NONE) {
      const m = B.m;
      const s = m[prev * STRIDE + SUCC];
      if (s !== NONE) {
        const o = s * STRIDE;
        if (m[o + LO] === lo && m[o + HI] === hi && m[o + LIVE] === 1) return s;
      }
    }
    const b = this.#find(lo, hi);
    if (prev !== NONE && b !== NONE) B.set(prev, SUCC, b);
    return b;
  }

  #find(lo: number, hi: number): number {
    const B = this.#b;
    const m = B.m;
    let b = this.#table.get(lo & KEY_MASK) ?? NONE;
    while (b !== NONE && (m[b * STRIDE + LO] !== lo || m[b * STRIDE + HI] !== hi)) b = m[b * STRIDE + NEXT];
    return b;
  }

  #insert(lo: number, hi: number): number {
    const B = this.#b;
    const b = B.alloc(lo, hi);
    const key = lo & KEY_MASK;
    const head = this.#table.get(key);
    if (head === undefined) this.#table.set(key, b);
    else {
      B.set(b, NEXT, B.get(head, NEXT));
      B.set(head, NEXT, b);
    }
    this.#distinct++;
    return b;
  }

  #dropHolder(b: number, slot: number): void {
    const B = this.#b;
    if (B.remove(b, slot) && B.get(b, COUNT) === 0) this.#unlink(b);
  }

  #unlink(b: number): void {
    const B = this.#b;
    const key = B.get(b, LO) & KEY_MASK;
    const head = this.#table.get(key) as number;
    const next = B.get(b, NEXT);
    if (head === b) {
      if (next === NONE) this.#table.delete(key);
      else this.#table.set(key, next);
    } else {
      let p = head;
      while (B.get(p, NEXT) !== b) p = B.get(p, NEXT);
      B.set(p, NEXT, next);
    }
    B.release(b);
    this.#distinct--;
  }
}
