/**
 * vLLM's GPU block pool (vLLM v0.26.0 vllm/v1/core/block_pool.py semantics):
 * reference-counted blocks, block 0 reserved as the null block, a doubly linked LRU free queue
 * (allocate from the head, freed blocks appended to the tail), and a hash → blocks map of cached
 * full blocks. A freed block keeps its hash and stays hittable until it is reused; that reuse is
 * the eviction and emits BlockRemoved. Caching full blocks emits BlockStored (built by the engine).
 *
 * A block hash is the uint64 KV events carry, held as two int32 halves (hi, lo). The hash map is a
 * chained table in typed arrays: a bucket holds the first block of its chain and each block links
 * to the next, in caching order, so lookups, inserts and evictions allocate nothing (the fleet
 * simulator caches and evicts millions of blocks). Matching compares all 64 bits.
 */
import type { KVEvent } from "../kv/events.ts";

const NONE = -1;

export class BlockPool {
  readonly numBlocks: number;
  readonly refCnt: Int32Array;
  /** Cached hash per block as int32 halves, valid while the block holds a full hashed block. */
  private readonly blockHi: Int32Array;
  private readonly blockLo: Int32Array;
  /**
   * When each block was last cached (a counter from 1), or 0 while it holds no full hashed block:
   * one read tells whether a remembered lookup still holds (stillFirst).
   */
  private readonly cacheGen: Float64Array;
  private gen = 0;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  /** Sentinel index for the free list head/tail (numBlocks). */
  private readonly sentinel: number;
  private freeCount = 0;
  /** Hash table: bucket → first block of its chain; chain → next block (NONE ends a chain). */
  private readonly bucket: Int32Array;
  private readonly chain: Int32Array;
  private readonly mask: number;
  /** Distinct full hashes currently cached (vLLM does not de-duplicate concurrent copies). */
  private distinct = 0;
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
    this.blockHi = new Int32Array(numBlocks);
    this.blockLo = new Int32Array(numBlocks);
    this.cacheGen = new Float64Array(numBlocks);
    this.prev = new Int32Array(numBlocks + 1);
    this.next = new Int32Array(numBlocks + 1);
    let buckets = 16;
    while (buckets < 2 * numBlocks) buckets *= 2;
    this.bucket = new Int32Array(buckets).fill(NONE);
    this.chain = new Int32Array(numBlocks).fill(NONE);
    this.mask = buckets - 1;
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
    return this.distinct;
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

  private slot(hi: number, lo: number): number {
    return (lo ^ Math.imul(hi, 0x9e3779b1)) & this.mask;
  }

  /** The first block of `from`'s chain onward holding hash (hi, lo), or NONE. */
  private find(from: number, hi: number, lo: number): number {
    for (let b = from; b !== NONE; b = this.chain[b])
      if (this.blockLo[b] === lo && this.blockHi[b] === hi) return b;
    return NONE;
  }

  /** The generation at which `b` was last cached (see stillFirst). */
  generation(b: number): number {
    return this.cacheGen[b];
  }

  /**
   * Whether block `b`, which lookup returned when its generation was `gen`, would still be
   * returned for its hash: it has not been evicted or re-cached since. (A chain only grows at its
   * end, so no block with the same hash can have moved ahead of it.)
   */
  stillFirst(b: number, gen: number): boolean {
    return this.cacheGen[b] === gen;
  }

  /** The first cached block holding hash (hi, lo), or -1. */
  lookup(hi: number, lo: number): number {
    return this.find(this.bucket[this.slot(hi, lo)], hi, lo);
  }

  /** Claims already-cached blocks for one more request (prefix hit). */
  touch(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (this.refCnt[b] === 0) this.unlink(b);
      this.refCnt[b]++;
    }
  }

  /**
   * Pops `n` blocks from the head of the free queue, evicting any cached hash they hold, and
   * appends them to `out` (a request's block list); returns `out`.
   */
  getNewBlocksInto(out: number[], n: number): number[] {
    if (n > this.freeCount) throw new RangeError(`cannot get ${n} free blocks, only ${this.freeCount} free`);
    for (let i = 0; i < n; i++) {
      const b = this.next[this.sentinel];
      this.unlink(b);
      if (this.refCnt[b] !== 0)
        throw new Error(`block pool corrupted: free block ${b} has refCnt ${this.refCnt[b]}`);
      this.evict(b);
      this.refCnt[b] = 1;
      out.push(b);
    }
    return out;
  }

  private evict(b: number): void {
    if (this.cacheGen[b] === 0) return;
    this.cacheGen[b] = 0;
    const hi = this.blockHi[b];
    const lo = this.blockLo[b];
    const s = this.slot(hi, lo);
    let p = NONE;
    let x = this.bucket[s];
    while (x !== NONE && x !== b) {
      p = x;
      x = this.chain[x];
    }
    if (x === NONE) return;
    if (p === NONE) this.bucket[s] = this.chain[b];
    else this.chain[p] = this.chain[b];
    this.chain[b] = NONE;
    if (this.find(this.bucket[s], hi, lo) === NONE) this.distinct--;
    if (this.emitEvents)
      this.events.push({ type: "BlockRemoved", blockHashes: [toUint64(hi, lo)], medium: "GPU", groupIdx: 0 });
  }

  /** Releases blocks last to first (a request's tail is appended to the free queue first, so evicted first). */
  freeReversed(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i];
      if (b === 0) continue;
      const r = --this.refCnt[b];
      if (r < 0) throw new Error(`block pool corrupted: block ${b} freed twice`);
      if (r === 0) this.append(b);
    }
  }

  /** Registers block `b` (holding no hash) as holding full block hash (hi, lo): it becomes hittable. */
  cacheBlock(b: number, hi: number, lo: number): void {
    if (!this.enableCaching) return;
    this.blockHi[b] = hi;
    this.blockLo[b] = lo;
    this.cacheGen[b] = ++this.gen;
    this.chain[b] = NONE;
    const s = this.slot(hi, lo);
    let x = this.bucket[s];
    if (x === NONE) {
      this.bucket[s] = b;
      this.distinct++;
      return;
    }
    let seen = false;
    for (;;) {
      if (this.blockLo[x] === lo && this.blockHi[x] === hi) seen = true;
      const nx = this.chain[x];
      if (nx === NONE) break;
      x = nx;
    }
    this.chain[x] = b;
    if (!seen) this.distinct++;
  }

  /** Queues an event the engine built (BlockStored), in order with the pool's own. */
  pushEvent(e: KVEvent): void {
    if (this.emitEvents) this.events.push(e);
  }

  /** reset_prefix_cache: only when no block is in use; drops every hash and emits AllBlocksCleared. */
  resetPrefixCache(): boolean {
    if (this.freeCount !== this.numBlocks - 1) return false;
    this.bucket.fill(NONE);
    this.chain.fill(NONE);
    this.cacheGen.fill(0);
    this.distinct = 0;
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
    const chained = new Uint8Array(this.numBlocks);
    const hashes = new Set<bigint>();
    for (let s = 0; s < this.bucket.length; s++) {
      for (let b = this.bucket[s]; b !== NONE; b = this.chain[b]) {
        if (chained[b]) throw new Error(`block ${b} twice in the hash table`);
        chained[b] = 1;
        if (this.cacheGen[b] === 0 || this.slot(this.blockHi[b], this.blockLo[b]) !== s)
          throw new Error(`cached map points hash to block ${b} which holds another`);
        hashes.add(toUint64(this.blockHi[b], this.blockLo[b]));
      }
    }
    for (let b = 0; b < this.numBlocks; b++)
      if (Number(this.cacheGen[b] !== 0) !== chained[b])
        throw new Error(`block ${b} holds a hash but is not in the table`);
    if (hashes.size !== this.distinct)
      throw new Error(`distinct hashes ${this.distinct}, counted ${hashes.size}`);
  }
}

/** The uint64 of int32 halves, as KV events carry it. */
export function toUint64(hi: number, lo: number): bigint {
  return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
}
