/**
 * The approximate prefix index: which endpoints were sent which prefix blocks. One LRU per
 * endpoint (a Map in insertion order: O(1) touch, insert and evict) plus, per block, the slots of
 * the endpoints holding it. Endpoints get small integer slots so matching counts into a typed array.
 *
 * Hot-path layout (the match walk is bound by cache misses, ~100 ns each): a block hash travels as
 * two int32 halves (lo, hi) packed in a Uint32Array (the little-endian layout of uint64s), never
 * as a BigInt. Blocks live in an arena of parallel typed arrays indexed by a small integer, so a
 * chain's blocks, created together, sit next to each other in memory; a Map from the low 30 bits
 * of the hash (a small-integer key, hashed inline by V8) finds a block, with the rare keys sharing
 * those bits chained. Each block remembers the block that followed it last time (`succ`), so a
 * walk along a known chain needs no table lookup. The bigint methods (add, match) are the same
 * operations for callers holding bigints.
 */

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

/** bigint hashes → packed (lo, hi) uint32 pairs. */
export function packHashes(hashes: readonly bigint[]): Uint32Array {
  const out = new Uint32Array(hashes.length * 2);
  for (let i = 0; i < hashes.length; i++) {
    const h = BigInt.asUintN(64, hashes[i]);
    out[2 * i] = Number(h & 0xffffffffn);
    out[2 * i + 1] = Number(h >> 32n);
  }
  return out;
}

/**
 * The block arena. Block b: hash (lo[b], hi[b]); next[b], the next block in its table bucket;
 * succ[b], the successor hint; its holders, kept in arrival order with swap-remove: n[b] of them,
 * the first two in s0[b] and s1[b] (most blocks have one or two), the rest in more[b].
 */
class Blocks {
  lo = new Int32Array(1024);
  hi = new Int32Array(1024);
  next = new Int32Array(1024);
  succ = new Int32Array(1024);
  n = new Int32Array(1024);
  s0 = new Int32Array(1024);
  s1 = new Int32Array(1024);
  live = new Uint8Array(1024);
  more: (number[] | null)[] = [];
  #used = 0;
  #free: number[] = [];

  alloc(lo: number, hi: number): number {
    let b = this.#free.pop();
    if (b === undefined) {
      if (this.#used === this.lo.length) this.#grow();
      b = this.#used++;
    }
    this.lo[b] = lo;
    this.hi[b] = hi;
    this.next[b] = NONE;
    this.succ[b] = NONE;
    this.n[b] = 0;
    this.live[b] = 1;
    this.more[b] = null;
    return b;
  }

  release(b: number): void {
    this.live[b] = 0;
    this.succ[b] = NONE;
    this.next[b] = NONE;
    this.more[b] = null;
    this.#free.push(b);
  }

  holder(b: number, k: number): number {
    return k === 0 ? this.s0[b] : k === 1 ? this.s1[b] : (this.more[b] as number[])[k - 2];
  }

  #setHolder(b: number, k: number, slot: number): void {
    if (k === 0) this.s0[b] = slot;
    else if (k === 1) this.s1[b] = slot;
    else (this.more[b] as number[])[k - 2] = slot;
  }

  push(b: number, slot: number): void {
    const k = this.n[b];
    if (k === 0) this.s0[b] = slot;
    else if (k === 1) this.s1[b] = slot;
    else if (k === 2) this.more[b] = [slot];
    else (this.more[b] as number[]).push(slot);
    this.n[b] = k + 1;
  }

  /** Removes holder `slot` (swapping the last holder into its place); false if it was none. */
  remove(b: number, slot: number): boolean {
    const n = this.n[b];
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
    this.n[b] = last;
    return true;
  }

  #grow(): void {
    const size = this.lo.length * 2;
    const grow32 = (a: Int32Array) => {
      const out = new Int32Array(size);
      out.set(a);
      return out;
    };
    this.lo = grow32(this.lo);
    this.hi = grow32(this.hi);
    this.next = grow32(this.next);
    this.succ = grow32(this.succ);
    this.n = grow32(this.n);
    this.s0 = grow32(this.s0);
    this.s1 = grow32(this.s1);
    const live = new Uint8Array(size);
    live.set(this.live);
    this.live = live;
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
  addPacked(endpointId: string, packed: Uint32Array, capacity: number): void {
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
      if (after !== NONE) B.succ[b] = after;
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
  matchPacked(packed: Uint32Array): PrefixMatch {
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
      const h = B.n[b];
      if (h > 0) {
        const s = B.s0[b];
        if (counts[s]++ === 0) touched[nTouched++] = s;
      }
      if (h > 1) {
        const s = B.s1[b];
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
  #resolve(packed: Uint32Array, n: number): Int32Array {
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
      const s = B.succ[prev];
      if (s !== NONE && B.live[s] === 1 && B.lo[s] === lo && B.hi[s] === hi) return s;
    }
    const b = this.#find(lo, hi);
    if (prev !== NONE && b !== NONE) B.succ[prev] = b;
    return b;
  }

  #find(lo: number, hi: number): number {
    const B = this.#b;
    let b = this.#table.get(lo & KEY_MASK) ?? NONE;
    while (b !== NONE && (B.lo[b] !== lo || B.hi[b] !== hi)) b = B.next[b];
    return b;
  }

  #insert(lo: number, hi: number): number {
    const B = this.#b;
    const b = B.alloc(lo, hi);
    const key = lo & KEY_MASK;
    const head = this.#table.get(key);
    if (head === undefined) this.#table.set(key, b);
    else {
      B.next[b] = B.next[head];
      B.next[head] = b;
    }
    this.#distinct++;
    return b;
  }

  #dropHolder(b: number, slot: number): void {
    const B = this.#b;
    if (B.remove(b, slot) && B.n[b] === 0) this.#unlink(b);
  }

  #unlink(b: number): void {
    const B = this.#b;
    const key = B.lo[b] & KEY_MASK;
    const head = this.#table.get(key) as number;
    if (head === b) {
      if (B.next[b] === NONE) this.#table.delete(key);
      else this.#table.set(key, B.next[b]);
    } else {
      let p = head;
      while (B.next[p] !== b) p = B.next[p];
      B.next[p] = B.next[b];
    }
    B.release(b);
    this.#distinct--;
  }
}
