/**
 * The CPU offload tier of one engine, after vLLM's native OffloadingConnector
 * (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, vllm/v1/kv_offload/cpu/):
 * KV is stored to host memory in offload chunks of `chunkTokens` (a multiple of the GPU block size,
 * by default one GPU block) as a request's blocks fill, keyed by the chunk's last GPU block hash;
 * the tier has its own LRU and capacity (cpu_bytes_to_use ÷ bytes per chunk). A store becomes
 * hittable when its device→host copy ends; a load pins its chunks until the caller reports the
 * host→device copy done. Each direction is one FIFO link at its bandwidth, so transfers queue and
 * none is free. A request that finishes while its stores copy keeps its GPU blocks until they end
 * (vLLM request_finished returns True while stores are pending). With a fleet's shared storage
 * (storage-tier.ts), the lookup continues chunk by chunk from CPU into storage, a storage hit loads at
 * the storage's read bandwidth beside the CPU part of the same load, and every chunk stored to CPU is
 * written on to storage unless storage holds it already. Pure: times are passed in.
 */
import type { KVEvent } from "../kv/events.ts";
import type { BlockPool } from "./block-pool.ts";
import {
  describedEvent,
  type OffloadCounters,
  type OffloadLoad,
  type OffloadTransfer,
  placeholderEvent,
} from "./cpu-tier-events.ts";
import type { Req } from "./engine-state.ts";
import type { SharedStorage, StorageItem } from "./storage-tier.ts";
import { lruVictims } from "./tier-lru.ts";
import type { OffloadConfig } from "./types.ts";

export type { OffloadCounters, OffloadLoad, OffloadTransfer } from "./cpu-tier-events.ts";

/**
 * Host link defaults. PCIe Gen5 x16 is 63 GB/s per direction theoretical (PCI-SIG PCIe 5.0 spec:
 * 32 GT/s × 16 lanes, 128b/130b); H100/H200 hosts reach about 50 GB/s with pinned-memory DMA
 * (NVIDIA H100 datasheet "PCIe Gen5 128 GB/s" bidirectional; vLLM blog 2026-01-08 "KV offloading
 * connector" measured DMA near link speed with contiguous blocks). Both directions default to 50 GB/s.
 */
export const DEFAULT_HOST_LINK_BYTES_PER_SECOND = 50e9;

interface Chunk {
  /** When its store's copy ends; hittable from then on. */
  readyAt: number;
  /** Loads in flight reading it (it cannot be evicted meanwhile). */
  pins: number;
  /** The store job it came in: a placeholder BlockStored covers one job's chunks. */
  job: number;
  /** Its BlockStored has been published. */
  published: boolean;
  /** The placeholder event's hash (the chunk's last GPU block hash). */
  key: bigint;
  /** Self-describing events only: the chunk's per-block hashes, parent and tokens. */
  hashes: bigint[] | null;
  parent: bigint | null;
  tokens: number[] | null;
}

const key = (hi: number, lo: number) => `${hi}:${lo}`;

export class CpuTier {
  readonly chunkTokens: number;
  readonly chunkBytes: number;
  readonly capacity: number;
  private readonly factor: number;
  private readonly loadBw: number;
  private readonly storeBw: number;
  private readonly selfDescribing: boolean;
  /** Insertion order is LRU order: the first entry is evicted first. */
  private readonly chunks = new Map<string, Chunk>();
  /** Stored chunks whose BlockStored is not yet published (published when their copy ends). */
  private pendingStored: Chunk[] = [];
  private events: KVEvent[] = [];
  private jobs = 0;
  /** GPU blocks of finished requests whose stores still copy, freed when `at` is reached. */
  private deferredFrees: { blocks: number[]; at: number }[] = [];
  private loadFreeAt = 0;
  private storeFreeAt = 0;
  readonly counters: OffloadCounters;
  /** Copies since the last takeTransfers (only kept when `keepTransfers`). */
  private transfers: OffloadTransfer[] = [];
  /** The fleet's shared storage and this tier's writer id there, or null / -1. */
  private readonly storage: SharedStorage | null;
  private readonly writer: number;

  constructor(
    cfg: OffloadConfig,
    private readonly blockSize: number,
    bytesPerToken: number,
    private readonly emitEvents: boolean,
    private readonly keepTransfers = false,
    storage: SharedStorage | null = null,
  ) {
    this.chunkTokens = cfg.chunkTokens ?? blockSize;
    if (!Number.isInteger(this.chunkTokens) || this.chunkTokens <= 0 || this.chunkTokens % blockSize !== 0)
      throw new RangeError(
        `engine config: the offload block size (${cfg.chunkTokens}) must be a positive multiple of the GPU block size ${blockSize}`,
      );
    if (!(cfg.cpuBytes > 0)) throw new RangeError("engine config: kvOffload.cpuBytes must be > 0");
    this.factor = this.chunkTokens / blockSize;
    this.chunkBytes = bytesPerToken * this.chunkTokens;
    this.capacity = Math.floor(cfg.cpuBytes / this.chunkBytes);
    this.loadBw = cfg.loadBandwidth ?? DEFAULT_HOST_LINK_BYTES_PER_SECOND;
    this.storeBw = cfg.storeBandwidth ?? DEFAULT_HOST_LINK_BYTES_PER_SECOND;
    if (!(this.loadBw > 0) || !(this.storeBw > 0))
      throw new RangeError("engine config: kvOffload bandwidths must be > 0 bytes/s");
    this.selfDescribing = cfg.selfDescribingEvents === true;
    this.counters = {
      loadBytes: 0,
      loadTime: 0,
      storeBytes: 0,
      storeTime: 0,
      allocationFailures: 0,
      externalQueries: 0,
      externalHits: 0,
      numChunks: 0,
      capacityChunks: this.capacity,
      storageHits: 0,
    };
    this.storage = storage;
    this.writer = storage === null ? -1 : storage.attach(this.chunkBytes, emitEvents);
  }

  /**
   * Publishes BlockStored for the stores whose copy ended by `now` (vLLM complete_store) and
   * frees the GPU blocks that waited for them.
   */
  advance(now: number, pool: BlockPool): void {
    if (this.deferredFrees.length > 0) {
      const keep: { blocks: number[]; at: number }[] = [];
      for (const d of this.deferredFrees) {
        if (d.at <= now) pool.freeReversed(d.blocks);
        else keep.push(d);
      }
      this.deferredFrees = keep;
    }
    // Storage writes start after their CPU copy: announced after it.
    if (this.pendingStored.length === 0) return void this.storage?.advance(now);
    const still: Chunk[] = [];
    const due: Chunk[] = [];
    for (const c of this.pendingStored) {
      if (c.published) continue;
      if (c.readyAt > now) still.push(c);
      else due.push(c);
    }
    this.pendingStored = still;
    this.publish(due);
    this.storage?.advance(now);
  }

  /**
   * vLLM get_num_new_matched_tokens: tokens past `gpuHit` found in ready chunks, in whole chunks
   * counted from the chunk holding token `gpuHit`; 0 when less than a chunk would load.
   */
  lookup(r: Req, gpuHit: number, now: number): number {
    const f = this.factor;
    const ct = this.chunkTokens;
    const numChunks = Math.floor(r.hasher.count / f);
    if (numChunks * ct - gpuHit < ct) return 0;
    const start = Math.floor(gpuHit / ct);
    const { his, los } = r.hasher;
    let hits = 0;
    const storage = this.storage;
    for (let i = start; i < numChunks; i++) {
      const last = (i + 1) * f - 1;
      const k = key(his[last], los[last]);
      const c = this.chunks.get(k);
      if (c === undefined || c.readyAt > now) {
        // Tiering: a chunk CPU lacks may be in the fleet's shared storage.
        if (storage === null || !storage.hit(k, now)) break;
        hits++;
        continue;
      }
      this.chunks.delete(k);
      this.chunks.set(k, c);
      hits++;
    }
    if (hits === 0) return 0;
    const tokens = (start + hits) * ct - gpuHit;
    return tokens < ct ? 0 : tokens;
  }

  /**
   * Starts loading `tokens` tokens past `gpuHit` for `r` at `now` (vLLM prepare_load): pins the
   * chunks and queues the host→device copy behind the loads already in flight.
   */
  startLoad(r: Req, gpuHit: number, tokens: number, now: number): OffloadLoad {
    const f = this.factor;
    const ct = this.chunkTokens;
    const start = Math.floor(gpuHit / ct);
    const end = (gpuHit + tokens) / ct;
    const keys: string[] = [];
    let fromStorage: string[] | null = null;
    for (let i = start; i < end; i++) {
      const last = (i + 1) * f - 1;
      const k = key(r.hasher.his[last], r.hasher.los[last]);
      const c = this.chunks.get(k);
      if (c === undefined || c.readyAt > now) {
        // lookup found it in shared storage (storage.startRead throws if it is not there).
        if (this.storage === null) throw new Error(`cpu tier: chunk ${k} vanished between lookup and load`);
        (fromStorage ??= []).push(k);
        continue;
      }
      c.pins++;
      keys.push(k);
    }
    const bytes = keys.length * this.chunkBytes;
    const seconds = bytes / this.loadBw;
    let begin = now;
    let readyAt = now;
    if (keys.length > 0) {
      begin = Math.max(now, this.loadFreeAt);
      readyAt = this.loadFreeAt = begin + seconds;
      this.counters.loadBytes += bytes;
      this.counters.loadTime += seconds;
      if (this.keepTransfers) this.transfers.push({ kind: "load", bytes, seconds });
    }
    const load: OffloadLoad = { requestId: r.record.id, tokens, bytes, startTime: begin, readyAt, keys };
    if (fromStorage !== null && this.storage !== null) {
      // The storage part reads beside the CPU part; the load is done when both are.
      const rd = this.storage.startRead(fromStorage, now);
      const storageTokens = Math.min(tokens, fromStorage.length * ct);
      load.storageKeys = fromStorage;
      load.storageTokens = storageTokens;
      load.bytes += rd.bytes;
      load.startTime = keys.length > 0 ? Math.min(begin, rd.startTime) : rd.startTime;
      load.readyAt = Math.max(keys.length > 0 ? readyAt : 0, rd.readyAt);
      this.counters.storageHits += storageTokens;
    }
    return load;
  }

  /** Unpins a load's chunks (its copy ended, or its request went away). */
  endLoad(load: OffloadLoad): void {
    for (const k of load.keys) {
      const c = this.chunks.get(k);
      if (c !== undefined && c.pins > 0) c.pins--;
    }
    if (load.storageKeys !== undefined) this.storage?.endRead(load.storageKeys);
  }

  /**
   * vLLM _get_reqs_to_store, after a step ending at `end`: stores `r`'s newly full chunks of
   * computed tokens not yet in the tier, evicting LRU chunks that are ready and unpinned; when
   * they cannot make room the store is skipped (vllm:kv_offload_allocation_failure).
   */
  storeNew(r: Req, end: number): void {
    const ct = this.chunkTokens;
    const f = this.factor;
    const upTo = Math.min(Math.floor(r.numComputed / ct), Math.floor(r.hasher.count / f));
    if (upTo <= r.nextStoreChunk) return;
    const { his, los } = r.hasher;
    const fresh: number[] = [];
    for (let i = r.nextStoreChunk; i < upTo; i++) {
      const last = (i + 1) * f - 1;
      if (!this.chunks.has(key(his[last], los[last]))) fresh.push(i);
    }
    if (fresh.length > 0 && !this.makeRoom(fresh.length, end)) {
      this.counters.allocationFailures++;
      return;
    }
    const from = r.nextStoreChunk;
    r.nextStoreChunk = upTo;
    if (fresh.length === 0) {
      if (this.storage !== null) this.writeToStorage(r, from, upTo, end);
      return;
    }
    const bytes = fresh.length * this.chunkBytes;
    const seconds = bytes / this.storeBw;
    const begin = Math.max(end, this.storeFreeAt);
    const readyAt = begin + seconds;
    const job = ++this.jobs;
    this.storeFreeAt = readyAt;
    r.storeDoneAt = readyAt;
    this.counters.storeBytes += bytes;
    this.counters.storeTime += seconds;
    if (this.keepTransfers) this.transfers.push({ kind: "store", bytes, seconds });
    for (const i of fresh) {
      const last = (i + 1) * f - 1;
      const c: Chunk = {
        readyAt,
        pins: 0,
        job,
        published: false,
        key: this.emitEvents ? r.hasher.value(last) : 0n,
        hashes: null,
        parent: null,
        tokens: null,
      };
      if (this.emitEvents && this.selfDescribing) {
        c.hashes = [];
        for (let b = i * f; b <= last; b++) c.hashes.push(r.hasher.value(b));
        c.parent = i === 0 ? null : r.hasher.value(i * f - 1);
        c.tokens = Array.from(r.tokens.subarray(i * ct, (i + 1) * ct));
      }
      this.chunks.set(key(his[last], los[last]), c);
      this.pendingStored.push(c);
    }
    this.counters.numChunks = this.chunks.size;
    if (this.storage !== null) this.writeToStorage(r, from, upTo, readyAt);
  }

  /** Writes chunks [from, upTo) of `r` that storage lacks, once their CPU copy exists at `at`. */
  private writeToStorage(r: Req, from: number, upTo: number, at: number): void {
    const storage = this.storage as SharedStorage;
    const f = this.factor;
    const { his, los } = r.hasher;
    const items: StorageItem[] = [];
    for (let i = from; i < upTo; i++) {
      const last = (i + 1) * f - 1;
      const k = key(his[last], los[last]);
      if (!storage.has(k)) items.push({ key: k, hash: this.emitEvents ? r.hasher.value(last) : 0n });
    }
    if (items.length > 0) storage.write(this.writer, items, at);
  }

  /** Evicts LRU chunks whose store ended by `now` and that no load pins, until `n` fit. */
  private makeRoom(n: number, now: number): boolean {
    const victims = lruVictims(this.chunks, this.capacity, n, now);
    if (victims === null) return false;
    if (victims.length === 0) return true;
    const removed: bigint[] = [];
    const unannounced: Chunk[] = [];
    for (const k of victims) {
      const c = this.chunks.get(k) as Chunk;
      this.chunks.delete(k);
      if (!c.published) unannounced.push(c);
      if (c.hashes === null) removed.push(c.key);
      else for (const h of c.hashes) removed.push(h);
    }
    // A store that ended is announced before its removal, so the pair stays in order.
    this.publish(unannounced);
    // vLLM prepare_store: one BlockRemoved for the chunks it evicted (self-describing: their blocks).
    if (this.emitEvents && removed.length > 0)
      this.events.push({ type: "BlockRemoved", blockHashes: removed, medium: "CPU", groupIdx: 0 });
    this.counters.numChunks = this.chunks.size;
    return true;
  }

  /**
   * Marks chunks announced and publishes their BlockStored: self-describing, one event per chunk
   * with its blocks; placeholder (vLLM's default), one event per store job with one hash per chunk.
   */
  private publish(cs: Chunk[]): void {
    for (let i = 0; i < cs.length; i++) {
      const c = cs[i];
      c.published = true;
      if (!this.emitEvents) continue;
      if (c.hashes !== null) {
        this.events.push(describedEvent(c.hashes, c.parent, c.tokens ?? [], this.blockSize));
        continue;
      }
      const keys = [c.key];
      while (i + 1 < cs.length && cs[i + 1].job === c.job && cs[i + 1].hashes === null) {
        cs[++i].published = true;
        keys.push(cs[i].key);
      }
      this.events.push(placeholderEvent(keys));
    }
  }

  /**
   * A request finishing at `now`: when its last store is still copying, takes its GPU blocks
   * (one reference each) until that store ends and returns true; false to free them as usual.
   */
  holdWhileStoring(r: Req, now: number): boolean {
    if (r.storeDoneAt <= now || r.blocks.length === 0) return false;
    this.deferredFrees.push({ blocks: r.blocks, at: r.storeDoneAt });
    r.blocks = [];
    r.numCachedBlocks = 0;
    return true;
  }

  /** When the next blocks waiting for a store are freed, or null when none wait. */
  nextFree(): number | null {
    let t: number | null = null;
    for (const d of this.deferredFrees) if (t === null || d.at < t) t = d.at;
    return t;
  }

  /** Adds one reference per block waiting for a store into `refs` (for invariant checks). */
  countRefs(refs: Int32Array): void {
    for (const d of this.deferredFrees) for (const b of d.blocks) refs[b]++;
  }

  takeEvents(): KVEvent[] {
    if (this.storage !== null) for (const x of this.storage.takeEvents(this.writer)) this.events.push(x);
    const e = this.events;
    this.events = [];
    return e;
  }

  /** Copies since the last call (for the vllm:kv_offload_*_size histograms). */
  takeTransfers(): OffloadTransfer[] {
    const t = this.transfers;
    this.transfers = [];
    return t;
  }

  /** Chunks held now (ready or being stored). */
  get size(): number {
    return this.chunks.size;
  }

  /** Chunk keys whose copy has ended by `now` (for tests). */
  readyKeys(now: number): string[] {
    const out: string[] = [];
    for (const [k, c] of this.chunks) if (c.readyAt <= now) out.push(k);
    return out;
  }

  /** Throws on a broken invariant: capacity, pins. For tests. */
  checkInvariants(): void {
    if (this.chunks.size > this.capacity)
      throw new Error(`cpu tier holds ${this.chunks.size} chunks, capacity ${this.capacity}`);
    for (const [k, c] of this.chunks) if (c.pins < 0) throw new Error(`cpu chunk ${k} pins ${c.pins}`);
  }

  /** Sum of the pins (each in-flight load pins its chunks once). For tests. */
  get totalPins(): number {
    let n = 0;
    for (const c of this.chunks.values()) n += c.pins;
    return n;
  }
}
