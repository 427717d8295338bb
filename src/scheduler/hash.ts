/**
 * The 64-bit hash behind prefix block keys. xxhash-wasm needs an async init, while the scheduler
 * is synchronous, so callers create one Hasher at startup (createXxHasher) and inject it.
 * Seed 0 by default, matching llm-d's cespare/xxhash Sum64
 * (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/hashing.go`).
 */
import xxhashWasm from "xxhash-wasm";
import { Xxh64Chain } from "./xxh64-wasm.ts";

/**
 * 64-bit hashes as (lo, hi) 32-bit halves: hash i is p[2i] | p[2i+1] << 32, each half stored as
 * an int32 (read it with `>>> 0` for the unsigned value). A plain array of int32s is what V8
 * stores most cheaply (small integers, no boxing).
 */
export type PackedHashes = ArrayLike<number>;

export interface Hasher {
  /** xxHash64 of `bytes` with `seed` (default 0n), as an unsigned 64-bit bigint. */
  h64(bytes: Uint8Array, seed?: bigint): bigint;
  /**
   * Optional fast path for the whole prefix block chain (chainFrom in plugins/prefix/hashing.ts):
   * h_first, h_first+1, … of `bytes` in `blockBytes` blocks, parent hash `prev`, up to block
   * `maxBlocks − 1`, as PackedHashes. Must equal chainFrom's loop over h64.
   */
  chain?(bytes: Uint8Array, blockBytes: number, maxBlocks: number, first: number, prev: bigint): PackedHashes;
  /**
   * Optional, with chain: a buffer of at least `bytes` bytes to write chain() input into from
   * offset 0, so that chain() hashes it in place (no copy). Bytes written survive a later scratch()
   * call (which may return a new, larger view); chain() and scratch() may overwrite them, h64()
   * must not.
   */
  scratch?(bytes: number): Uint8Array;
  /**
   * Optional, with chain: chain()'s hashes as a view of the hasher's memory, valid only until its
   * next call (the caller copies them at once); null when unavailable (big-endian host).
   */
  chainView?(
    bytes: Uint8Array,
    blockBytes: number,
    maxBlocks: number,
    first: number,
    prev: bigint,
  ): Int32Array | null;
}

export async function createXxHasher(): Promise<Hasher> {
  const api = await xxhashWasm();
  const chain = new Xxh64Chain();
  return {
    h64: (bytes, seed = 0n) => api.h64Raw(bytes, seed),
    chain: (bytes, blockBytes, maxBlocks, first, prev) =>
      chain.chain(bytes, blockBytes, maxBlocks, first, prev),
    scratch: (bytes) => chain.scratch(bytes),
    chainView: (bytes, blockBytes, maxBlocks, first, prev) =>
      chain.chainView(bytes, blockBytes, maxBlocks, first, prev),
  };
}
