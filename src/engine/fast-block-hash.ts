/**
 * A fast stand-in for vLLM's sha256_cbor prefix-cache block hash, for runs where no one reads the
 * hashes (the fleet simulator without KV-event consumers). It keeps the chain structure of
 * hash_block_tokens — block i's hash covers its parent's hash, its tokens and its extra keys
 * (LoRA name, cache_salt on block 0) — so two blocks get the same hash exactly when sha256_cbor
 * would give them the same hash, up to 64-bit collisions (about 3·10⁻⁶ for ten million distinct
 * blocks). Prefix-hit behaviour is therefore the same; the values differ from vLLM's.
 * The mixing is MurmurHash3's x86 32-bit round on two lanes with different seeds, chained through
 * both lanes and finished with its fmix32; written here from the published algorithm.
 */
import type { ExtraKeys } from "../kv/vllm-block-hash.ts";
import { blockExtraKeys, RequestBlockHasher } from "../kv/vllm-block-hash.ts";

/**
 * What the engine needs of a per-request block hasher: each full block's 64-bit hash as two int32
 * halves (cheap to compare and to key a Map by), and the uint64 itself only for KV events.
 */
export interface BlockHasher {
  /** Blocks hashed so far. */
  readonly count: number;
  /** High and low 32 bits (as int32) of block i < count's hash. */
  readonly his: Int32Array;
  readonly los: Int32Array;
  /** Block i's hash as the uint64 that KV events carry. */
  value(i: number): bigint;
  /** Hashes every newly full block of tokens[0, length) (the request's whole sequence so far). */
  update(tokens: Int32Array, length: number): void;
}

/** Room for `n` more hashes: sized from the request's longest length, grown if ever exceeded. */
function grow(a: Int32Array, n: number): Int32Array {
  if (n <= a.length) return a;
  const b = new Int32Array(Math.max(n, 2 * a.length));
  b.set(a);
  return b;
}

/** vLLM's sha256_cbor (RequestBlockHasher) seen through BlockHasher: the digest's last 8 bytes. */
export class Sha256BlockHasher implements BlockHasher {
  count = 0;
  his: Int32Array;
  los: Int32Array;
  readonly #inner: RequestBlockHasher;

  constructor(root: Uint8Array, blockSize: number, capacity: number, loraName?: string, cacheSalt?: string) {
    this.#inner = new RequestBlockHasher(root, blockSize, loraName, cacheSalt);
    this.his = new Int32Array(capacity);
    this.los = new Int32Array(capacity);
  }

  update(tokens: Int32Array, length: number): void {
    const hashes = this.#inner.hashes;
    this.#inner.update(tokens.subarray(0, length));
    this.his = grow(this.his, hashes.length);
    this.los = grow(this.los, hashes.length);
    for (let i = this.count; i < hashes.length; i++) {
      const d = hashes[i].digest;
      const k = d.length - 8;
      this.his[i] = (d[k] << 24) | (d[k + 1] << 16) | (d[k + 2] << 8) | d[k + 3];
      this.los[i] = (d[k + 4] << 24) | (d[k + 5] << 16) | (d[k + 6] << 8) | d[k + 7];
    }
    this.count = hashes.length;
  }

  value(i: number): bigint {
    return this.#inner.hashes[i].value;
  }
}

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;

function round(h: number, k: number): number {
  k = Math.imul(k, C1);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, C2);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

function mixString(h: number, s: string): number {
  h = round(h, s.length);
  for (let i = 0; i < s.length; i++) h = round(h, s.charCodeAt(i));
  return h;
}

/** Folds extra keys into a lane; null and [] differ from every non-empty list. */
function mixExtra(h: number, keys: ExtraKeys): number {
  if (keys === null) return round(h, 0x7fffffff);
  h = round(h, keys.length);
  for (const k of keys) h = typeof k === "string" ? mixString(round(h, 1), k) : round(round(h, 2), k);
  return h;
}

/** The chain root of a hash seed (PYTHONHASHSEED), as two 32-bit lanes. */
export function fastRoot(hashSeed: string): [number, number] {
  return [fmix(mixString(0x243f6a88, hashSeed)), fmix(mixString(0x85a308d3, hashSeed))];
}

/**
 * Prompt hashes remembered by prompt array, for callers that hand many requests the very same
 * token-id array (the fleet simulator's tokenizer returns one shared array per distinct prompt)
 * and never modify it: each distinct prompt is hashed once, not once per request. Entries live
 * as long as their array does. Each remembers the chain parameters it was computed with and is
 * used only for a request with the same ones.
 */
export class PromptHashMemo {
  readonly #byPrompt = new WeakMap<readonly number[], PromptHashes>();
  hits = 0;
  misses = 0;

  get(prompt: readonly number[], key: string): PromptHashes | undefined {
    const e = this.#byPrompt.get(prompt);
    if (e === undefined || e.key !== key) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    return e;
  }

  set(prompt: readonly number[], e: PromptHashes): void {
    this.#byPrompt.set(prompt, e);
  }
}

/** The full-block hashes of one prompt (count blocks) and the chain parameters behind them. */
export interface PromptHashes {
  readonly key: string;
  readonly count: number;
  readonly his: Int32Array;
  readonly los: Int32Array;
}

/** Per-request incremental hasher with the chain structure of RequestBlockHasher. */
export class FastRequestBlockHasher implements BlockHasher {
  count = 0;
  his: Int32Array;
  los: Int32Array;
  #lo: number;
  #hi: number;
  readonly #extra0: ExtraKeys;
  readonly #extraN: ExtraKeys;

  constructor(
    root: readonly [number, number],
    private readonly blockSize: number,
    capacity: number,
    loraName?: string,
    cacheSalt?: string,
  ) {
    this.his = new Int32Array(capacity);
    this.los = new Int32Array(capacity);
    this.#lo = root[0];
    this.#hi = root[1];
    this.#extra0 = blockExtraKeys(0, loraName, cacheSalt);
    this.#extraN = blockExtraKeys(1, loraName, cacheSalt);
  }

  /** The chain parameters as a memo key: hashes with equal keys over equal tokens are equal. */
  get chainKey(): string {
    return `${this.blockSize}|${this.#lo}|${this.#hi}|${JSON.stringify([this.#extra0, this.#extraN])}`;
  }

  /** This hasher's first `count` hashes (for PromptHashMemo), copied. */
  snapshot(key: string): PromptHashes {
    return { key, count: this.count, his: this.his.slice(0, this.count), los: this.los.slice(0, this.count) };
  }

  /**
   * Starts a fresh hasher from remembered hashes of its own prompt (same chain parameters), as if
   * update had hashed it: the state after update is the last block's hash.
   */
  restore(p: PromptHashes): void {
    if (this.count !== 0) throw new Error("restore: the hasher has already hashed blocks");
    if (p.count === 0) return;
    if (p.count > this.his.length) {
      this.his = grow(this.his, p.count);
      this.los = grow(this.los, p.count);
    }
    this.his.set(p.his.subarray(0, p.count));
    this.los.set(p.los.subarray(0, p.count));
    this.#hi = this.his[p.count - 1];
    this.#lo = this.los[p.count - 1];
    this.count = p.count;
  }

  update(tokens: Int32Array, length: number): void {
    const bs = this.blockSize;
    const full = Math.floor(length / bs);
    if (full > this.his.length) {
      this.his = grow(this.his, full);
      this.los = grow(this.los, full);
    }
    for (let i = this.count; i < full; i++) {
      // Each lane starts from both parent lanes, so the chain carries all 64 bits.
      let a = this.#lo ^ Math.imul(this.#hi, 0x9e3779b1);
      let b = this.#hi ^ Math.imul(this.#lo, 0x7feb352d);
      for (let j = i * bs, end = j + bs; j < end; j++) {
        const t = tokens[j];
        a = round(a, t);
        b = round(b, t ^ 0x5bd1e995);
      }
      const extra = i === 0 ? this.#extra0 : this.#extraN;
      a = fmix(mixExtra(round(a, bs), extra));
      b = fmix(mixExtra(round(b, bs + 1), extra));
      a = (a + b) | 0;
      b = (b + a) | 0;
      this.#lo = a;
      this.#hi = b;
      this.his[i] = b;
      this.los[i] = a;
      this.count = i + 1;
    }
  }

  value(i: number): bigint {
    return (BigInt(this.his[i] >>> 0) << 32n) | BigInt(this.los[i] >>> 0);
  }
}
