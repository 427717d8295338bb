/**
 * The 64-bit hash behind prefix block keys. xxhash-wasm needs an async init, while the scheduler
 * is synchronous, so callers create one Hasher at startup (createXxHasher) and inject it.
 * Seed 0 by default, matching llm-d's cespare/xxhash Sum64 (reference §3.1).
 */
import xxhashWasm from "xxhash-wasm";

export interface Hasher {
  /** xxHash64 of `bytes` with `seed` (default 0n), as an unsigned 64-bit bigint. */
  h64(bytes: Uint8Array, seed?: bigint): bigint;
}

export async function createXxHasher(): Promise<Hasher> {
  const api = await xxhashWasm();
  return { h64: (bytes, seed = 0n) => api.h64Raw(bytes, seed) };
}
