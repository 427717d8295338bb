/**
 * Request block keys for precise prefix routing: kvgate's own chained 64-bit keys computed from token ids.
 *
 * Like llm-d's dual-key design (llm-d/llm-d-kv-cache@7be76e1 docs/architecture.md, issue #147), kvgate never
 * reproduces vLLM's block
 * hash. It computes its own keys from token ids, on the request side (from the gateway's tokenization) and
 * on the event side (from BlockStored token_ids), and maps each endpoint's engine hashes to them only to
 * apply BlockRemoved. So routing does not depend on vLLM's `--prefix-caching-hash-algo` or PYTHONHASHSEED.
 *
 *   root   = H64(utf8(model) ‖ 0x00 ‖ utf8(cache_salt or ""))          (the model is the LoRA name for LoRA)
 *   key[i] = H64(tokens of block i as 4-byte words, chained on key[i-1] or root)
 *
 * Only full blocks get a key; the block size must equal the engine's (vLLM default 16). The hasher is
 * injected: xxh64 (xxhash-wasm, the parent key as seed) is the default; a pure-JS FNV-1a 64 over the same
 * bytes (parent's 8 bytes first) exists for callers that cannot await the wasm instantiation. Measured on
 * 16-token blocks: xxh64-wasm ≈ 9.1M blocks/s, FNV-1a ≈ 2.6M blocks/s per core, so xxh64 is the default.
 * Both sides of one process must use the same hasher. Token words are written in platform byte order
 * (little-endian on every platform Node ships for); keys are only compared within one process.
 */
import type { XXHashAPI } from "xxhash-wasm";

/** Keys of a request's full blocks, in block order; element i is block i's key. */
export type BlockKeys = BigUint64Array;

/** Index of the low / high 32-bit half of a 64-bit element in a Uint32Array view of a BigUint64Array. */
export const LO = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1 ? 0 : 1;
export const HI = 1 - LO;

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
}

/**
 * xxh64 chaining: `key = xxh64(block token bytes, seed = parent key)`, over any xxh64 implementation
 * (`h64(bytes, seed)`: xxhash-wasm's h64Raw, or the scheduler's injected Hasher.h64).
 */
export function h64Hasher(h64: (data: Uint8Array, seed: bigint) => bigint): BlockHasher {
  let bytes = new Uint8Array(64);
  let words = new Uint32Array(bytes.buffer);
  let view = bytes;
  return {
    name: "xxh64",
    root: (data) => h64(data, 0n),
    chain(parent, tokens, start, blockSize, count, out, at) {
      if (view.length !== blockSize * 4) {
        if (bytes.length < blockSize * 4) {
          bytes = new Uint8Array(blockSize * 4);
          words = new Uint32Array(bytes.buffer);
        }
        view = bytes.subarray(0, blockSize * 4);
      }
      let seed = parent;
      let t = start;
      for (let j = 0; j < count; j++) {
        for (let i = 0; i < blockSize; i++) words[i] = tokens[t++];
        seed = h64(view, seed);
        out[at + j] = seed;
      }
    },
  };
}

/** xxh64 through xxhash-wasm. */
export function xxh64Hasher(api: XXHashAPI): BlockHasher {
  return h64Hasher((data, seed) => api.h64Raw(data, seed));
}

/** Loads xxhash-wasm and returns the xxh64 hasher (the default). */
export async function loadXxh64Hasher(): Promise<BlockHasher> {
  const { default: xxhash } = await import("xxhash-wasm");
  return xxh64Hasher(await xxhash());
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

  constructor(opts: BlockKeyerOptions) {
    this.hasher = opts.hasher;
    this.blockSize = opts.blockSize ?? 16;
    if (!Number.isInteger(this.blockSize) || this.blockSize < 1)
      throw new RangeError(`blockSize must be a positive integer, got ${opts.blockSize}`);
  }

  /** The chain root for a model (or LoRA name) and cache_salt; an empty salt is no salt, as in vLLM. */
  root(model: string, cacheSalt?: string | null): bigint {
    const id = `${model}\u0000${cacheSalt ?? ""}`;
    let r = this.roots.get(id);
    if (r === undefined) {
      r = this.hasher.root(UTF8.encode(id));
      if (this.roots.size >= 4096) this.roots.clear();
      this.roots.set(id, r);
    }
    return r;
  }

  /** Keys of every full block of `tokens` (a partial trailing block gets none), at most `maxBlocks`. */
  keys(tokens: ArrayLike<number>, model: string, cacheSalt?: string | null, maxBlocks = Infinity): BlockKeys {
    const n = Math.min(Math.floor(tokens.length / this.blockSize), maxBlocks);
    const out = new BigUint64Array(n);
    if (n > 0) this.hasher.chain(this.root(model, cacheSalt), tokens, 0, this.blockSize, n, out, 0);
    return out;
  }
}
