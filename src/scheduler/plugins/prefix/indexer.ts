/**
 * The approximate prefix index: which endpoints were sent which prefix blocks. One LRU list per
 * endpoint (O(1) touch, insert and evict) plus, per block, the slots of the endpoints holding it,
 * all in typed arrays (block-arena.ts). Endpoints get small integer slots so matching counts into a
 * typed array.
 *
 * Hot-path layout (a cold walk is bound by cache misses): a block hash travels as two 32-bit
 * halves (lo, hi) packed in a plain array (PackedHashes), never as a BigInt. Blocks live in an
 * arena of 32-byte records indexed by a small integer, and a chain's blocks, created together in
 * chain order, have consecutive ids, so a walk tries b + 1 first, then the block that followed b
 * last time (`succ`), and only then the hash table (block-table.ts). The bigint methods (add,
 * match) are the same operations for callers holding bigints.
 */

import type { PackedHashes } from "../../hash.ts";
import { Blocks, Entries, type LruList, NONE } from "./block-arena.ts";
import { BlockTable } from "./block-table.ts";

interface EndpointEntry extends LruList {
  slot: number;
}

/** Per-endpoint matched block counts of one lookup, snapshotted (safe after later index edits). */
export interface PrefixMatch {
  /** Blocks walked before the first block no endpoint holds. */
  depth: number;
  counts: Map<string, number>;
}

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

export class ApproxPrefixIndex {
  readonly #endpoints = new Map<string, EndpointEntry>();
  /** Block hash → block id. */
  readonly #table = new BlockTable();
  readonly #b = new Blocks();
  readonly #lru = new Entries();
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

  /** add() for PackedHashes. */
  addPacked(endpointId: string, packed: PackedHashes, capacity: number): void {
    const n = packed.length >>> 1;
    if (capacity <= 0 || n === 0) return;
    const e = this.#entry(endpointId);
    const B = this.#b;
    const L = this.#lru;
    const resolved = this.#resolve(packed, n);
    // New blocks are created in chain order, so a chain's blocks get consecutive ids (the match
    // walk tries b + 1 first). Looked up again: the same hash may occur twice in one chain.
    for (let i = 0; i < n; i++) {
      if (resolved[i] !== NONE) continue;
      const lo = packed[2 * i] | 0;
      const hi = packed[2 * i + 1] | 0;
      const b = this.#find(lo, hi);
      resolved[i] = b !== NONE ? b : this.#insert(lo, hi);
    }
    let after = NONE;
    for (let i = n - 1; i >= 0; i--) {
      const b = resolved[i];
      if (after !== NONE) B.setSucc(b, after);
      after = b;
      const x = B.entryOf(b, e.slot);
      if (x !== NONE) {
        L.touch(e, x);
        continue;
      }
      B.push(b, e.slot, L.add(e, b));
      this.#entries++;
    }
    while (e.size > capacity) {
      const oldest = e.head;
      const b = L.block(oldest);
      L.delete(e, oldest);
      this.#entries--;
      this.#dropHolder(b, e.slot);
    }
  }

  /**
   * Walks `hashes` from block 0, stopping at the first block no endpoint holds; every holder of a
   * walked block gets +1 (llm-d matchLongestPrefix semantics).
   */
  match(hashes: readonly bigint[]): PrefixMatch {
    return this.matchPacked(packHashes(hashes));
  }

  /** match() for PackedHashes. */
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
      nTouched = B.countHolders(b, counts, touched, nTouched);
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
    const L = this.#lru;
    while (e.head !== NONE) {
      const x = e.head;
      const b = L.block(x);
      L.delete(e, x);
      this.#entries--;
      this.#dropHolder(b, e.slot);
    }
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

  /** The hash table's longest run of occupied slots (block-table.ts), for tests and diagnostics. */
  get longestProbeRun(): number {
    return this.#table.longestRun();
  }

  blocksOf(endpointId: string): number {
    return this.#endpoints.get(endpointId)?.size ?? 0;
  }

  #entry(endpointId: string): EndpointEntry {
    let e = this.#endpoints.get(endpointId);
    if (e === undefined) {
      const slot = this.#freeSlots.pop() ?? this.#slotIds.length;
      this.#slotIds[slot] = endpointId;
      e = { slot, head: NONE, tail: NONE, size: 0 };
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

  /**
   * The block (lo, hi) that follows `prev` in a chain: first `prev + 1` (blocks created together
   * are consecutive, and this guess depends on no load, so the CPU fetches ahead along a cold
   * chain), then `prev`'s successor hint, then the table; records the hint.
   */
  #next(prev: number, lo: number, hi: number): number {
    const B = this.#b;
    if (prev !== NONE) {
      if (B.is(prev + 1, lo, hi)) return prev + 1;
      const s = B.successor(prev, lo, hi);
      if (s !== NONE) return s;
    }
    const b = this.#find(lo, hi);
    if (prev !== NONE && b !== NONE) B.setSucc(prev, b);
    return b;
  }

  #find(lo: number, hi: number): number {
    return this.#table.get(lo, hi);
  }

  #insert(lo: number, hi: number): number {
    const b = this.#b.alloc(lo, hi);
    this.#table.add(lo, hi, b);
    this.#distinct++;
    return b;
  }

  #dropHolder(b: number, slot: number): void {
    const B = this.#b;
    if (B.remove(b, slot) && B.count(b) === 0) this.#unlink(b);
  }

  #unlink(b: number): void {
    const B = this.#b;
    this.#table.delete(B.lo(b), B.hi(b));
    B.release(b);
    this.#distinct--;
  }
}
