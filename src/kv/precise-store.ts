/**
 * Typed-array storage behind PreciseIndex: request-key records, (key, endpoint) entries, the per-endpoint
 * engine-hash → entry table, a global LRU over entries and per-key / per-endpoint entry lists. Every
 * operation is O(1) expected (open addressing with linear probing and backward-shift deletion), except
 * findEntry, which walks the key's entries (one per endpoint holding that key). No bigints, no per-entry
 * objects: an entry is one index into parallel typed arrays, so its memory is exactly countable.
 * Request keys live in a KeyTable (precise-keys.ts); the engine-hash table packs fingerprints into its
 * slots the same way, hence at most MAX_ENTRIES entries.
 */

import { between, KeyTable, MAX_ENTRIES, mix, NIL, pow2AtLeast, REC } from "./precise-keys.ts";

export { MAX_ENTRIES, NIL };
/** Entry flag bits: bits 0..5 are storage tiers, ENGINE marks an engine-hash mapping, SPEC a guess. */
export const TIER_MASK = 0x3f;
export const ENGINE = 0x40;
export const SPEC = 0x80;

export class EntryStore {
  readonly maxEntries: number;
  size = 0;
  lruHead = NIL;
  lruTail = NIL;

  /** Request-key records; each heads the list of its entries. */
  readonly keys: KeyTable;

  // Entries.
  eKey = new Int32Array(0);
  /**
   * Per entry, interleaved so a key-list walk touches one cache line per entry: [2e] = next entry of the
   * same key (NIL at the end), [2e+1] = endpoint (low 24 bits) | flags << 24.
   */
  eLink = new Int32Array(0);
  eExp = new Float64Array(0);
  eHLo = new Uint32Array(0);
  eHHi = new Uint32Array(0);
  ePrev = new Int32Array(0);
  eNext = new Int32Array(0);
  eKPrev = new Int32Array(0);
  eEpPrev = new Int32Array(0);
  eEpNext = new Int32Array(0);
  /**
   * Per entry, the entry of the block before it on the same endpoint (NIL for block 0 or unknown) and
   * that entry's key then: a link whose target was since deleted or reused fails the key check.
   */
  ePar = new Int32Array(0);
  eParKey = new Int32Array(0);
  /** Per entry, the GPU blocks its placeholder engine hash stands for (0 = itself only). */
  eSpan = new Uint8Array(0);
  private eFree = NIL;
  private eUsed = 0;
  private hSlots = new Int32Array(16);

  /** Set by entryFor: whether it added the entry. */
  created = false;
  evictions = 0;
  /** Runs cut short because they alone filled the budget. */
  budgetTruncated = 0;

  /** Per endpoint: first entry of its list and its entry count. */
  readonly epHead: number[] = [];
  readonly epSize: number[] = [];

  constructor(maxEntries: number) {
    if (!Number.isInteger(maxEntries) || maxEntries < 1 || maxEntries > MAX_ENTRIES - 1)
      throw new RangeError(`maxEntries must be an integer in [1, ${MAX_ENTRIES - 1}], got ${maxEntries}`);
    this.maxEntries = maxEntries;
    this.keys = new KeyTable(Math.min(maxEntries + 1, 1024), maxEntries + 1);
    this.growEntries(Math.min(maxEntries, 1024));
  }

  /** Drops every entry and key; keeps the allocated capacity. */
  clear(): void {
    this.size = this.eUsed = 0;
    this.eFree = this.lruHead = this.lruTail = NIL;
    this.keys.clear();
    this.hSlots.fill(0);
    this.eLink.fill(0);
    this.epHead.length = this.epSize.length = 0;
  }

  /** An entry's endpoint. */
  ep(e: number): number {
    return this.eLink[2 * e + 1] & REC;
  }

  /** An entry's flags (tier bits, ENGINE, SPEC). */
  flags(e: number): number {
    return this.eLink[2 * e + 1] >>> 24;
  }

  setFlags(e: number, f: number): void {
    this.eLink[2 * e + 1] = (this.eLink[2 * e + 1] & REC) | (f << 24);
  }

  get full(): boolean {
    return this.size >= this.maxEntries;
  }

  /** Bytes held by the typed arrays (capacity, not just live entries). */
  bytes(): number {
    let b = this.keys.bytes() + this.hSlots.byteLength;
    for (const a of [this.eKey, this.eLink, this.eExp, this.eHLo, this.eHHi]) b += a.byteLength;
    for (const a of [this.ePrev, this.eNext, this.eKPrev, this.eEpPrev, this.eEpNext]) b += a.byteLength;
    b += this.ePar.byteLength + this.eParKey.byteLength + this.eSpan.byteLength;
    return b + this.epHead.length * 16;
  }

  // ---- entries ----

  /** The entry of key record `k` on endpoint `ep`, or NIL. */
  findEntry(k: number, ep: number): number {
    const link = this.eLink;
    for (let e = this.keys.head(k); e !== NIL; e = link[2 * e]) if ((link[2 * e + 1] & REC) === ep) return e;
    return NIL;
  }

  /** Adds an entry (flags 0, not in the LRU yet). The caller makes room first: size < maxEntries. */
  addEntry(k: number, ep: number): number {
    let e = this.eFree;
    if (e !== NIL) this.eFree = this.eNext[e];
    else {
      if (this.eUsed === this.eKey.length) this.growEntries(Math.min(this.eKey.length * 2, this.maxEntries));
      e = this.eUsed++;
    }
    this.size++;
    this.eKey[e] = k;
    this.eLink[2 * e + 1] = ep; // flags 0
    this.eExp[e] = 0;
    this.ePrev[e] = this.eNext[e] = NIL;
    this.ePar[e] = NIL;
    this.eSpan[e] = 0;
    const kh = this.keys.head(k);
    this.eKPrev[e] = NIL;
    this.eLink[2 * e] = kh;
    if (kh !== NIL) this.eKPrev[kh] = e;
    this.keys.setHead(k, e);
    while (this.epHead.length <= ep) {
      this.epHead.push(NIL);
      this.epSize.push(0);
    }
    const eh = this.epHead[ep];
    this.eEpPrev[e] = NIL;
    this.eEpNext[e] = eh;
    if (eh !== NIL) this.eEpPrev[eh] = e;
    this.epHead[ep] = e;
    this.epSize[ep]++;
    return e;
  }

  deleteEntry(e: number): void {
    if (this.flags(e) & ENGINE) this.unmapEngine(e);
    this.lruUnlink(e);
    const k = this.eKey[e];
    const kp = this.eKPrev[e];
    const kn = this.eLink[2 * e];
    if (kp !== NIL) this.eLink[2 * kp] = kn;
    else this.keys.setHead(k, kn);
    if (kn !== NIL) this.eKPrev[kn] = kp;
    if (this.keys.head(k) === NIL) this.keys.remove(k);
    const ep = this.ep(e);
    const pp = this.eEpPrev[e];
    const pn = this.eEpNext[e];
    if (pp !== NIL) this.eEpNext[pp] = pn;
    else this.epHead[ep] = pn;
    if (pn !== NIL) this.eEpPrev[pn] = pp;
    this.epSize[ep]--;
    this.setFlags(e, 0);
    this.eKey[e] = NIL;
    this.eNext[e] = this.eFree;
    this.eFree = e;
    this.size--;
  }

  /**
   * The entry of (key lo/hi, ep), added if absent (`created` tells), after evicting LRU entries when
   * the budget is full; NIL when the run being added (oldest member `anchor`) alone fills the budget:
   * deeper blocks are worth less than its head, so the caller stops the run.
   */
  entryFor(lo: number, hi: number, ep: number, anchor: number): number {
    if (!this.full) {
      const k = this.keys.getOrAdd(lo, hi);
      const e = this.keys.head(k) === NIL ? NIL : this.findEntry(k, ep); // a new key has no entries
      this.created = e === NIL;
      return this.created ? this.addEntry(k, ep) : e;
    }
    const k = this.keys.find(lo, hi);
    const e = k === NIL ? NIL : this.findEntry(k, ep);
    this.created = e === NIL;
    if (e !== NIL) return e;
    while (this.full) {
      const victim = this.lruHead;
      if (victim === anchor) {
        this.budgetTruncated++;
        return NIL;
      }
      this.deleteEntry(victim);
      this.evictions++;
    }
    return this.addEntry(this.keys.getOrAdd(lo, hi), ep); // looked up again: an eviction may free k
  }

  /** Deletes every entry of an endpoint; returns how many. */
  clearEndpoint(ep: number): number {
    if (ep >= this.epHead.length) return 0;
    let n = 0;
    while (this.epHead[ep] !== NIL) {
      this.deleteEntry(this.epHead[ep]);
      n++;
    }
    return n;
  }

  /** Links e to the entry of the block before it (same endpoint), or NIL. */
  setParent(e: number, parent: number): void {
    this.ePar[e] = parent;
    this.eParKey[e] = parent === NIL ? NIL : this.eKey[parent];
  }

  /** The entry of the block before e on its endpoint, or NIL when unknown or gone. */
  parent(e: number): number {
    const p = this.ePar[e];
    if (p === NIL || this.eKey[p] !== this.eParKey[e] || this.eKey[p] === NIL || this.ep(p) !== this.ep(e))
      return NIL;
    return p;
  }

  // ---- engine hash → entry (per endpoint) ----

  findEngine(lo: number, hi: number, ep: number): number {
    const slots = this.hSlots;
    const mask = slots.length - 1;
    const h = mix(lo ^ Math.imul(ep, 0x27d4eb2d), hi);
    const fp = h >>> 24;
    for (let i = h & mask; ; i = (i + 1) & mask) {
      const v = slots[i];
      if (v === 0) return NIL;
      if (v >>> 24 === fp) {
        const e = (v & REC) - 1;
        if (this.eHLo[e] === lo && this.eHHi[e] === hi && this.ep(e) === ep) return e;
      }
    }
  }

  /** Maps (lo, hi) on e's endpoint to e; returns true if another entry held that engine hash (it loses it). */
  mapEngine(e: number, lo: number, hi: number): boolean {
    if (this.flags(e) & ENGINE) {
      if (this.eHLo[e] === lo && this.eHHi[e] === hi) return false;
      this.unmapEngine(e);
    }
    const ep = this.ep(e);
    this.eHLo[e] = lo;
    this.eHHi[e] = hi;
    this.setFlags(e, this.flags(e) | ENGINE);
    const slots = this.hSlots;
    const mask = slots.length - 1;
    const h = mix(lo ^ Math.imul(ep, 0x27d4eb2d), hi);
    const fp = h >>> 24;
    for (let i = h & mask; ; i = (i + 1) & mask) {
      const v = slots[i];
      if (v === 0) {
        slots[i] = (fp << 24) | (e + 1);
        return false;
      }
      if (v >>> 24 === fp) {
        const o = (v & REC) - 1;
        if (this.eHLo[o] === lo && this.eHHi[o] === hi && this.ep(o) === ep) {
          this.setFlags(o, this.flags(o) & ~ENGINE);
          slots[i] = (fp << 24) | (e + 1);
          return true;
        }
      }
    }
  }

  private unmapEngine(e: number): void {
    const slots = this.hSlots;
    const mask = slots.length - 1;
    let i = this.engineHash(e) & mask;
    while ((slots[i] & REC) !== e + 1) i = (i + 1) & mask;
    let hole = i;
    slots[hole] = 0;
    for (let j = (hole + 1) & mask; slots[j] !== 0; j = (j + 1) & mask) {
      if (between(hole, this.engineHash((slots[j] & REC) - 1) & mask, j)) continue;
      slots[hole] = slots[j];
      slots[j] = 0;
      hole = j;
    }
    this.setFlags(e, this.flags(e) & ~ENGINE);
  }

  private engineHash(e: number): number {
    return mix(this.eHLo[e] ^ Math.imul(this.ep(e), 0x27d4eb2d), this.eHHi[e]);
  }

  // ---- LRU (head = oldest) ----

  lruUnlink(e: number): void {
    const p = this.ePrev[e];
    const n = this.eNext[e];
    if (p === NIL && n === NIL && this.lruHead !== e) return; // not linked
    if (p !== NIL) this.eNext[p] = n;
    else this.lruHead = n;
    if (n !== NIL) this.ePrev[n] = p;
    else this.lruTail = p;
    this.ePrev[e] = this.eNext[e] = NIL;
  }

  /** Moves e just before `ref` (older than it), or to the tail (newest) when ref is NIL. */
  lruPlace(e: number, ref: number): void {
    if (e === ref) return;
    this.lruUnlink(e);
    const p = ref === NIL ? this.lruTail : this.ePrev[ref];
    this.ePrev[e] = p;
    this.eNext[e] = ref;
    if (p !== NIL) this.eNext[p] = e;
    else this.lruHead = e;
    if (ref !== NIL) this.ePrev[ref] = e;
    else this.lruTail = e;
  }

  // ---- growth ----

  private growEntries(cap: number): void {
    const grow = <T extends Int32Array | Uint32Array | Uint8Array | Float64Array>(
      a: T,
      make: (n: number) => T,
    ) => {
      const b = make(cap);
      b.set(a);
      return b;
    };
    const i32 = (n: number) => new Int32Array(n);
    const u32 = (n: number) => new Uint32Array(n);
    this.eKey = grow(this.eKey, i32);
    const link = new Int32Array(cap * 2);
    link.set(this.eLink);
    this.eLink = link;
    this.eExp = grow(this.eExp, (n) => new Float64Array(n));
    this.eHLo = grow(this.eHLo, u32);
    this.eHHi = grow(this.eHHi, u32);
    this.ePrev = grow(this.ePrev, i32);
    this.eNext = grow(this.eNext, i32);
    this.eKPrev = grow(this.eKPrev, i32);
    this.eEpPrev = grow(this.eEpPrev, i32);
    this.eEpNext = grow(this.eEpNext, i32);
    this.ePar = grow(this.ePar, i32);
    this.eParKey = grow(this.eParKey, i32);
    this.eSpan = grow(this.eSpan, (n) => new Uint8Array(n));
    const slots = pow2AtLeast(cap * 2);
    if (slots > this.hSlots.length) {
      const old = this.hSlots;
      this.hSlots = new Int32Array(slots);
      const mask = slots - 1;
      for (const r of old) {
        if (r === 0) continue;
        let i = this.engineHash((r & REC) - 1) & mask;
        while (this.hSlots[i] !== 0) i = (i + 1) & mask;
        this.hSlots[i] = r;
      }
    }
  }
}
