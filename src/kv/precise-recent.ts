/**
 * Two pieces of bookkeeping the precise index (precise-index.ts) needs for offload tiers.
 *
 * RecentlyRemoved: the request keys of blocks whose last tier was just removed (BlockRemoved), per
 * (endpoint, engine hash), with their parent's, the newest `max` kept. vLLM publishes a CPU chunk's
 * placeholder BlockStored when its copy ends (offloading/scheduler.py take_events), which can be after
 * HBM evicted the block; the placeholder names only the engine hash, which the index forgot with the
 * entry. With the keys kept, such a late placeholder restores the entry on its tier instead of being
 * held for a GPU event that never comes.
 *
 * TierRefs: how many more copies announced an (entry, tier) than one. vLLM's self-describing CPU
 * events re-announce a shared prefix's blocks once per chunk holding them (a chunk is keyed by its last
 * block, so two prompts diverging inside a chunk store the shared blocks twice), and a placeholder's
 * span covers the same blocks for each such chunk (vLLM offloading/events.py: consumers must
 * reference-count). A removal releases one copy; the tier goes only with the last. A count is reset
 * whenever the tier is newly set on the entry, so a deleted and reused entry never inherits one. Pure.
 */
import { HI, LO } from "./block-keys.ts";
import { ENGINE, type EntryStore, NIL } from "./precise-store.ts";

/** One block of a chain being restored: its request key and engine hash. */
interface Link {
  lo: number;
  hi: number;
  hLo: number;
  hHi: number;
}

interface Removed {
  ep: number;
  hLo: number;
  hHi: number;
  kLo: number;
  kHi: number;
  /** The parent's engine hash and key, when it was known (hasParent). */
  hasParent: boolean;
  pLo: number;
  pHi: number;
  pkLo: number;
  pkHi: number;
}

const slot = (ep: number, lo: number, hi: number) =>
  ((hi ^ Math.imul(ep + 1, 0x9e3779b1)) & 0x1fffff) * 4294967296 + (lo >>> 0);

export class RecentlyRemoved {
  /** By slot(ep, engine hash); insertion order is age. A slot collision replaces the older record. */
  private readonly m = new Map<number, Removed>();
  /** This BlockRemoved's records by entry: a block whose parent went earlier in it links to that record. */
  private readonly byEntry = new Map<number, Removed>();
  private readonly one = new BigUint64Array(1);
  private readonly one32 = new Uint32Array(this.one.buffer);
  /** Late placeholders restored from a record. */
  restored = 0;

  constructor(readonly max: number) {
    if (!(Number.isInteger(max) && max >= 0))
      throw new RangeError(`maxRecentlyRemoved must be an integer ≥ 0, got ${max}`);
  }

  get size(): number {
    return this.m.size;
  }

  /** Entry e of the store is about to be deleted (its last tier removed): keep its keys. */
  remember(s: EntryStore, e: number): void {
    if (this.max === 0 || (s.flags(e) & ENGINE) === 0) return;
    const k = s.eKey[e];
    const r: Removed = {
      ep: s.ep(e),
      hLo: s.eHLo[e],
      hHi: s.eHHi[e],
      kLo: s.keys.lo(k),
      kHi: s.keys.hi(k),
      hasParent: false,
      pLo: 0,
      pHi: 0,
      pkLo: 0,
      pkHi: 0,
    };
    const p = s.parent(e);
    const gone = p === NIL ? this.byEntry.get(s.ePar[e]) : undefined;
    if (p !== NIL && s.flags(p) & ENGINE) {
      r.hasParent = true;
      r.pLo = s.eHLo[p];
      r.pHi = s.eHHi[p];
      r.pkLo = s.keys.lo(s.eKey[p]);
      r.pkHi = s.keys.hi(s.eKey[p]);
    } else if (gone !== undefined && gone.ep === r.ep) {
      r.hasParent = true;
      r.pLo = gone.hLo;
      r.pHi = gone.hHi;
      r.pkLo = gone.kLo;
      r.pkHi = gone.kHi;
    }
    this.byEntry.set(e, r);
    const id = slot(r.ep, r.hLo, r.hHi);
    this.m.delete(id);
    this.m.set(id, r);
    if (this.m.size > this.max) this.m.delete(this.m.keys().next().value as number);
  }

  /** A BlockRemoved starts: entries deleted before it may since have been reused. */
  beginRemoval(): void {
    if (this.byEntry.size > 0) this.byEntry.clear();
  }

  private take(ep: number, lo: number, hi: number): Removed | null {
    if (this.m.size === 0) return null;
    const id = slot(ep, lo, hi);
    const r = this.m.get(id);
    if (r === undefined || r.ep !== ep || r.hLo !== lo || r.hHi !== hi) return null;
    this.m.delete(id);
    return r;
  }

  /**
   * A placeholder of tier `bit` for engine hash h on ep, which the store no longer knows: restores h's
   * block and the span − 1 before it on endpoint `at` (ep itself, or a shared tier's pseudo-endpoint)
   * with that tier, from the records of ep's removed blocks and the entries ep still has. False when
   * h was not removed recently. `refs` learns of each tier it sets.
   */
  restore(
    s: EntryStore,
    refs: TierRefs,
    ep: number,
    at: number,
    h: bigint,
    bit: number,
    span: number,
  ): boolean {
    this.one[0] = h;
    const first = this.take(ep, this.one32[LO], this.one32[HI]);
    if (first === null) return false;
    // The chain newest first: records while its blocks were removed, then the entries ep still has.
    const chain: Link[] = [{ lo: first.kLo, hi: first.kHi, hLo: first.hLo, hHi: first.hHi }];
    let before: { lo: number; hi: number } | null = first.hasParent
      ? { lo: first.pkLo, hi: first.pkHi }
      : null;
    let r: Removed | null = first;
    while (chain.length < span && r?.hasParent) {
      const { pLo, pHi, pkLo, pkHi } = r;
      r = this.take(ep, pLo, pHi);
      if (r !== null) {
        chain.push({ lo: pkLo, hi: pkHi, hLo: pLo, hHi: pHi });
        before = r.hasParent ? { lo: r.pkLo, hi: r.pkHi } : null;
        continue;
      }
      before = null;
      for (let x = s.findEngine(pLo, pHi, ep); x !== NIL && chain.length < span; x = s.parent(x)) {
        if ((s.flags(x) & ENGINE) === 0) break;
        chain.push({ lo: s.keys.lo(s.eKey[x]), hi: s.keys.hi(s.eKey[x]), hLo: s.eHLo[x], hHi: s.eHHi[x] });
        const p = s.parent(x);
        before = p === NIL ? null : { lo: s.keys.lo(s.eKey[p]), hi: s.keys.hi(s.eKey[p]) };
      }
    }
    // Newest block first into the LRU, as a stored run is placed (its head newest).
    const made: number[] = new Array(chain.length).fill(NIL);
    let anchor = NIL;
    for (let j = 0; j < chain.length; j++) {
      const x = s.entryFor(chain[j].lo, chain[j].hi, at, anchor);
      if (x === NIL) break;
      refs.set(x, bit, !s.created && (s.flags(x) & bit) !== 0);
      s.setFlags(x, s.flags(x) | bit);
      s.lruPlace(x, anchor);
      anchor = x;
      made[j] = x;
    }
    // Parents linked oldest first; the engine hashes mapped on the target.
    let prev = NIL;
    if (before !== null) {
      const k = s.keys.find(before.lo, before.hi);
      if (k !== NIL) prev = s.findEntry(k, at);
    }
    for (let j = chain.length - 1; j >= 0; j--) {
      const x = made[j];
      if (x === NIL) continue;
      if (prev !== NIL && s.eKey[prev] !== NIL) s.setParent(x, prev);
      s.mapEngine(x, chain[j].hLo, chain[j].hHi);
      prev = x;
    }
    if (made[0] !== NIL && span > 1) s.eSpan[made[0]] = Math.min(span, 255);
    this.restored++;
    return true;
  }

  /** Drops an endpoint's records (its entries were cleared). */
  dropEndpoint(ep: number): void {
    if (this.m.size === 0) return;
    for (const [id, r] of [...this.m]) if (r.ep === ep) this.m.delete(id);
  }

  clear(): void {
    this.m.clear();
  }
}

export class TierRefs {
  /** e × 64 + tier bit → copies beyond the first. */
  private readonly m = new Map<number, number>();

  /** Tier `bit` was set on entry e; `had`: the entry held it already, so one more copy holds it. */
  set(e: number, bit: number, had: boolean): void {
    if (!had) {
      if (this.m.size > 0) this.m.delete(e * 64 + bit);
      return;
    }
    const k = e * 64 + bit;
    this.m.set(k, (this.m.get(k) ?? 0) + 1);
  }

  /** A removal of tier `bit` from entry e: true when another copy still holds it (one released). */
  release(e: number, bit: number): boolean {
    if (this.m.size === 0) return false;
    const k = e * 64 + bit;
    const n = this.m.get(k);
    if (n === undefined) return false;
    if (n <= 1) this.m.delete(k);
    else this.m.set(k, n - 1);
    return true;
  }

  get size(): number {
    return this.m.size;
  }

  clear(): void {
    this.m.clear();
  }
}
