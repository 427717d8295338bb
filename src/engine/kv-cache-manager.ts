/**
 * The simulated engine's KV-cache manager (vLLM's KVCacheManager): the block pool, each request's
 * block hasher, prefix-cache lookups, slot allocation, and the BlockStored events of newly cached
 * blocks. Pure.
 */
import { blockExtraKeys, noneHash } from "../kv/vllm-block-hash.ts";
import { BlockPool } from "./block-pool.ts";
import type { Req } from "./engine-state.ts";
import {
  type BlockHasher,
  FastRequestBlockHasher,
  fastRoot,
  type PromptHashMemo,
  Sha256BlockHasher,
} from "./fast-block-hash.ts";
import type { EngineConfig, EngineRequest } from "./types.ts";

/**
 * How prompt blocks are hashed for the prefix cache. "sha256_cbor" (the default) is vLLM's, and
 * what KV events must carry; "fast64" (fast-block-hash.ts) has the same chain structure and so the
 * same hits, for runs that consume no KV events (the fleet simulator).
 */
export type BlockHashAlgo = "sha256_cbor" | "fast64";

export class KVCacheManager {
  readonly pool: BlockPool;
  private readonly config: EngineConfig;
  private readonly root: Uint8Array;
  private readonly fastRoot: [number, number] | null;

  private readonly memo: PromptHashMemo | null;

  /** Throws RangeError on an unknown `algo`. `memo` serves fast64 only (see PromptHashMemo). */
  constructor(config: EngineConfig, algo: BlockHashAlgo, memo?: PromptHashMemo) {
    this.config = config;
    this.memo = algo === "fast64" ? (memo ?? null) : null;
    this.pool = new BlockPool(config.numGpuBlocks, config.enablePrefixCaching, config.enableKvCacheEvents);
    this.root = noneHash(config.hashSeed);
    if (algo !== "sha256_cbor" && algo !== "fast64")
      throw new RangeError(`engine config: unknown blockHashAlgo ${algo}`);
    this.fastRoot = algo === "fast64" ? fastRoot(config.hashSeed) : null;
  }

  /** A block hasher for `req`, sized for the longest the request can get. */
  newHasher(req: EngineRequest): BlockHasher {
    const capacity = Math.floor((req.promptTokenIds.length + req.maxTokens) / this.config.blockSize);
    return this.fastRoot === null
      ? new Sha256BlockHasher(this.root, this.config.blockSize, capacity, req.loraName, req.cacheSalt)
      : new FastRequestBlockHasher(
          this.fastRoot,
          this.config.blockSize,
          capacity,
          req.loraName,
          req.cacheSalt,
        );
  }

  /** Hashes the full blocks of `r`'s prompt (`prompt`, the array its tokens were copied from). */
  hashPrompt(r: Req, prompt: readonly number[]): void {
    const h = r.hasher;
    if (this.memo === null || !(h instanceof FastRequestBlockHasher)) {
      h.update(r.tokens, r.numPromptTokens);
      return;
    }
    const key = h.chainKey;
    const known = this.memo.get(prompt, key);
    if (known !== undefined) h.restore(known);
    else {
      h.update(r.tokens, r.numPromptTokens);
      this.memo.set(prompt, h.snapshot(key));
    }
  }

  /**
   * Cached leading blocks of `r`, capped so at least the last prompt token is recomputed. A request
   * that cannot be admitted is looked up again at every step, so the last answer is kept and only
   * its blocks that were evicted or re-cached since, and the blocks after it, are looked up again.
   * The returned array is the request's memo: valid until the next call.
   */
  longestCacheHit(r: Req): readonly number[] {
    const { his, los, count } = r.hasher;
    const limit = Math.min(Math.floor((r.numTokens - 1) / this.config.blockSize), count);
    const hits = r.memoHits;
    const gens = r.memoGens;
    const pool = this.pool;
    let i = 0;
    const known = Math.min(hits.length, limit);
    while (i < known && pool.stillFirst(hits[i], gens[i])) i++;
    hits.length = i;
    gens.length = i;
    for (; i < limit; i++) {
      const b = pool.lookup(his[i], los[i]);
      if (b < 0) break;
      hits.push(b);
      gens.push(pool.generation(b));
    }
    return hits;
  }

  /**
   * vLLM's allocate_slots: take hit blocks and new blocks for `n` more tokens, or fail leaving state
   * untouched. `delayCache` (vLLM delay_cache_blocks, for blocks a remote KV transfer will fill)
   * leaves the new blocks unhashed until cacheComputed.
   */
  allocateSlots(r: Req, n: number, hitBlocks: readonly number[], delayCache = false): boolean {
    const bs = this.config.blockSize;
    const computedAfter = r.numComputed + hitBlocks.length * bs;
    const required = Math.ceil((computedAfter + n) / bs);
    const numNew = Math.max(0, required - r.blocks.length - hitBlocks.length);
    let evictableHits = 0;
    for (const b of hitBlocks) if (this.pool.refCnt[b] === 0) evictableHits++;
    if (numNew > this.pool.numFreeBlocks - evictableHits) return false;
    if (hitBlocks.length > 0) {
      this.pool.touch(hitBlocks);
      for (const b of hitBlocks) r.blocks.push(b);
      r.numCachedBlocks = hitBlocks.length;
    }
    if (numNew > 0) this.pool.getNewBlocksInto(r.blocks, numNew);
    if (this.config.enablePrefixCaching && !delayCache) {
      const full = Math.floor(Math.min(computedAfter + n, r.numTokens) / bs);
      this.cacheFullBlocks(r, full);
    }
    return true;
  }

  /** vLLM's cache_blocks(request, num_computed_tokens): hashes the full blocks of the first `tokens`. */
  cacheComputed(r: Req, tokens: number): void {
    if (this.config.enablePrefixCaching) this.cacheFullBlocks(r, Math.floor(tokens / this.config.blockSize));
  }

  private cacheFullBlocks(r: Req, numFull: number): void {
    const from = r.numCachedBlocks;
    if (numFull <= from) return;
    const h = r.hasher;
    for (let i = from; i < numFull; i++) this.pool.cacheBlock(r.blocks[i], h.his[i], h.los[i]);
    r.numCachedBlocks = numFull;
    if (!this.config.enableKvCacheEvents) return;
    // vLLM's cache_full_blocks publishes one BlockStored per newly cached run of blocks.
    const bs = this.config.blockSize;
    const values: bigint[] = [];
    const extra: (unknown[] | null)[] = [];
    for (let i = from; i < numFull; i++) {
      values.push(h.value(i));
      extra.push(blockExtraKeys(i, r.input.loraName, r.input.cacheSalt));
    }
    this.pool.pushEvent({
      type: "BlockStored",
      blockHashes: values,
      parentBlockHash: from === 0 ? null : h.value(from - 1),
      tokenIds: tokenIds(r.tokens, from * bs, numFull * bs),
      blockSize: bs,
      loraId: r.input.loraId ?? null,
      medium: "GPU",
      loraName: r.input.loraName ?? null,
      extraKeys: extra,
      groupIdx: 0,
      kvCacheSpecKind: "full_attention",
      kvCacheSpecSlidingWindow: null,
    });
  }

  /** Gives back every block of `r` (it keeps none). */
  freeBlocks(r: Req): void {
    this.pool.freeReversed(r.blocks);
    r.blocks = [];
    r.numCachedBlocks = 0;
  }
}

/** tokens[from, to) as a plain array (a loop: Array.from over a typed array is several times slower). */
function tokenIds(tokens: Int32Array, from: number, to: number): number[] {
  const out: number[] = [];
  for (let i = from; i < to; i++) out.push(tokens[i]);
  return out;
}
