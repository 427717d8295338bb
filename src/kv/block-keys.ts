/**
 * Request block keys for precise prefix routing: kvgate's own chained 64-bit keys computed from token ids.
 *
 * Like llm-d's dual-key design (llm-d/llm-d-kv-cache@7be76e1 docs/architecture.md, issue #147), kvgate
 * never reproduces vLLM's block hash. It computes its own keys from token ids, on the request side (from
 * the gateway's tokenization) and on the event side (from BlockStored token_ids), and maps each
 * endpoint's engine hashes to them only to apply BlockRemoved. So routing does not depend on vLLM's
 * `--prefix-caching-hash-algo` or PYTHONHASHSEED.
 *
 *   root   = H64(utf8(model) ‖ 0x00 ‖ utf8(cache_salt or ""))          (the model is the LoRA name for LoRA)
 *   b[i]   = H64(tokens of block i as 4-byte words)
 *   key[i] = H64(LE64(b[i]) ‖ LE64(key[i-1] or root))
 *
 * which is the approximate producer's block chain (llm-d-router approximateprefix/hashing.go), so the scheduler's
 * one-call wasm chain (src/scheduler/xxh64-wasm.ts) keys a whole prompt at once. Only full blocks get a
 * key; the block size must equal the engine's (vLLM default 16). The hasher is injected: xxh64 (the
 * default, through the scheduler's Hasher, its wasm chain when it has one) or a pure-JS FNV-1a 64 over
 * (parent's 8 bytes ‖ token words) for callers that cannot await wasm instantiation. Both sides of one
 * process must use the same hasher. Token words are written in platform byte order (little-endian on
 * every platform Node ships for); keys are only compared within one process.
 */
import { createXxHasher, type Hasher } from "../scheduler/hash.ts";

/** Keys of a request's full blocks, in block order; element i is block i's key. */
export type BlockKeys = BigUint64Array;

/**
 * Keys as 32-bit halves, `[lo0, hi0, lo1, hi1, …]` (each half int32 or uint32: compare with `>>> 0`).
 * What the request side passes around: no BigInt and no typed-array allocation per request.
 */
export type PackedKeys = ArrayLike<number>;

/** Index of the low / high 32-bit half of a 64-bit element in a Uint32Array view of a BigUint64Array. */
export const LO = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1 ? 0 : 1;
export const HI = 1 - LO;
const LITTLE_ENDIAN = LO === 0;

/** A 64-bit hash for chained block keys. */
export interface BlockHasher {
  readonly name: string;
  /** The chain root for these bytes (model and salt). */
  root(data: Uint8Array): bigint;
  /**
   * Writes `count` chained keys to `out[at..at+count)`: key j hashes tokens
   * `[start + j*blockSize, start + (j+1)*blockSize)` chained on key j-1, and key -1 is `parent`.
   */
  chain(
    parent: bigint,
    tokens: ArrayLike<number>,
    start: number,
    blockSize: number,
    count: number,
    out: BigUint64Array,
    at: number,
  ): void;
  /** Optional: the keys chain() would write for `start` 0, as PackedKeys `[lo, hi]` pairs. */
  packed?(parent: bigint, tokens: ArrayLike<number>, blockSize: number, count: number): PackedKeys;
}

/**
 * What the xxh64 block hasher needs of an xxHash64 implementation: the scheduler's Hasher's hashing
 * part (src/scheduler/hash.ts). With `chain` and `scratch` (its wasm chain) a whole run of blocks is
 * one call, with `chainView` copied straight into a KeyArena; with `h64` alone, two calls per block.
 */
export type Xxh64Source = Pick<Hasher, "h64" | "chain" | "scratch" | "chainView">;

/** Int32s per chunk of a KeyArena: 64k (256 KiB), the keys of ~60 prompts of 8k tokens. */
const ARENA_CHUNK = 1 << 16;

/**
 * Storage for request keys (PackedKeys) that outlive the hasher's memory: views into large chunks
 * filled in order. One memcpy and one view per request, against a plain array of ~1,000 numbers
 * built element by element (or a typed array with its own off-heap buffer, which is slower still).
 * A full chunk is left to the views into it, and freed with the last of them.
 */
class KeyArena {
  #chunk = new Int32Array(ARENA_CHUNK);
  #top = 0;

  copy(src: Int32Array): Int32Array {
    const n = src.length;
    if (this.#top + n > this.#chunk.length) {
      this.#chunk = new Int32Array(Math.max(ARENA_CHUNK, n));
      this.#top = 0;
    }
    const at = this.#top;
    this.#chunk.set(src, at);
    this.#top = at + n;
    return this.#chunk.subarray(at, at + n);
  }
}

/** xxh64 block keys (`key = xxh64(LE64(xxh64(block)) ‖ LE64(parent))`) over an Xxh64Source. */
export function xxh64BlockHasher(src: Xxh64Source): BlockHasher {
  const chainFn = src.chain;
  const scratchFn = src.scratch;
  const viewFn = src.chainView;
  const arena = new KeyArena();
  // Per-block path: one scratch buffer for a block's token words, one for the 16-byte pair.
  let bytes = new Uint8Array(64);
  let words = new Uint32Array(bytes.buffer);
  const pair = new BigUint64Array(2);
  const pairBytes = new Uint8Array(pair.buffer);
  const perBlock = (parent: bigint, tokens: ArrayLike<number>, start: number, B: number, j: number) => {
    if (bytes.length < B * 4) {
      bytes = new Uint8Array(B * 4);
      words = new Uint32Array(bytes.buffer);
    }
    for (let i = 0, t = start + j * B; i < B; i++) words[i] = tokens[t++];
    pair[0] = src.h64(bytes.subarray(0, B * 4), 0n);
    pair[1] = parent;
    return src.h64(pairBytes, 0n);
  };
  // Wasm path: token words written straight into the chain's memory, hashed in place.
  let mem: ArrayBufferLike | null = null;
  let mem32: Uint32Array = new Uint32Array(0);
  const wasm = (parent: bigint, tokens: ArrayLike<number>, start: number, B: number, count: number) => {
    const words = start + count * B;
    // Room for every token word copied (a whole array copies fastest) plus the keys after the input.
    const u8 = (scratchFn as (n: number) => Uint8Array)(Math.max(tokens.length, words) * 4 + count * 8 + 8);
    if (u8.buffer !== mem) {
      mem = u8.buffer;
      mem32 = new Uint32Array(mem, 0, u8.byteLength >>> 2);
    }
    if (tokens.length <= mem32.length && (Array.isArray(tokens) || ArrayBuffer.isView(tokens)))
      mem32.set(tokens as ArrayLike<number>);
    else for (let t = 0; t < words; t++) mem32[t] = tokens[t];
    const input = u8.subarray(start * 4, words * 4);
    // A view of the keys in the hasher's memory when it offers one (valid until its next call).
    const view = viewFn?.(input, B * 4, count, 0, parent) ?? null;
    return view ?? (chainFn as NonNullable<Xxh64Source["chain"]>)(input, B * 4, count, 0, parent);
  };
  const fast = chainFn !== undefined && scratchFn !== undefined && LITTLE_ENDIAN;
  return {
    name: "xxh64",
    root: (data) => src.h64(data, 0n),
    chain(parent, tokens, start, blockSize, count, out, at) {
      if (count <= 0) return;
      const o32 = new Uint32Array(out.buffer, out.byteOffset, out.length * 2);
      if (fast) {
        const h = wasm(parent, tokens, start, blockSize, count);
        for (let j = 0; j < count; j++) {
          o32[2 * (at + j) + LO] = h[2 * j];
          o32[2 * (at + j) + HI] = h[2 * j + 1];
        }
        return;
      }
      for (let j = 0; j < count; j++) out[at + j] = parent = perBlock(parent, tokens, start, blockSize, j);
    },
    packed(parent, tokens, blockSize, count) {
      if (count <= 0) return [];
      if (fast) {
        const h = wasm(parent, tokens, 0, blockSize, count);
        return h instanceof Int32Array ? arena.copy(h) : h;
      }
      const out = new Array<number>(2 * count);
      const one = new BigUint64Array(1);
      const one32 = new Uint32Array(one.buffer);
      for (let j = 0; j < count; j++) {
        one[0] = parent = perBlock(parent, tokens, 0, blockSize, j);
        out[2 * j] = one32[LO];
        out[2 * j + 1] = one32[HI];
      }
      return out;
    },
  };
}

/** xxh64 keys with only a per-block `h64(bytes, seed)` (e.g. xxhash-wasm's h64Raw): the slow reference path. */
export function h64Hasher(h64: (data: Uint8Array, seed: bigint) => bigint): BlockHasher {
  return xxh64BlockHasher({ h64: (data, seed = 0n) => h64(data, seed) });
}

/** Creates the scheduler's xxh64 Hasher (wasm chain included) and returns the xxh64 block hasher (the default). */
export async function loadXxh64Hasher(): Promise<BlockHasher> {
  return xxh64BlockHasher(await createXxHasher());
}

const FNV_LO = 0x84222325;
const FNV_HI = 0xcbf29ce4;
const FNV_PRIME_LO = 0x1b3; // prime = 2^40 + 0x1b3
const TWO32 = 4294967296;

/** Pure-JS FNV-1a 64 over (parent key LE ‖ token words LE); synchronous, ~3.5× slower than xxh64-wasm. */
export function fnv1a64Hasher(): BlockHasher {
  const s64 = new BigUint64Array(1);
  const s32 = new Uint32Array(s64.buffer);
  let lo = 0;
  let hi = 0;
  const byte = (b: number): void => {
    lo = (lo ^ b) >>> 0;
    const t = lo * FNV_PRIME_LO;
    hi = (Math.imul(hi, FNV_PRIME_LO) + (lo << 8) + Math.floor(t / TWO32)) >>> 0;
    lo = t >>> 0;
  };
  const word = (w: number): void => {
    byte(w & 0xff);
    byte((w >>> 8) & 0xff);
    byte((w >>> 16) & 0xff);
    byte(w >>> 24);
  };
  return {
    name: "fnv1a64",
    root(data) {
      lo = FNV_LO;
      hi = FNV_HI;
      for (let i = 0; i < data.length; i++) byte(data[i]);
      s32[LO] = lo;
      s32[HI] = hi;
      return s64[0];
    },
    chain(parent, tokens, start, blockSize, count, out, at) {
      s64[0] = parent;
      let plo = s32[LO];
      let phi = s32[HI];
      const o32 = new Uint32Array(out.buffer, out.byteOffset, out.length * 2);
      let t = start;
      for (let j = 0; j < count; j++) {
        lo = FNV_LO;
        hi = FNV_HI;
        word(plo);
        word(phi);
        for (let i = 0; i < blockSize; i++) word(tokens[t++] >>> 0);
        o32[2 * (at + j) + LO] = plo = lo;
        o32[2 * (at + j) + HI] = phi = hi;
      }
    },
  };
}

export interface BlockKeyerOptions {
  hasher: BlockHasher;
  /** Tokens per block; must equal the engines' block size. Default 16 (vLLM's default). */
  blockSize?: number;
}

const UTF8 = new TextEncoder();

/** Computes request keys and chain roots with one hasher and block size; caches roots per (model, salt). */
export class BlockKeyer {
  readonly hasher: BlockHasher;
  readonly blockSize: number;
  private readonly roots = new Map<string, bigint>();
  private lastModel: string | null = null;
  private lastSalt = "";
  private lastRoot = 0n;

  constructor(opts: BlockKeyerOptions) {
    this.hasher = opts.hasher;
    this.blockSize = opts.blockSize ?? 16;
    if (!Number.isInteger(this.blockSize) || this.blockSize < 1)
      throw new RangeError(`blockSize must be a positive integer, got ${opts.blockSize}`);
  }

  /** The chain root for a model (or LoRA name) and cache_salt; an empty salt is no salt, as in vLLM. */
  root(model: string, cacheSalt?: string | null): bigint {
    const salt = cacheSalt ?? "";
    // Consecutive requests mostly name the same model and salt: no key string to build and hash.
    if (model === this.lastModel && salt === this.lastSalt) return this.lastRoot;
    const id = `${model}\u0000${salt}`;
    let r = this.roots.get(id);
    if (r === undefined) {
      r = this.hasher.root(UTF8.encode(id));
      if (this.roots.size >= 4096) this.roots.clear();
      this.roots.set(id, r);
    }
    this.lastModel = model;
    this.lastSalt = salt;
    this.lastRoot = r;
    return r;
  }

  /** Keys of every full block of `tokens` (a partial trailing block gets none), at most `maxBlocks`. */
  keys(tokens: ArrayLike<number>, model: string, cacheSalt?: string | null, maxBlocks = Infinity): BlockKeys {
    const n = Math.min(Math.floor(tokens.length / this.blockSize), maxBlocks);
    const out = new BigUint64Array(n);
    if (n > 0) this.hasher.chain(this.root(model, cacheSalt), tokens, 0, this.blockSize, n, out, 0);
    return out;
  }

  /** The same keys as PackedKeys (the request side's form: one wasm call, no BigInt per block). */
  packedKeys(
    tokens: ArrayLike<number>,
    model: string,
    cacheSalt?: string | null,
    maxBlocks = Infinity,
  ): PackedKeys {
    const n = Math.min(Math.floor(tokens.length / this.blockSize), maxBlocks);
    if (n <= 0) return [];
    const root = this.root(model, cacheSalt);
    if (this.hasher.packed !== undefined) return this.hasher.packed(root, tokens, this.blockSize, n);
    return packKeys(this.keys(tokens, model, cacheSalt, n));
  }
}

/** BlockKeys as PackedKeys. */
export function packKeys(keys: BlockKeys): PackedKeys {
  const k32 = new Uint32Array(keys.buffer, keys.byteOffset, keys.length * 2);
  const out = new Array<number>(2 * keys.length);
  for (let i = 0; i < keys.length; i++) {
    out[2 * i] = k32[2 * i + LO];
    out[2 * i + 1] = k32[2 * i + HI];
  }
  return out;
}

/** PackedKeys as BlockKeys. */
export function unpackKeys(packed: PackedKeys): BlockKeys {
  const out = new BigUint64Array(packed.length >>> 1);
  const o32 = new Uint32Array(out.buffer);
  for (let i = 0; i < out.length; i++) {
    o32[2 * i + LO] = packed[2 * i];
    o32[2 * i + HI] = packed[2 * i + 1];
  }
  return out;
}
