/**
 * vLLM's GPU block pool (vllm/v1/core/block_pool.py semantics, vllm-wire-formats.md §6):
 * reference-counted blocks, block 0 reserved as the null block, a doubly linked LRU free queue
 * (allocate from the head, freed blocks appended to the tail), and a hash → blocks map of cached
 * full blocks. A freed block keeps its hash and stays hittable until it is reused; that reuse is
 * the eviction and emits BlockRemoved. Caching full blocks emits BlockStored.
 */
import type { KVEvent } from "../kv/events.ts";

export class BlockPool {
  readonly numBlocks: number;
  readonly refCnt: Int32Array;
  /** Cached hash per block (uint64), or null while the block holds no full hashed block. */
  readonly blockHash: (bigint | null)[];
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  /** Sentinel index for the free list head/tail (numBlocks). */
  private readonly sentinel: number;
  private freeCount = 0;
  /** hash → block ids holding it (vLLM does not de-duplicate concurrent copies). */
  private readonly cached = new Map<bigint, number[]>();
  private events: KVEvent[] = [];

  constructor(
    numBlocks: number,
    readonly enableCaching: boolean,
    readonly emitEvents: boolean,
  ) {
    if (!Number.isInteger(numBlocks) || numBlocks < 2)
      throw new RangeError(`numGpuBlocks must be ≥ 2, got ${numBlocks}`);
    this.numBlocks = numBlocks;
    this.refCnt = new Int32Array(numBlocks);
    this.blockHash = new Array(numBlocks).fill(null);
    this.prev = new Int32Array(numBlocks + 1);
    this.next = new Int32Array(numBlocks + 1);
    this.sentinel = numBlocks;
    this.prev[this.sentinel] = this.sentinel;
    this.next[this.sentinel] = this.sentinel;
    // Block 0 is the null block: never in the free queue, never freed.
    this.refCnt[0] = 1;
    for (let b = 1; b < numBlocks; b++) this.append(b);
  }

  get numFreeBlocks(): number {
    return this.freeCount;
  }

  /** vLLM's usage: 1 − free / (numBlocks − 1). Free includes evictable cached blocks. */
  usage(): number {
    return 1 - this.freeCount / (this.numBlocks - 1);
  }

  /** Number of distinct cached hashes (for tests and stats). */
  get numCachedHashes(): number {
    return this.cached.size;
  }

  private append(b: number): void {
    const s = this.sentinel;
    const last = this.prev[s];
    this.next[last] = b;
    this.prev[b] = last;
    this.next[b] = s;
    this.prev[s] = b;
    this.freeCount++;
  }

  private unlink(b: number): void {
    const p = this.prev[b];
    const n = this.next[b];
    this.next[p] = n;
    this.prev[n] = p;
    this.prev[b] = -1;
    this.next[b] = -1;
    this.freeCount--;
  }

  /** A cached block holding `hash`, or -1. */
  lookup(hash: bigint): number {
    const ids = this.cached.get(hash);
    return ids === undefined ? -1 : ids[0];
  }

  /** Claims already-cached blocks for one more request (prefix hit). */
  touch(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (this.refCnt[b] === 0) this.unlink(b);
      this.refCnt[b]++;
    }
  }

  /** Pops `n` blocks from the head of the free queue, evicting any cached hash they hold. */
  getNewBlocks(n: number): number[] {
    if (n > this.freeCount) throw new RangeError(`cannot get ${n} free blocks, only ${this.freeCount} free`);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const b = this.next[this.sentinel];
      this.unlink(b);
      if (this.refCnt[b] !== 0)
        throw new Error(`block pool corrupted: free block ${b} has refCnt ${this.refCnt[b]}`);
      this.evict(b);
      this.refCnt[b] = 1;
      out[i] = b;
    }
    return out;
  }

  private evict(b: number): void {
    const h = this.blockHash[b];
    if (h === null) return;
    this.blockHash[b] = null;
    const ids = this.cached.get(h);
    if (ids === undefined) return;
    const at = ids.indexOf(b);
    if (at < 0) return;
    if (ids.length === 1) this.cached.delete(h);
    else ids.splice(at, 1);
    if (this.emitEvents)
      this.events.push({ type: "BlockRemoved", blockHashes: [h], medium: "GPU", groupIdx: 0 });
  }

  /** Releases blocks in the order given (callers pass a request's blocks reversed: tail evicted first). */
  free(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (b === 0) continue;
      const r = --this.refCnt[b];
      if (r < 0) throw new Error(`block pool corrupted: block ${b} freed twice`);
      if (r === 0) this.append(b);
    }
  }

  /**
   * Registers newly full blocks under their hashes and emits one BlockStored for the run,
   * as vLLM's cache_full_blocks does. `parent` is the hash of the block before the run.
   */
  cacheFullBlocks(
    blocks: readonly number[],
    hashes: readonly bigint[],
    parent: bigint | null,
    tokenIds: number[],
    blockSize: number,
    loraName: string | null,
    extraKeys: (unknown[] | null)[],
  ): void {
    if (!this.enableCaching || blocks.length === 0) return;
    for (let i = 0; i < blocks.length; i++) {
      const b = blocks[i];
      const h = hashes[i];
      this.blockHash[b] = h;
      const ids = this.cached.get(h);
      if (ids === undefined) this.cached.set(h, [b]);
      else ids.push(b);
    }
    if (this.emitEvents)
      this.events.push({
        type: "BlockStored",
        blockHashes: hashes.slice(),
        parentBlockHash: parent,
        tokenIds,
        blockSize,
        loraId: null,
        medium: "GPU",
        loraName,
        extraKeys,
        groupIdx: 0,
        kvCacheSpecKind: "full_attention",
        kvCacheSpecSlidingWindow: null,
      });
  }

  /** reset_prefix_cache: only when no block is in use; drops every hash and emits AllBlocksCleared. */
  resetPrefixCache(): boolean {
    if (this.freeCount !== this.numBlocks - 1) return false;
    this.cached.clear();
    this.blockHash.fill(null);
    if (this.emitEvents) this.events.push({ type: "AllBlocksCleared" });
    return true;
  }

  /** Events since the last call, in order. */
  takeEvents(): KVEvent[] {
    const e = this.events;
    this.events = [];
    return e;
  }

  /** Checks the pool's invariants; throws describing the first violation. For tests. */
  checkInvariants(): void {
    let n = 0;
    const seen = new Uint8Array(this.numBlocks);
    for (let b = this.next[this.sentinel]; b !== this.sentinel; b = this.next[b]) {
      if (b === 0) throw new Error("null block in free queue");
      if (seen[b]) throw new Error(`block ${b} twice in free queue`);
      seen[b] = 1;
      if (this.refCnt[b] !== 0) throw new Error(`free block ${b} has refCnt ${this.refCnt[b]}`);
      n++;
    }
    if (n !== this.freeCount) throw new Error(`free count ${this.freeCount} but ${n} blocks in queue`);
    for (let b = 1; b < this.numBlocks; b++) {
      if (this.refCnt[b] < 0) throw new Error(`block ${b} refCnt ${this.refCnt[b]}`);
      if (this.refCnt[b] === 0 && !seen[b]) throw new Error(`block ${b} leaked: refCnt 0 but not free`);
    }
    for (const [h, ids] of this.cached) {
      for (const b of ids)
        if (this.blockHash[b] !== h)
          throw new Error(`cached map points hash to block ${b} which holds another`);
    }
  }
}
