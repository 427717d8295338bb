/**
 * Precise prefix-cache index: which request-key blocks each endpoint holds, and on which tier, built from
 * vLLM KV-cache events (vllm/distributed/kv_events.py, vllm/v1/core/block_pool.py) with llm-d's dual-key
 * design (llm-d/llm-d-kv-cache@7be76e1 docs/architecture.md): request keys
 * are kvgate's own (block-keys.ts); each endpoint's engine hashes map to them so BlockRemoved applies.
 * Pure: no sockets, timers or clocks; `now` (seconds) is passed in.
 *
 * - BlockStored: tier = lower(medium) or "gpu"; a medium without a configured weight drops the event
 *   (counted as unknownMedium: llm-d weighs such a tier 1.0, like GPU). With a parent engine hash, the parent's request key comes
 *   from the endpoint's map; an unknown parent skips the event (counted), as llm-d does, except parent 0,
 *   which llm-d-inference-sim sends for "no parent" in the array layout: unknown 0 is taken as the root.
 *   The root is seeded with lora_name or the endpoint's model, and the cache_salt found in block 0's
 *   extra_keys. Blocks whose extra_keys carry anything else (multimodal, prompt embeds) end the run:
 *   token-only keys cannot tell them apart. No token ids = vLLM's placeholder offload event (one
 *   hash per offloaded chunk, its last GPU block's): adds the tier to that block's entry and to the
 *   span − 1 blocks before it (span = block_size / the keyer's, or placeholderSpan when block_size is
 *   0). A hash the index does not know yet is held (bounded) until a BlockStored names it, so a
 *   placeholder that overtakes its GPU event is not lost (llm-d drops it, llm-d-kv-cache#561); one that
 *   comes after the block's BlockRemoved is restored from the keys kept for it (precise-recent.ts).
 *   block_size must equal the keyer's; group_idx > 0 is ignored
 *   (kvgate indexes KV-cache group 0, the only one of non-hybrid models).
 * - Shared tiers (sharedTiers, e.g. a filesystem every replica mounts): a copy any endpoint announces
 *   is kept once, on a pool-wide pseudo-endpoint, and counts for every candidate in match().
 * - BlockRemoved drops that tier (over the placeholder's span) unless another chunk's copy still holds
 *   it (offload tiers are reference-counted, precise-recent.ts); an entry with no tier left is deleted with its engine mapping. A hash
 *   never stored is counted and ignored. AllBlocksCleared, resetEndpoint and removeEndpoint drop all of
 *   the endpoint's entries at once.
 * - Hard budget of maxEntries (key, endpoint) entries, LRU-evicted in O(1). A stored run is linked so its
 *   first block is the newest: the tail of a sequence is evicted before its head, as vLLM frees blocks.
 * - Speculative entries (kvgate's own routing decisions) count as gpu until `now` passes their expiry
 *   and are confirmed by a BlockStored of the same key on that endpoint. Re-speculating touches the LRU.
 * - longestPrefix / match: per endpoint, the run of consecutive blocks from block 0 that it holds, and the
 *   sum of each block's best tier weight (gpu 1.0, cpu 0.8 by default; tiers without a weight count as
 *   absent). One walk down the request's chain for all candidates (see match).
 */
import { type BlockKeyer, type BlockKeys, HI, LO, type PackedKeys, packKeys } from "./block-keys.ts";
import type { BlockStored, KVEvent } from "./events.ts";
import { HeldPlaceholders } from "./precise-held.ts";
import { REC } from "./precise-keys.ts";
import { RecentlyRemoved, TierRefs } from "./precise-recent.ts";
import { matchWithShared } from "./precise-shared.ts";
import { EntryStore, NIL, SPEC, TIER_MASK } from "./precise-store.ts";
import {
  ExpiryQueue,
  extraSalt,
  newCounters,
  type PreciseIndexCounters,
  type PreciseIndexOptions,
  type PreciseIndexStats,
  PrefixMatches,
  type PrefixScores,
  TierTable,
} from "./precise-types.ts";

/** Ids of the pool-wide pseudo-endpoints of shared tiers start with this (never a real endpoint id). */
const SHARED_PREFIX = "\u0000shared:";

export type { PreciseIndexCounters, PreciseIndexOptions, PreciseIndexStats, PrefixScores };
export { PrefixMatches };

export class PreciseIndex {
  readonly keyer: BlockKeyer;
  readonly speculativeTtl: number;
  private readonly store: EntryStore;
  private readonly c: PreciseIndexCounters;
  private readonly tiers: TierTable;
  private readonly eps = new Map<string, number>();
  private readonly epModel: string[] = [];
  private readonly freeEps: number[] = [];
  /** Per endpoint, lookup state (see longestPrefix); `base` makes earlier lookups' tags stale. */
  private tag = new Int32Array(16).fill(-1);
  private slot = new Int32Array(16);
  private score = new Float64Array(16);
  /** The candidate list match() last marked (see members). */
  private member = new Int32Array(16);
  private membersGen = 0;
  private membersFor: Int32Array | null = null;
  private membersVersion = -1;
  private membersDup = false;
  /** Candidates that hold block 0, in the order found (a lookup's scratch). */
  private held = new Int32Array(16);
  private base = 0;
  private epVersion = 0;
  private readonly matches = new PrefixMatches();
  private scratch = new BigUint64Array(64);
  private scratch32 = new Uint32Array(this.scratch.buffer);
  private readonly one = new BigUint64Array(1);
  private readonly one32 = new Uint32Array(this.one.buffer);
  private readonly queue = new ExpiryQueue();
  /** Tier bits of the shared tiers, and per such bit the pool-wide pseudo-endpoint holding its copies. */
  private readonly sharedBits: number;
  private readonly sharedEp = new Map<number, number>();
  private readonly holds: HeldPlaceholders;
  private readonly span0: number;
  private readonly recent: RecentlyRemoved;
  private readonly refs = new TierRefs();
  private readonly gpuBit: number;
  /** An offload tier's event arrived: from then on removed blocks' keys are kept for late placeholders. */
  private tiered = false;

  constructor(opts: PreciseIndexOptions) {
    this.keyer = opts.keyer;
    this.speculativeTtl = opts.speculativeTtl ?? 2;
    this.store = new EntryStore(opts.maxEntries ?? 4_000_000);
    this.c = newCounters();
    this.tiers = new TierTable(opts.tierWeights ?? { gpu: 1.0, cpu: 0.8 });
    this.holds = new HeldPlaceholders(opts.maxHeldPlaceholders ?? 65536);
    this.recent = new RecentlyRemoved(opts.maxRecentlyRemoved ?? 65536);
    this.gpuBit = this.tiers.bit("gpu");
    this.span0 = opts.placeholderSpan ?? 1;
    if (!(Number.isInteger(this.span0) && this.span0 >= 1 && this.span0 <= 256))
      throw new RangeError(`placeholderSpan must be an integer in [1, 256], got ${this.span0}`);
    let bits = 0;
    for (const name of opts.sharedTiers ?? []) {
      const bit = this.tiers.bit(name);
      if (bit === 0)
        throw new RangeError(`shared tier "${name}" has no weight; give it one in the tier weights`);
      if (bit === this.tiers.bit("gpu")) throw new RangeError("the gpu tier cannot be shared");
      bits |= bit;
      this.sharedEp.set(bit, this.endpoint(`${SHARED_PREFIX}${name.toLowerCase()}`));
    }
    this.sharedBits = bits;
  }

  /** Sets the model an endpoint serves: it seeds the root of event-side keys (LoRA events use lora_name). */
  setEndpointModel(endpointId: string, model: string): void {
    this.epModel[this.endpoint(endpointId)] = model;
  }

  /** Applies one event from an endpoint, in publish order. Returns the number of blocks it named. */
  applyEvent(endpointId: string, ev: KVEvent): number {
    const ep = this.endpoint(endpointId);
    switch (ev.type) {
      case "BlockStored":
        this.stored(ep, ev);
        return ev.blockHashes.length;
      case "BlockRemoved": {
        if (ev.groupIdx !== null && ev.groupIdx > 0) {
          this.c.otherGroupSkipped++;
          return ev.blockHashes.length;
        }
        const bit = this.tiers.bit(ev.medium);
        if (bit === 0) {
          this.c.unknownMedium++;
          return ev.blockHashes.length;
        }
        const at = this.targetOf(ep, bit);
        const s = this.store;
        this.recent.beginRemoval();
        for (const h of ev.blockHashes) {
          this.one[0] = h;
          const e = s.findEngine(this.one32[LO], this.one32[HI], at);
          if (e === NIL || (s.flags(e) & bit) === 0) {
            if (this.holds.cancel(ep, h, bit)) this.c.placeholderCancelled++;
            else this.c.removedUnknown++;
            continue;
          }
          this.c.removedBlocks++;
          let x = e;
          const parents: number[] = [];
          for (let j = 1; j < s.eSpan[e]; j++) {
            x = s.parent(x);
            if (x === NIL) break;
            parents.push(x);
          }
          this.releaseTier(e, bit);
          for (const p of parents) if (s.eKey[p] !== NIL) this.releaseTier(p, bit);
        }
        return ev.blockHashes.length;
      }
      case "AllBlocksCleared":
        this.c.clears++;
        this.store.clearEndpoint(ep);
        this.holds.dropEndpoint(ep);
        this.recent.dropEndpoint(ep);
        return 1;
    }
  }

  /** Drops every entry of an endpoint (engine restart, lost history); the endpoint stays known. */
  resetEndpoint(endpointId: string): void {
    const ep = this.eps.get(endpointId);
    if (ep === undefined) return;
    this.c.resets++;
    this.store.clearEndpoint(ep);
    this.holds.dropEndpoint(ep);
    this.recent.dropEndpoint(ep);
  }

  /** Drops every entry of an endpoint and forgets it. */
  removeEndpoint(endpointId: string): void {
    const ep = this.eps.get(endpointId);
    if (ep === undefined || endpointId.startsWith(SHARED_PREFIX)) return;
    this.store.clearEndpoint(ep);
    this.holds.dropEndpoint(ep);
    this.recent.dropEndpoint(ep);
    this.eps.delete(endpointId);
    this.epModel[ep] = "";
    this.freeEps.push(ep);
    this.epVersion++;
  }

  /** Drops every entry and forgets every endpoint; the allocated capacity is kept. Counters keep counting. */
  clear(): void {
    this.store.clear();
    const shared = [...this.eps].filter(([id]) => id.startsWith(SHARED_PREFIX));
    this.eps.clear();
    for (const [id, ep] of shared) this.eps.set(id, ep);
    this.epModel.length = 0;
    this.freeEps.length = 0;
    this.queue.clear();
    this.holds.clear();
    this.recent.clear();
    this.refs.clear();
    this.epVersion++;
  }

  /**
   * Records that kvgate routed these keys to an endpoint: missing entries become speculative (gpu weight)
   * until now + ttl unless a BlockStored confirms them; existing ones are refreshed in the LRU.
   */
  addSpeculative(
    endpointId: string,
    keys: BlockKeys | PackedKeys,
    now: number,
    ttl = this.speculativeTtl,
  ): void {
    this.expire(now);
    const ep = this.endpoint(endpointId);
    const s = this.store;
    let k32: ArrayLike<number> = keys as PackedKeys;
    let L = 0;
    if (keys instanceof BigUint64Array) {
      k32 = new Uint32Array(keys.buffer, keys.byteOffset, keys.length * 2);
      L = LO;
    }
    const n = k32.length >>> 1;
    const exp = now + ttl;
    let anchor = NIL;
    for (let i = 0; i < n; i++) {
      const lo = k32[2 * i + L] >>> 0;
      const hi = k32[2 * i + 1 - L] >>> 0;
      const e = s.entryFor(lo, hi, ep, anchor);
      if (e === NIL) return;
      if (s.created) {
        s.setFlags(e, SPEC);
        s.eExp[e] = exp;
        this.queue.push(e, exp);
        this.c.speculativeAdded++;
      } else if (s.flags(e) === SPEC && exp > s.eExp[e]) {
        s.eExp[e] = exp;
        this.queue.push(e, exp);
      }
      s.lruPlace(e, anchor);
      anchor = e;
    }
  }

  /** Deletes speculative entries whose expiry is ≤ now (lookups already ignore them). */
  expire(now: number): void {
    const s = this.store;
    for (let e = this.queue.popExpired(now); e !== NIL; e = this.queue.popExpired(now)) {
      if (s.flags(e) === SPEC && s.eExp[e] === this.queue.lastExpiry) {
        s.deleteEntry(e);
        this.c.speculativeExpired++;
      }
    }
  }

  /**
   * For each endpoint id: the number of consecutive blocks from block 0 it holds and the sum of their
   * best tier weights. Unknown endpoints score 0. For tests and callers without an endpoint cache; the
   * scheduler's producer resolves its candidates once (resolve) and calls match().
   */
  longestPrefix(keys: BlockKeys | PackedKeys, endpointIds: readonly string[], now: number): PrefixScores {
    const m = endpointIds.length;
    const scores = new Float64Array(m);
    const blocks = new Uint32Array(m);
    const r = this.match(keys, this.resolve(endpointIds), now);
    for (let i = 0; i < r.count; i++) {
      blocks[r.pos[i]] = r.blocks[i];
      scores[r.pos[i]] = r.scores[i];
    }
    return { scores, blocks };
  }

  /**
   * Endpoint numbers of `ids` for match(): -1 for an id the index does not know. Valid while
   * `endpointsVersion` is unchanged (a new or removed endpoint changes it).
   */
  resolve(ids: readonly string[]): Int32Array {
    const out = new Int32Array(ids.length);
    for (let j = 0; j < ids.length; j++) out[j] = this.eps.get(ids[j]) ?? -1;
    return out;
  }

  /** Changes whenever an endpoint number is assigned or freed (resolve() results go stale). */
  get endpointsVersion(): number {
    return this.epVersion;
  }

  /**
   * The longest prefix of `keys` each candidate holds, candidates given as resolve() numbers (by
   * position). The chain is walked once: per block one key probe, then the block's holders (its entry
   * list) are intersected with the candidates still matching, and the walk stops at the first block no
   * candidate holds. Cost: one probe per matched block plus one step per (matched block, holder), plus
   * one pass over the candidates when `eps` is not the array of the last call (members); while a
   * single candidate is left, a block whose entry sits next to its previous one costs one check
   * instead. Only candidates with a match appear in the result, in no set order; the result's arrays
   * are reused by the next call.
   */
  match(keys: BlockKeys | PackedKeys, eps: Int32Array, now: number): PrefixMatches {
    this.expire(now);
    const out = this.matches;
    out.count = 0;
    const m = eps.length;
    // Bigint keys (tests, longestPrefix callers) are packed first: one layout for the walk below.
    const k32 = keys instanceof BigUint64Array ? packKeys(keys) : keys;
    const n = k32.length >>> 1;
    if (n === 0 || m === 0 || this.store.size === 0) return out;
    if (this.sharedBits !== 0 && this.sharedHeld()) return this.matchShared(k32, 0, 1, n, eps, now);
    // tag[ep] = base + (blocks matched so far) for this lookup's candidates; older tags are < base.
    if (this.base + 2 * (n + 2) >= 0x7fffffff) {
      this.base = 0;
      this.tag.fill(-1);
    }
    const base = this.base;
    this.base += n + 2;
    const { tag, slot } = this;
    const member = this.members(eps);
    const gen = this.membersGen;
    const dup = this.membersDup;
    const s = this.store;
    const keyTab = s.keys;
    const { eLink, eExp } = s;
    const rec = keyTab.rec;
    const weight = this.tiers.weight;
    const score = this.score;
    // Block 0: every candidate holding it starts a run (collected in `alive`).
    let alive = 0;
    const held = this.held;
    // The entry of the last candidate found holding a block: while it is the only one, where its
    // run continues (and `one` is that candidate).
    let oneEntry = NIL;
    let k = keyTab.find(k32[0], k32[1]);
    if (k === NIL) return out;
    for (let e = rec[4 * k + 2]; e !== NIL; e = eLink[2 * e]) {
      const epf = eLink[2 * e + 1];
      const ep = epf & 0xffffff;
      if (member[ep] !== gen) continue;
      const f = epf >>> 24;
      const w = weight[f];
      if (w <= 0 || (f === SPEC && eExp[e] <= now)) continue;
      tag[ep] = base + 1;
      score[ep] = w;
      held[alive++] = ep;
      oneEntry = e;
    }
    let one = alive === 1 ? held[0] : -1;
    // Blocks 1…: only the candidates still matching advance; stop when none does.
    const { eKey } = s;
    const lastEntry = eKey.length - 1;
    for (let i = 1, live = alive; i < n && live > 0; i++) {
      if (live === 1) {
        // One candidate left (most of a long prompt: its home replica): follow its own run. A run
        // stored by one event gets adjacent entries (in order, or reversed when it reuses evicted
        // ones), so its entry for block i is usually next to its entry for block i − 1: one check
        // of that entry's key and endpoint instead of a key probe and a walk of the block's holders.
        let e = oneEntry;
        let sc = score[one];
        let j = i;
        for (; j < n; j++) {
          const blo = k32[2 * j] | 0;
          const bhi = k32[2 * j + 1] | 0;
          let g = e + 1;
          let r = g <= lastEntry ? eKey[g] : NIL;
          if (r === NIL || rec[4 * r] !== blo || rec[4 * r + 1] !== bhi || (eLink[2 * g + 1] & REC) !== one) {
            g = e - 1;
            r = g >= 0 ? eKey[g] : NIL;
            if (r === NIL || rec[4 * r] !== blo || rec[4 * r + 1] !== bhi || (eLink[2 * g + 1] & REC) !== one)
              break; // not adjacent: the general step below looks it up
          }
          const f = eLink[2 * g + 1] >>> 24;
          const w = weight[f];
          if (w <= 0 || (f === SPEC && eExp[g] <= now)) break; // its entry for this key is not usable
          sc += w;
          e = g;
          k = r;
        }
        oneEntry = e;
        score[one] = sc;
        tag[one] = base + j;
        i = j;
        if (i >= n) break;
      }
      k = keyTab.findNext(k, k32[2 * i], k32[2 * i + 1]);
      if (k === NIL) break;
      const want = base + i;
      let advanced = 0;
      for (let e = rec[4 * k + 2]; e !== NIL; e = eLink[2 * e]) {
        const epf = eLink[2 * e + 1];
        const ep = epf & 0xffffff;
        if (tag[ep] !== want) continue;
        const f = epf >>> 24;
        const w = weight[f];
        if (w <= 0 || (f === SPEC && eExp[e] <= now)) continue;
        tag[ep] = want + 1;
        score[ep] += w;
        oneEntry = e;
        advanced++;
      }
      live = advanced;
      one = eLink[2 * oneEntry + 1] & REC;
    }
    if (out.pos.length < m) out.grow(m);
    let c = 0;
    if (!dup) {
      for (let a = 0; a < alive; a++) {
        const ep = held[a];
        out.pos[c] = slot[ep];
        out.blocks[c] = tag[ep] - base;
        out.scores[c++] = score[ep];
      }
    } else {
      // An id listed twice: every position of a matched endpoint gets its result.
      for (let j = 0; j < m; j++) {
        const ep = eps[j];
        if (ep < 0 || tag[ep] <= base) continue;
        out.pos[c] = j;
        out.blocks[c] = tag[ep] - base;
        out.scores[c++] = score[ep];
      }
    }
    out.count = c;
    return out;
  }

  /**
   * Marks the candidates of `eps` (member[ep] = membersGen, slot[ep] = its first position, and
   * membersDup when an endpoint is listed twice). Kept while the same array is passed again: the
   * producer resolves its candidate list once and passes that array until the list or the index's
   * endpoints change, so a lookup needs no pass over every candidate. Callers must not modify an
   * array after passing it.
   */
  private members(eps: Int32Array): Int32Array {
    if (eps === this.membersFor && this.membersVersion === this.epVersion) return this.member;
    const gen = ++this.membersGen;
    const { member, slot } = this;
    let dup = false;
    for (let j = 0; j < eps.length; j++) {
      const ep = eps[j];
      if (ep < 0) continue;
      if (member[ep] === gen) dup = true;
      else {
        member[ep] = gen;
        slot[ep] = j;
      }
    }
    this.membersFor = eps;
    this.membersVersion = this.epVersion;
    this.membersDup = dup;
    return member;
  }

  private sharedHeld(): boolean {
    for (const ep of this.sharedEp.values()) if ((this.store.epSize[ep] ?? 0) > 0) return true;
    return false;
  }

  /** match() when a shared tier holds copies (precise-shared.ts). */
  private matchShared(
    k32: ArrayLike<number>,
    lo: number,
    hi: number,
    n: number,
    eps: Int32Array,
    now: number,
  ): PrefixMatches {
    if (this.base + 2 * (n + 2) >= 0x7fffffff) {
      this.base = 0;
      this.tag.fill(-1);
    }
    const base = this.base;
    this.base += n + 2;
    const sharedEps = new Set(this.sharedEp.values());
    const scratch = { tag: this.tag, score: this.score, base };
    return matchWithShared(
      this.store,
      this.tiers.weight,
      sharedEps,
      k32,
      lo,
      hi,
      n,
      eps,
      now,
      scratch,
      this.matches,
    );
  }

  /** The tiers an endpoint holds a key on ("speculative" for a live guess), or null. For tests and debugging. */
  tiersOf(endpointId: string, key: bigint, now: number): string[] | null {
    const ep = this.eps.get(endpointId);
    if (ep === undefined) return null;
    this.one[0] = key;
    const k = this.store.keys.find(this.one32[LO], this.one32[HI]);
    const e = k === NIL ? NIL : this.store.findEntry(k, ep);
    if (e === NIL) return null;
    const f = this.store.flags(e);
    if (f === SPEC) return this.store.eExp[e] > now ? ["speculative"] : null;
    return this.tiers.names(f);
  }

  /** Ids of the endpoints the index knows (not the shared tiers' pseudo-endpoints). */
  endpointIds(): string[] {
    return [...this.eps.keys()].filter((id) => !id.startsWith(SHARED_PREFIX));
  }

  /** Entries a shared tier holds, pool-wide. */
  sharedEntries(tier: string): number {
    const ep = this.sharedEp.get(this.tiers.bit(tier));
    return ep === undefined ? 0 : (this.store.epSize[ep] ?? 0);
  }

  /** Placeholders held for hashes not known yet. */
  get heldPlaceholders(): number {
    return this.holds.size;
  }

  /** Entries an endpoint holds (speculative ones included). */
  endpointEntries(endpointId: string): number {
    const ep = this.eps.get(endpointId);
    return ep === undefined ? 0 : (this.store.epSize[ep] ?? 0);
  }

  stats(): PreciseIndexStats {
    const bytes = this.store.bytes() + this.tag.byteLength * 2 + this.queue.bytes();
    return {
      ...this.c,
      evictions: this.store.evictions,
      placeholderDropped: this.holds.dropped,
      budgetTruncated: this.store.budgetTruncated,
      entries: this.store.size,
      keys: this.store.keys.count,
      endpoints: this.eps.size - this.sharedEp.size,
      maxEntries: this.store.maxEntries,
      bytes,
      bytesPerEntry: this.store.size > 0 ? bytes / this.store.size : 0,
    };
  }

  // ---- internals ----

  private endpoint(id: string): number {
    let ep = this.eps.get(id);
    if (ep !== undefined) return ep;
    ep = this.freeEps.pop() ?? this.eps.size;
    this.eps.set(id, ep);
    this.epModel[ep] = "";
    if (ep >= this.tag.length) {
      const grow = (a: Int32Array) => {
        const b = new Int32Array(a.length * 2);
        b.set(a);
        return b;
      };
      this.tag = grow(this.tag);
      this.tag.fill(-1, this.tag.length / 2);
      this.slot = grow(this.slot);
      this.held = grow(this.held);
      this.member = grow(this.member);
      this.score = new Float64Array(this.tag.length);
    }
    this.epVersion++;
    return ep;
  }

  /** Where copies of a tier live: the shared tier's pseudo-endpoint, or the endpoint itself. */
  private targetOf(ep: number, bit: number): number {
    return bit & this.sharedBits ? (this.sharedEp.get(bit) as number) : ep;
  }

  private dropTier(e: number, bit: number): void {
    const s = this.store;
    s.setFlags(e, s.flags(e) & ~bit);
    if ((s.flags(e) & TIER_MASK) !== 0) return;
    if (this.tiered) this.recent.remember(s, e);
    s.deleteEntry(e);
  }

  /** A removal of tier `bit` from e: one copy released; the tier goes with the last (precise-recent.ts). */
  private releaseTier(e: number, bit: number): void {
    if (!this.refs.release(e, bit)) this.dropTier(e, bit);
  }

  /** Tier `bit` is being set on e (non-GPU tiers are counted per copy). */
  private countTier(e: number, bit: number, created: boolean): void {
    if (bit !== this.gpuBit) this.refs.set(e, bit, !created && (this.store.flags(e) & bit) !== 0);
  }

  /** A placeholder (no token ids) from endpoint ep: applied where the hash is known, else held. */
  private placeholder(ep: number, ev: BlockStored, bit: number): void {
    const B = this.keyer.blockSize;
    let span = this.span0;
    if (ev.blockSize > 0) {
      if (ev.blockSize % B !== 0 || ev.blockSize / B > 256) return void this.c.blockSizeMismatch++;
      span = ev.blockSize / B;
    }
    for (const h of ev.blockHashes) {
      if (this.applyPlaceholder(ep, h, bit, span)) continue;
      if (
        this.recent.size > 0 &&
        this.recent.restore(this.store, this.refs, ep, this.targetOf(ep, bit), h, bit, span)
      ) {
        this.c.placeholderRestored++;
        continue;
      }
      this.c.locationOnlyUnknown++;
      this.holds.add(ep, h, bit, span);
    }
  }

  /**
   * Adds tier `bit` to the block engine hash h names on ep and the span − 1 blocks before it; for a
   * shared tier the copies go to its pseudo-endpoint (the request keys taken from ep's blocks).
   * False when neither knows h.
   */
  private applyPlaceholder(ep: number, h: bigint, bit: number, span: number): boolean {
    const s = this.store;
    const at = this.targetOf(ep, bit);
    this.one[0] = h;
    const lo = this.one32[LO];
    const hi = this.one32[HI];
    let e = s.findEngine(lo, hi, at);
    if (e === NIL && at !== ep) {
      const src = s.findEngine(lo, hi, ep);
      if (src === NIL) return false;
      // Copy the chain's keys (oldest first) onto the shared tier's pseudo-endpoint.
      const chain: number[] = [src];
      for (let x = s.parent(src); x !== NIL && chain.length < span; x = s.parent(x)) chain.push(x);
      const keys = chain.reverse().map((x) => [s.keys.lo(s.eKey[x]), s.keys.hi(s.eKey[x])]);
      const first = s.parent(chain[0]);
      let prev = first === NIL ? NIL : s.findEntry(s.eKey[first], at);
      for (const [klo, khi] of keys) {
        const x = s.entryFor(klo, khi, at, NIL);
        if (x === NIL) return true;
        this.countTier(x, bit, s.created);
        s.setFlags(x, s.flags(x) | bit);
        if (prev !== NIL) s.setParent(x, prev);
        s.lruPlace(x, NIL);
        prev = x;
      }
      if (s.mapEngine(prev, lo, hi)) this.c.engineKeyConflicts++;
      s.eSpan[prev] = Math.min(span, 255);
      return true;
    }
    if (e === NIL) return false;
    this.countTier(e, bit, false);
    s.setFlags(e, s.flags(e) | bit);
    if (span > 1) s.eSpan[e] = Math.min(span, 255);
    for (let j = 1; j < span; j++) {
      e = s.parent(e);
      if (e === NIL) break;
      this.countTier(e, bit, false);
      s.setFlags(e, s.flags(e) | bit);
    }
    return true;
  }

  /** After a BlockStored mapped engine hash h on ep: applies a placeholder held for it. */
  private resolveHeld(ep: number, h: bigint): void {
    const v = this.holds.take(ep, h);
    if (v === null) return;
    for (let bit = 1; bit <= TIER_MASK; bit <<= 1)
      if (v.bits & bit && this.applyPlaceholder(ep, h, bit, v.span)) this.c.placeholderResolved++;
  }

  private stored(ep: number, ev: BlockStored): void {
    const c = this.c;
    const s = this.store;
    if (ev.groupIdx !== null && ev.groupIdx > 0) return void c.otherGroupSkipped++;
    const bit = this.tiers.bit(ev.medium);
    if (bit === 0) return void c.unknownMedium++;
    if (bit !== this.gpuBit) this.tiered = true;
    const n = ev.blockHashes.length;
    if (ev.tokenIds.length === 0) return void this.placeholder(ep, ev, bit);
    const at = this.targetOf(ep, bit);
    const B = this.keyer.blockSize;
    if (ev.blockSize !== B) return void c.blockSizeMismatch++;
    if (ev.tokenIds.length !== n * B) return void c.malformed++;
    let parent: bigint | null = null;
    let parentEntry = NIL;
    if (ev.parentBlockHash !== null) {
      this.one[0] = ev.parentBlockHash;
      let pe = s.findEngine(this.one32[LO], this.one32[HI], at);
      if (pe === NIL && at !== ep) pe = s.findEngine(this.one32[LO], this.one32[HI], ep);
      if (pe !== NIL) {
        const k = s.eKey[pe];
        this.one32[LO] = s.keys.lo(k);
        this.one32[HI] = s.keys.hi(k);
        parent = this.one[0];
        parentEntry = s.ep(pe) === at ? pe : s.findEntry(k, at);
      } else if (ev.parentBlockHash !== 0n) return void c.unknownParent++;
    }
    let usable = n;
    let salt: string | null = null;
    if (ev.extraKeys !== null) {
      for (let j = 0; j < n && j < ev.extraKeys.length; j++) {
        const x = extraSalt(ev.extraKeys[j], ev, parent === null && j === 0);
        if (x === false) {
          usable = j;
          c.unsupportedExtraKeyBlocks += n - j;
          break;
        }
        if (j === 0 && parent === null) salt = x;
      }
    }
    if (usable === 0) return;
    if (parent === null) parent = this.keyer.root(ev.loraName || this.epModel[ep], salt);
    if (this.scratch.length < usable) {
      this.scratch = new BigUint64Array(Math.max(usable, this.scratch.length * 2));
      this.scratch32 = new Uint32Array(this.scratch.buffer);
    }
    this.keyer.hasher.chain(parent, ev.tokenIds, 0, B, usable, this.scratch, 0);
    const k32 = this.scratch32;
    let anchor = NIL;
    let prev = parentEntry;
    for (let j = 0; j < usable; j++) {
      const lo = k32[2 * j + LO];
      const hi = k32[2 * j + HI];
      const e = s.entryFor(lo, hi, at, anchor);
      if (e === NIL) return;
      if (!s.created && s.flags(e) === SPEC) c.speculativeConfirmed++;
      this.countTier(e, bit, s.created);
      s.setFlags(e, (s.flags(e) & ~SPEC) | bit);
      if (prev !== NIL && s.eKey[prev] !== NIL) s.setParent(e, prev);
      this.one[0] = ev.blockHashes[j];
      if (s.mapEngine(e, this.one32[LO], this.one32[HI])) c.engineKeyConflicts++;
      s.lruPlace(e, anchor);
      anchor = e;
      prev = e;
      c.storedBlocks++;
      if (this.holds.size > 0) this.resolveHeld(ep, ev.blockHashes[j]);
    }
  }
}
