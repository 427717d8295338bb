/**
 * vLLM's prefix-cache block hash with `--prefix-caching-hash-algo sha256_cbor`
 * (vLLM v0.26.0 vllm/v1/core/kv_cache_utils.py: hash_block_tokens):
 *   NONE_HASH = sha256(cbor(PYTHONHASHSEED as a string))
 *   h_i       = sha256(cbor_canonical([parent_digest_or_NONE_HASH, [tokens...], extra_keys_or_None]))
 * and the value KV events carry is the digest's last 8 bytes as a big-endian uint64.
 * Only the CBOR subset these tuples need is encoded (byte strings, unsigned and negative ints,
 * text, arrays, null), in the shortest canonical form, which is what cbor2 canonical=True emits.
 */
import { hash as oneShotHash } from "node:crypto";

/** A block's full digest and the uint64 that events and indexes use. */
export interface BlockHash {
  digest: Uint8Array;
  value: bigint;
}

/** Extra keys of one block: LoRA name, then cache_salt (first block only); null when empty. */
export type ExtraKeys = (string | number)[] | null;

class CborWriter {
  private buf = new Uint8Array(256);
  private len = 0;
  private ensure(n: number): void {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
  }
  head(major: number, value: number): void {
    this.ensure(9);
    const m = major << 5;
    const b = this.buf;
    if (value < 24) b[this.len++] = m | value;
    else if (value < 0x100) {
      b[this.len++] = m | 24;
      b[this.len++] = value;
    } else if (value < 0x10000) {
      b[this.len++] = m | 25;
      b[this.len++] = value >>> 8;
      b[this.len++] = value & 0xff;
    } else if (value < 0x100000000) {
      b[this.len++] = m | 26;
      b[this.len++] = value >>> 24;
      b[this.len++] = (value >>> 16) & 0xff;
      b[this.len++] = (value >>> 8) & 0xff;
      b[this.len++] = value & 0xff;
    } else {
      b[this.len++] = m | 27;
      const hi = Math.floor(value / 0x100000000);
      const lo = value >>> 0;
      for (const w of [hi, lo]) {
        b[this.len++] = w >>> 24;
        b[this.len++] = (w >>> 16) & 0xff;
        b[this.len++] = (w >>> 8) & 0xff;
        b[this.len++] = w & 0xff;
      }
    }
  }
  int(v: number): void {
    if (!Number.isSafeInteger(v)) throw new RangeError(`cbor: not a safe integer: ${v}`);
    if (v >= 0) this.head(0, v);
    else this.head(1, -1 - v);
  }
  bytes(v: Uint8Array): void {
    this.head(2, v.length);
    this.ensure(v.length);
    this.buf.set(v, this.len);
    this.len += v.length;
  }
  text(s: string): void {
    const enc = new TextEncoder().encode(s);
    this.head(3, enc.length);
    this.ensure(enc.length);
    this.buf.set(enc, this.len);
    this.len += enc.length;
  }
  null(): void {
    this.ensure(1);
    this.buf[this.len++] = 0xf6;
  }
  result(): Uint8Array {
    return this.buf.subarray(0, this.len);
  }
  reset(): void {
    this.len = 0;
  }
}

/** One writer reused by every hash: hashing is synchronous, so no two users overlap. */
const shared = new CborWriter();

function sha256(data: Uint8Array): Uint8Array {
  // One-shot crypto.hash (Node ≥ 20.12) avoids a Hash object per block; the hot path of the simulator.
  return oneShotHash("sha256", data, "buffer");
}

function low64(digest: Uint8Array): bigint {
  const dv = new DataView(digest.buffer, digest.byteOffset, digest.byteLength);
  return dv.getBigUint64(digest.byteLength - 8, false);
}

/** The chain root: sha256 of the CBOR text string of the seed (vLLM hashes the seed *string*). */
export function noneHash(hashSeed: string): Uint8Array {
  const w = new CborWriter();
  w.text(hashSeed);
  return sha256(w.result());
}

/** Hash of one full block given its parent's digest (or the root for block 0). */
export function hashBlockTokens(
  parentDigest: Uint8Array,
  tokens: ArrayLike<number>,
  start: number,
  end: number,
  extraKeys: ExtraKeys,
): BlockHash {
  const w = shared;
  w.reset();
  w.head(4, 3);
  w.bytes(parentDigest);
  w.head(4, end - start);
  for (let i = start; i < end; i++) w.int(tokens[i]);
  if (extraKeys === null) w.null();
  else {
    w.head(4, extraKeys.length);
    for (const k of extraKeys) {
      if (typeof k === "string") w.text(k);
      else w.int(k);
    }
  }
  const digest = sha256(w.result());
  return { digest, value: low64(digest) };
}

/** Extra keys of block `index` as vLLM builds them: [lora_name] + [cache_salt if index == 0]. */
export function blockExtraKeys(index: number, loraName?: string, cacheSalt?: string): ExtraKeys {
  const keys: string[] = [];
  if (loraName) keys.push(loraName);
  if (index === 0 && cacheSalt) keys.push(cacheSalt);
  return keys.length > 0 ? keys : null;
}

/**
 * Incremental hasher for one request: hashes each full block once, as tokens arrive.
 * `hashes[i]` is block i's hash; a partial trailing block is not hashed.
 */
export class RequestBlockHasher {
  readonly hashes: BlockHash[] = [];
  constructor(
    private readonly root: Uint8Array,
    private readonly blockSize: number,
    private readonly loraName?: string,
    private readonly cacheSalt?: string,
  ) {}
  /** Hashes every newly full block of `tokens` (the request's whole token sequence so far). */
  update(tokens: ArrayLike<number>): void {
    const full = Math.floor(tokens.length / this.blockSize);
    for (let i = this.hashes.length; i < full; i++) {
      const parent = i === 0 ? this.root : this.hashes[i - 1].digest;
      const extra = blockExtraKeys(i, this.loraName, this.cacheSalt);
      this.hashes.push(hashBlockTokens(parent, tokens, i * this.blockSize, (i + 1) * this.blockSize, extra));
    }
  }
}
