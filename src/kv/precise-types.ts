/**
 * Shared pieces of the precise index: its options, result and statistics types, the extra_keys check
 * for event-side keys, and the ring queue that expires speculative entries. Pure.
 */
import type { BlockKeyer } from "./block-keys.ts";
import type { BlockStored } from "./events.ts";

export interface PreciseIndexOptions {
  keyer: BlockKeyer;
  /** Hard budget of (block, endpoint) entries. Default 4,000,000. */
  maxEntries?: number;
  /**
   * Weight per tier (medium, matched case-insensitively). Default { gpu: 1.0, cpu: 0.8 }. At most 6
   * tiers; "gpu" must be among them (events without a medium are GPU events). An event whose medium
   * has no weight is dropped and counted (unknownMedium), never weighted as GPU.
   */
  tierWeights?: Record<string, number>;
  /**
   * Tiers every endpoint of the pool reaches (a shared filesystem such as llm-d's SHARED_STORAGE): a
   * copy announced by any endpoint counts for all of them. Each must have a weight. Default none.
   * The replicas must hash blocks alike (one PYTHONHASHSEED, as llm-d's file-system tier itself
   * needs: its files are named by block hash): a removal names the copy by the engine hash.
   */
  sharedTiers?: readonly string[];
  /**
   * Placeholder offload events (no token ids) for hashes the index does not know yet are held, up to
   * this many (endpoint, hash) pairs, oldest dropped first (placeholderDropped), until the GPU event
   * that names the hash arrives. Default 65536.
   */
  maxHeldPlaceholders?: number;
  /**
   * Blocks whose last tier was removed whose keys are kept (newest first) so a placeholder of theirs
   * that comes late (a CPU copy ending after HBM evicted the block) still lands. Default 65536.
   */
  maxRecentlyRemoved?: number;
  /**
   * GPU blocks one placeholder hash stands for when the event says block_size 0 (newer vLLM): the
   * offload connector's block_size over the GPU block size. Default 1 (vLLM's native connector
   * offloads in GPU-sized blocks unless its block_size is set). An event with block_size > 0 gives
   * its own: block_size / the keyer's block size.
   */
  placeholderSpan?: number;
  /** Seconds a speculative entry lives unless confirmed. Default 2. */
  speculativeTtl?: number;
}

/** Aligned with the endpoint ids given to longestPrefix. */
export interface PrefixScores {
  scores: Float64Array;
  blocks: Uint32Array;
}

/**
 * The candidates with a match (blocks ≥ 1), sparse: entry i < count is candidate position pos[i] with
 * blocks[i] consecutive blocks from block 0 and their tier-weighted score scores[i].
 */
export class PrefixMatches {
  count = 0;
  pos = new Int32Array(16);
  blocks = new Uint32Array(16);
  scores = new Float64Array(16);

  grow(n: number): void {
    this.pos = new Int32Array(n);
    this.blocks = new Uint32Array(n);
    this.scores = new Float64Array(n);
  }
}

export interface PreciseIndexCounters {
  storedBlocks: number;
  removedBlocks: number;
  clears: number;
  resets: number;
  evictions: number;
  /** Runs cut short because they alone filled the budget. */
  budgetTruncated: number;
  unknownParent: number;
  removedUnknown: number;
  locationOnlyUnknown: number;
  blockSizeMismatch: number;
  otherGroupSkipped: number;
  unsupportedExtraKeyBlocks: number;
  malformed: number;
  tierOverflow: number;
  /** Events (BlockStored or BlockRemoved) dropped because their medium has no configured weight. */
  unknownMedium: number;
  /** Held placeholders applied when their GPU event arrived. */
  placeholderResolved: number;
  /** Held placeholders dropped to stay within maxHeldPlaceholders. */
  placeholderDropped: number;
  /** Held placeholders cancelled by a BlockRemoved before their GPU event arrived. */
  placeholderCancelled: number;
  /** Placeholders for blocks removed just before, restored from their kept keys. */
  placeholderRestored: number;
  engineKeyConflicts: number;
  speculativeAdded: number;
  speculativeConfirmed: number;
  speculativeExpired: number;
}

export interface PreciseIndexStats extends PreciseIndexCounters {
  entries: number;
  keys: number;
  endpoints: number;
  maxEntries: number;
  /** Bytes of the index's typed arrays (allocated capacity). */
  bytes: number;
  /** bytes / entries: what one (block, endpoint) entry costs now, key records and table slack included. */
  bytesPerEntry: number;
}

export function newCounters(): PreciseIndexCounters {
  return {
    storedBlocks: 0,
    removedBlocks: 0,
    clears: 0,
    resets: 0,
    evictions: 0,
    budgetTruncated: 0,
    unknownParent: 0,
    removedUnknown: 0,
    locationOnlyUnknown: 0,
    blockSizeMismatch: 0,
    otherGroupSkipped: 0,
    unsupportedExtraKeyBlocks: 0,
    malformed: 0,
    tierOverflow: 0,
    unknownMedium: 0,
    placeholderResolved: 0,
    placeholderDropped: 0,
    placeholderCancelled: 0,
    placeholderRestored: 0,
    engineKeyConflicts: 0,
    speculativeAdded: 0,
    speculativeConfirmed: 0,
    speculativeExpired: 0,
  };
}

const MAX_TIERS = 6;
const SPEC_BIT = 0x80; // precise-store.ts SPEC

/**
 * Storage tiers (event `medium` lowercased, default "gpu") as entry flag bits 0..5, and the weight of
 * every flag combination: the best weight of its tiers, gpu's for a speculative entry. Only configured
 * tiers get a bit: bit() is 0 for any other medium, and the caller drops (and counts) that event.
 */
export class TierTable {
  private readonly bits = new Map<string, number>();
  private readonly tierWeight = new Float64Array(MAX_TIERS);
  /** Weight by entry flags. */
  readonly weight = new Float64Array(256);

  constructor(weights: Record<string, number>) {
    for (const [name, w] of Object.entries(weights)) {
      if (!(Number.isFinite(w) && w >= 0)) throw new RangeError(`tier weight ${name}: ${w}`);
      const key = name.toLowerCase();
      if (this.bits.has(key))
        throw new RangeError(`tier ${name} is listed twice (names are case-insensitive)`);
      if (this.bits.size >= MAX_TIERS) throw new RangeError(`at most ${MAX_TIERS} tiers`);
      const t = 1 << this.bits.size;
      this.bits.set(key, t);
      this.tierWeight[31 - Math.clz32(t)] = w;
    }
    if (!this.bits.has("gpu")) throw new RangeError('the tier weights must include "gpu"');
    this.refresh();
  }

  /** The flag bit of a configured tier (null = gpu), or 0 for a medium without a weight. */
  bit(medium: string | null): number {
    return this.bits.get(medium === null || medium === "" ? "gpu" : medium.toLowerCase()) ?? 0;
  }

  has(name: string): boolean {
    return this.bits.has(name.toLowerCase());
  }

  names(flags: number): string[] {
    return [...this.bits].filter(([, bit]) => flags & bit).map(([name]) => name);
  }

  private refresh(): void {
    const gpu = this.tierWeight[31 - Math.clz32(this.bits.get("gpu") ?? 1)];
    for (let f = 0; f < 256; f++) {
      let w = 0;
      for (let t = 0; t < MAX_TIERS; t++) if (f & (1 << t)) w = Math.max(w, this.tierWeight[t]);
      if (f & SPEC_BIT) w = Math.max(w, gpu);
      this.weight[f] = w;
    }
  }
}

/**
 * FIFO of (entry, expiry) pairs for speculative entries, in insertion order. With one TTL the order is
 * the expiry order; with mixed TTLs a later-expiring head delays the sweep of entries behind it (lookups
 * ignore expired entries regardless).
 */
export class ExpiryQueue {
  private entry = new Int32Array(256);
  private exp = new Float64Array(256);
  private head = 0;
  private len = 0;
  /** Expiry of the entry popExpired returned last. */
  lastExpiry = 0;

  push(e: number, expiry: number): void {
    let cap = this.entry.length;
    if (this.len === cap) {
      const ne = new Int32Array(cap * 2);
      const nx = new Float64Array(cap * 2);
      for (let i = 0; i < this.len; i++) {
        ne[i] = this.entry[(this.head + i) % cap];
        nx[i] = this.exp[(this.head + i) % cap];
      }
      this.entry = ne;
      this.exp = nx;
      this.head = 0;
      cap *= 2;
    }
    const at = (this.head + this.len) % cap;
    this.entry[at] = e;
    this.exp[at] = expiry;
    this.len++;
  }

  /** The head entry if its expiry is ≤ now (removing it), else -1. */
  popExpired(now: number): number {
    if (this.len === 0 || this.exp[this.head] > now) return -1;
    const e = this.entry[this.head];
    this.lastExpiry = this.exp[this.head];
    this.head = (this.head + 1) % this.entry.length;
    this.len--;
    return e;
  }

  bytes(): number {
    return this.entry.byteLength + this.exp.byteLength;
  }

  clear(): void {
    this.head = this.len = 0;
  }
}

/**
 * Checks one block's extra_keys: vLLM writes (lora name, multimodal items, cache_salt on block 0 only,
 * prompt-embeds digest). Returns the salt (or null) when only the LoRA name and, on a chain's first
 * block, one salt string are present; false when anything else is.
 */
export function extraSalt(keys: unknown[] | null, ev: BlockStored, first: boolean): string | null | false {
  if (keys === null || keys.length === 0) return null;
  let i = 0;
  if ((ev.loraName !== null && keys[0] === ev.loraName) || (ev.loraId !== null && keys[0] === ev.loraId))
    i = 1;
  if (i === keys.length) return null;
  if (first && i === keys.length - 1 && typeof keys[i] === "string") return keys[i] as string;
  return false;
}
