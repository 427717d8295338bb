// Test helpers for precise-mode tests: generated vLLM-like KV-event streams over shared documents, and a
// plain-Map reference model of what the precise index must hold after them.

import type { BlockKeyer } from "../../src/kv/block-keys.ts";
import type { BlockStored, KVEvent, KVEventBatch } from "../../src/kv/events.ts";
import type { Rng } from "./kv-event-fixtures.ts";

export const DEFAULT_WEIGHTS: Record<string, number> = { gpu: 1.0, cpu: 0.8 };

export interface Doc {
  tokens: number[];
  keys: BigUint64Array;
}

interface RefEndpoint {
  /** request key → tiers */
  held: Map<bigint, Set<string>>;
  /** engine hash → request key */
  engine: Map<bigint, bigint>;
  /** "key tier" → copies beyond the first (offload tiers: each chunk announcing a block is a copy) */
  copies: Map<string, number>;
  /** engine hash → request key of blocks whose last tier was removed (a late placeholder restores them) */
  removed: Map<bigint, bigint>;
}

export interface RefCounts {
  unknownParent: number;
  removedUnknown: number;
  locationOnlyUnknown: number;
}

const int = (r: Rng, n: number): number => Math.floor(r() * n);

/**
 * Documents share prefixes (a few system prompts, then distinct tails), so endpoints hold overlapping
 * chains. Engine hashes are random uint64 ≥ 2^63, one per request key, as a fixed-seed vLLM would give.
 */
export class StreamWorld {
  readonly docs: Doc[] = [];
  readonly counts: RefCounts = { unknownParent: 0, removedUnknown: 0, locationOnlyUnknown: 0 };
  private readonly eh = new Map<bigint, bigint>();
  private readonly keyOf = new Map<bigint, bigint>();
  private readonly eps = new Map<string, RefEndpoint>();
  /** An offload-tier BlockStored was seen (the index keeps removed blocks' keys from then on). */
  private tiered = false;

  constructor(
    readonly keyer: BlockKeyer,
    readonly rng: Rng,
    readonly model: string,
    opts: { docs?: number; blocks?: number } = {},
  ) {
    const B = keyer.blockSize;
    const systems = Array.from({ length: 3 }, (_, s) =>
      Array.from({ length: B * (1 + s) }, () => 16 + int(rng, 100_000)),
    );
    for (let d = 0; d < (opts.docs ?? 12); d++) {
      const sys = systems[d % 3];
      const tail = Array.from({ length: B * (1 + int(rng, opts.blocks ?? 10)) + int(rng, B) }, () =>
        int(rng, 2 ** 31),
      );
      const tokens = [...sys, ...tail];
      this.docs.push({ tokens, keys: keyer.keys(tokens, model) });
    }
  }

  engineHash(key: bigint): bigint {
    let h = this.eh.get(key);
    if (h === undefined) {
      h = (1n << 63n) | (BigInt(int(this.rng, 2 ** 31)) << 32n) | BigInt(int(this.rng, 2 ** 32));
      this.eh.set(key, h);
      this.keyOf.set(h, key);
    }
    return h;
  }

  ref(ep: string): RefEndpoint {
    let r = this.eps.get(ep);
    if (!r)
      this.eps.set(ep, (r = { held: new Map(), engine: new Map(), copies: new Map(), removed: new Map() }));
    return r;
  }

  /** Forgets an endpoint's contents in the reference (restart, reset). */
  resetRef(ep: string): void {
    this.eps.delete(ep);
  }

  /** A random batch for an endpoint; applied to the reference as generated. */
  batch(ep: string, maxEvents: number, ts = 1.7e9): KVEventBatch {
    const events: KVEvent[] = [];
    const n = 1 + int(this.rng, maxEvents);
    for (let i = 0; i < n; i++) events.push(this.event(ep));
    return { ts, events, dataParallelRank: 0 };
  }

  /** A BlockStored for blocks [start, start+len) of a doc (parent = engine hash of block start-1). */
  storedRun(ep: string, doc: Doc, start: number, len: number, medium: string | null = "GPU"): BlockStored {
    const B = this.keyer.blockSize;
    const keys = Array.from(doc.keys.subarray(start, start + len));
    const ev: BlockStored = {
      type: "BlockStored",
      blockHashes: keys.map((k) => this.engineHash(k)),
      parentBlockHash: start === 0 ? null : this.engineHash(doc.keys[start - 1]),
      tokenIds: doc.tokens.slice(start * B, (start + len) * B),
      blockSize: B,
      loraId: null,
      medium,
      loraName: null,
      extraKeys: null,
      groupIdx: 0,
      kvCacheSpecKind: "full_attention",
      kvCacheSpecSlidingWindow: null,
    };
    this.applyRef(ep, ev);
    return ev;
  }

  private event(ep: string): KVEvent {
    const r = this.ref(ep);
    const x = this.rng();
    const heldHashes = [...r.engine.keys()];
    if (x < 0.5 || heldHashes.length === 0) {
      const doc = this.docs[int(this.rng, this.docs.length)];
      // Start at 0 or right after a block this endpoint holds (so the parent resolves).
      let start = 0;
      for (let s = doc.keys.length - 1; s > 0; s--) {
        if (
          r.held.has(doc.keys[s - 1]) &&
          r.engine.has(this.engineHash(doc.keys[s - 1])) &&
          this.rng() < 0.5
        ) {
          start = s;
          break;
        }
      }
      if (start >= doc.keys.length) start = 0;
      const len = 1 + int(this.rng, Math.min(8, doc.keys.length - start));
      const medium = [null, "GPU", "GPU", "CPU"][int(this.rng, 4)];
      return this.storedRun(ep, doc, start, len, medium);
    }
    let ev: KVEvent;
    if (x < 0.6) {
      // Unknown parent: skipped.
      const doc = this.docs[int(this.rng, this.docs.length)];
      const B = this.keyer.blockSize;
      ev = {
        ...this.template(),
        blockHashes: [this.engineHash(doc.keys[0])],
        parentBlockHash: (1n << 63n) + BigInt(int(this.rng, 1000)) + 7n,
        tokenIds: doc.tokens.slice(0, B),
      };
    } else if (x < 0.7) {
      // Location-only (offload): tokens empty.
      const hs = Array.from({ length: 1 + int(this.rng, 3) }, () =>
        this.rng() < 0.8 ? heldHashes[int(this.rng, heldHashes.length)] : (1n << 63n) + 99n,
      );
      ev = { ...this.template(), blockHashes: hs, tokenIds: [], medium: "CPU" };
    } else if (x < 0.97) {
      const hs = Array.from({ length: 1 + int(this.rng, 4) }, () =>
        this.rng() < 0.85 ? heldHashes[int(this.rng, heldHashes.length)] : (1n << 63n) + 12345n,
      );
      ev = { type: "BlockRemoved", blockHashes: hs, medium: this.rng() < 0.7 ? "GPU" : "CPU", groupIdx: 0 };
    } else ev = { type: "AllBlocksCleared" };
    this.applyRef(ep, ev);
    return ev;
  }

  private template(): BlockStored {
    return {
      type: "BlockStored",
      blockHashes: [],
      parentBlockHash: null,
      tokenIds: [],
      blockSize: this.keyer.blockSize,
      loraId: null,
      medium: "GPU",
      loraName: null,
      extraKeys: null,
      groupIdx: 0,
      kvCacheSpecKind: null,
      kvCacheSpecSlidingWindow: null,
    };
  }

  /** The reference semantics of the precise index (no budget, no speculation). */
  applyRef(ep: string, ev: KVEvent): void {
    const r = this.ref(ep);
    if (ev.type === "AllBlocksCleared") {
      r.held.clear();
      r.engine.clear();
      r.removed.clear();
      return;
    }
    const tier = (ev.medium ?? "gpu").toLowerCase();
    /** Adds `tier` to key k's tiers, counting a further copy of an offload tier. */
    const add = (k: bigint, tiers: Set<string>) => {
      const c = `${k} ${tier}`;
      if (tier !== "gpu" && tiers.has(tier)) r.copies.set(c, (r.copies.get(c) ?? 0) + 1);
      else if (!tiers.has(tier)) r.copies.delete(c);
      tiers.add(tier);
    };
    if (ev.type === "BlockRemoved") {
      for (const h of ev.blockHashes) {
        const k = r.engine.get(h);
        const tiers = k === undefined ? undefined : r.held.get(k);
        if (k === undefined || !tiers?.has(tier)) {
          this.counts.removedUnknown++;
          continue;
        }
        const c = `${k} ${tier}`;
        const n = r.copies.get(c) ?? 0;
        if (n > 0) {
          if (n === 1) r.copies.delete(c);
          else r.copies.set(c, n - 1);
          continue;
        }
        tiers.delete(tier);
        if (tiers.size === 0) {
          r.held.delete(k);
          r.engine.delete(h);
          if (this.tiered) {
            r.removed.delete(h);
            r.removed.set(h, k);
          }
        }
      }
      return;
    }
    if (tier !== "gpu") this.tiered = true;
    if (ev.tokenIds.length === 0) {
      for (const h of ev.blockHashes) {
        const k = r.engine.get(h);
        if (k !== undefined) {
          add(k, r.held.get(k)!);
          continue;
        }
        const gone = r.removed.get(h);
        if (gone === undefined) {
          this.counts.locationOnlyUnknown++;
          continue;
        }
        // A placeholder after its block's removal: restored on its tier from the kept key.
        r.removed.delete(h);
        let tiers = r.held.get(gone);
        if (!tiers) r.held.set(gone, (tiers = new Set()));
        add(gone, tiers);
        r.engine.set(h, gone);
      }
      return;
    }
    if (ev.parentBlockHash !== null && !r.engine.has(ev.parentBlockHash)) {
      this.counts.unknownParent++;
      return;
    }
    // The generator only emits runs of known documents: find the keys by engine hash.
    for (const h of ev.blockHashes) {
      const k = this.keyOf.get(h)!;
      let tiers = r.held.get(k);
      if (!tiers) r.held.set(k, (tiers = new Set()));
      add(k, tiers);
      r.engine.set(h, k);
    }
  }

  /** The reference longest-prefix result of one endpoint. */
  refLongest(
    ep: string,
    keys: ArrayLike<bigint>,
    weights = DEFAULT_WEIGHTS,
  ): { blocks: number; score: number } {
    const r = this.ref(ep);
    let blocks = 0;
    let score = 0;
    for (let i = 0; i < keys.length; i++) {
      const tiers = r.held.get(keys[i]);
      const w = tiers ? Math.max(0, ...[...tiers].map((t) => weights[t] ?? 0)) : 0;
      if (w <= 0) break;
      blocks++;
      score += w;
    }
    return { blocks, score };
  }

  refEntries(ep: string): number {
    return this.ref(ep).held.size;
  }
}
