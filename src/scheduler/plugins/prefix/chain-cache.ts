/**
 * Reuses block hashes across requests that share a prompt prefix (a system prompt, an earlier
 * chat turn). Entries are keyed by the request's first chained hash and hold the last prompt bytes
 * and hashes seen with it; a new request copies the hashes of its leading blocks that are
 * byte-identical to the entry's and hashes only the rest. The result equals chainHashes() exactly:
 * h_i depends only on h0 and blocks 0..i-1. Bounded: `capacity` entries, least recently used out.
 */
import type { Hasher } from "../../hash.ts";
import type { PromptSegment } from "./hashing.ts";
import { BYTES_PER_TOKEN, chainFrom, tokenBytes } from "./hashing.ts";

interface Entry {
  h0: bigint;
  blockBytes: number;
  bytes: Uint8Array;
  hashes: bigint[];
}

export class ChainCache {
  readonly #entries = new Map<bigint, Entry>();
  hits = 0;
  reusedBlocks = 0;

  constructor(readonly capacity = 128) {}

  /** Same output as chainHashes(hasher, h0, seg, blockSizeTokens, maxBlocks, out). */
  hash(
    hasher: Hasher,
    h0: bigint,
    seg: PromptSegment,
    blockSizeTokens: number,
    maxBlocks: number,
    out: bigint[],
  ): void {
    const bytes = seg.kind === "bytes" ? seg.bytes : tokenBytes(seg.tokens);
    const blockBytes = blockSizeTokens * BYTES_PER_TOKEN;
    const start = out.length;
    chainFrom(hasher, bytes, blockBytes, Math.min(maxBlocks, 1), 0, h0, out);
    if (out.length === start || this.capacity <= 0) return;
    const key = out[start];
    const e = this.#entries.get(key);
    let n = 1;
    if (e !== undefined && e.h0 === h0 && e.blockBytes === blockBytes) {
      const limit = Math.min(e.hashes.length, maxBlocks);
      const cmp = new BlockComparer(bytes, e.bytes);
      while (n < limit && cmp.same(n * blockBytes, blockBytes)) out.push(e.hashes[n++]);
      if (n > 1) {
        this.hits++;
        this.reusedBlocks += n - 1;
      }
      this.#entries.delete(key);
    }
    chainFrom(hasher, bytes, blockBytes, maxBlocks, n, out[out.length - 1], out);
    if (seg.kind === "tokens") return; // token views alias caller memory; only bytes are kept
    this.#entries.set(key, { h0, blockBytes, bytes, hashes: out.slice(start) });
    if (this.#entries.size > this.capacity) this.#entries.delete(this.#entries.keys().next().value as bigint);
  }

  get size(): number {
    return this.#entries.size;
  }
}

/** Compares blocks of two byte arrays, word by word when both are 4-byte aligned. */
class BlockComparer {
  readonly #wa: Uint32Array | null;
  readonly #wb: Uint32Array | null;

  constructor(
    readonly a: Uint8Array,
    readonly b: Uint8Array,
  ) {
    const aligned = a.byteOffset % 4 === 0 && b.byteOffset % 4 === 0;
    this.#wa = aligned ? new Uint32Array(a.buffer, a.byteOffset, a.length >>> 2) : null;
    this.#wb = aligned ? new Uint32Array(b.buffer, b.byteOffset, b.length >>> 2) : null;
  }

  /** Whether the block at `off` (`len` bytes, clipped at the ends) is identical in a and b. */
  same(off: number, len: number): boolean {
    const { a, b } = this;
    const end = Math.min(off + len, a.length);
    if (end !== Math.min(off + len, b.length) || off >= end) return false;
    let i = off;
    const wa = this.#wa;
    const wb = this.#wb;
    if (wa !== null && wb !== null && off % 4 === 0) {
      const last = end >>> 2;
      for (let k = off >>> 2; k < last; k++) if (wa[k] !== wb[k]) return false;
      i = last * 4;
    }
    for (; i < end; i++) if (a[i] !== b[i]) return false;
    return true;
  }
}
