/**
 * The approximate prefix index: which endpoints were sent which prefix blocks. One LRU of block
 * hashes per endpoint (a Map in insertion order: O(1) touch, insert and evict) plus a reverse map
 * block → holder slots. Endpoints get small integer slots so matching counts into a typed array.
 */

interface EndpointEntry {
  slot: number;
  lru: Map<bigint, true>;
}

/** Per-endpoint matched block counts of one lookup, snapshotted (safe after later index edits). */
export interface PrefixMatch {
  /** Blocks walked before the first block no endpoint holds. */
  depth: number;
  counts: Map<string, number>;
}

export class ApproxPrefixIndex {
  readonly #endpoints = new Map<string, EndpointEntry>();
  readonly #holders = new Map<bigint, number[]>();
  readonly #slotIds: (string | null)[] = [];
  readonly #freeSlots: number[] = [];
  #scratch = new Int32Array(64);
  #entries = 0;

  /**
   * Records that `endpointId` now caches `hashes`. Inserted last block first, so block 0 is the
   * most recently used and a prefix outlives its suffix under eviction (llm-d inserts in order,
   * which evicts block 0 first and hides the rest of the chain from the walk).
   */
  add(endpointId: string, hashes: readonly bigint[], capacity: number): void {
    if (capacity <= 0 || hashes.length === 0) return;
    const e = this.#entry(endpointId);
    const lru = e.lru;
    for (let i = hashes.length - 1; i >= 0; i--) {
      const h = hashes[i];
      if (lru.has(h)) {
        lru.delete(h);
        lru.set(h, true);
        continue;
      }
      lru.set(h, true);
      this.#entries++;
      const hs = this.#holders.get(h);
      if (hs === undefined) this.#holders.set(h, [e.slot]);
      else hs.push(e.slot);
    }
    while (lru.size > capacity) {
      const oldest = lru.keys().next().value as bigint;
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
    if (this.#scratch.length < this.#slotIds.length) this.#scratch = new Int32Array(this.#slotIds.length * 2);
    const counts = this.#scratch;
    const touched: number[] = [];
    let depth = 0;
    for (; depth < hashes.length; depth++) {
      const hs = this.#holders.get(hashes[depth]);
      if (hs === undefined) break;
      for (let j = 0; j < hs.length; j++) {
        const s = hs[j];
        if (counts[s]++ === 0) touched.push(s);
      }
    }
    const out = new Map<string, number>();
    for (const s of touched) {
      out.set(this.#slotIds[s] as string, counts[s]);
      counts[s] = 0;
    }
    return { depth, counts: out };
  }

  remove(endpointId: string): void {
    const e = this.#endpoints.get(endpointId);
    if (e === undefined) return;
    for (const h of e.lru.keys()) this.#dropHolder(h, e.slot);
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
    return this.#holders.size;
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

  #dropHolder(h: bigint, slot: number): void {
    const hs = this.#holders.get(h);
    if (hs === undefined) return;
    const i = hs.indexOf(slot);
    if (i < 0) return;
    hs[i] = hs[hs.length - 1];
    hs.pop();
    if (hs.length === 0) this.#holders.delete(h);
  }
}
