/**
 * The shared-storage tier of a fleet: one object every replica's CPU tier (cpu-tier.ts) reaches,
 * after llm-d's filesystem backend for vLLM's OffloadingConnector (llm-d/llm-d-kv-cache
 * kv_connectors/llmd_fs_backend: SharedStorageLoadStoreSpec, medium "SHARED_STORAGE";
 * StorageEventPublisher) in the CPU-plus-filesystem tiering of llm-d's guide
 * (llm-d/llm-d guides/tiered-prefix-cache, native/cpu_plus_fs: TieringOffloadingSpec with an fs
 * secondary tier, one PYTHONHASHSEED for every replica).
 *
 * Chunks are keyed by their last GPU block hash, as the CPU tier's: replicas hash alike, so a chunk
 * one replica wrote any other finds. A chunk is written once its CPU copy exists, at the storage's
 * write bandwidth, and hittable when the write ends; a read pins its chunks until the caller reports
 * it done. Each direction is one FIFO for the whole fleet (the filesystem's aggregate throughput), so
 * replicas contend for it. Capacity is bounded with LRU cleanup: the llm-d backend leaves cleanup to
 * the storage system, and kvgate models it as LRU over whole chunks.
 *
 * Events, per writer (each replica publishes what it wrote, as each vLLM's storage publisher does):
 * placeholder BlockStored with medium SHARED_STORAGE (the chunks' hashes only, one event per write,
 * as StorageEventPublisher.publish_blocks_stored) when the write ends, and a BlockRemoved when cleanup
 * drops a chunk (kvgate's addition: llm-d's publisher sends none). Pure: times are passed in.
 */
import type { KVEvent } from "../kv/events.ts";
import { placeholderEvent } from "./cpu-tier-events.ts";
import { lruVictims } from "./tier-lru.ts";

/** The KV-event medium of llm-d's filesystem backend (its mediums.py / event_publisher.py). */
export const STORAGE_MEDIUM = "SHARED_STORAGE";

/**
 * Defaults. Throughput: about 10 GB/s, the cloud filesystem of llm-d's realistic tiered run
 * (llm-d.github.io blog 2026-02-09 "Native KV cache offloading to any file system with llm-d",
 * "cloud-based storage offering approximately 10GB/s IO throughput"), both directions. Capacity:
 * 18,000 GiB, the Lustre volume of llm-d's storage guide (llm-d/llm-d
 * guides/tiered-prefix-cache/storage/README.md).
 */
export const DEFAULT_STORAGE_BYTES_PER_SECOND = 10e9;
export const DEFAULT_STORAGE_CAPACITY_BYTES = 18_000 * 2 ** 30;

export interface SharedStorageConfig {
  /** Bytes of KV the storage holds (default DEFAULT_STORAGE_CAPACITY_BYTES). */
  capacityBytes?: number;
  /** Fleet-wide storage→GPU and GPU→storage bytes per second (default DEFAULT_STORAGE_BYTES_PER_SECOND). */
  readBandwidth?: number;
  writeBandwidth?: number;
}

interface StoredChunk {
  readyAt: number;
  pins: number;
  writer: number;
  job: number;
  published: boolean;
  /** The placeholder event's hash (the chunk's last GPU block hash). */
  hash: bigint;
}

/** A chunk to write: its key in the tier maps and its event hash. */
export interface StorageItem {
  key: string;
  hash: bigint;
}

/** Fleet-wide counters of the storage tier. */
export interface StorageCounters {
  readBytes: number;
  readTime: number;
  writeBytes: number;
  writeTime: number;
  /** Chunks read back (each read of a chunk counts once). */
  readChunks: number;
  writtenChunks: number;
  evictedChunks: number;
  /** Writes skipped for lack of room (every chunk pinned or still being written). */
  allocationFailures: number;
}

export class SharedStorage {
  readonly capacityBytes: number;
  readonly readBw: number;
  readonly writeBw: number;
  /** Set by the first attach: every writer must store chunks of this size. */
  private chunkBytes = 0;
  private capacity = 0;
  /** Insertion order is LRU order: the first entry is dropped first. */
  private readonly chunks = new Map<string, StoredChunk>();
  private pending: StoredChunk[] = [];
  private readonly events: KVEvent[][] = [];
  private readonly emit: boolean[] = [];
  private readFreeAt = 0;
  private writeFreeAt = 0;
  private jobs = 0;
  readonly counters: StorageCounters = {
    readBytes: 0,
    readTime: 0,
    writeBytes: 0,
    writeTime: 0,
    readChunks: 0,
    writtenChunks: 0,
    evictedChunks: 0,
    allocationFailures: 0,
  };

  constructor(cfg: SharedStorageConfig = {}) {
    this.capacityBytes = cfg.capacityBytes ?? DEFAULT_STORAGE_CAPACITY_BYTES;
    this.readBw = cfg.readBandwidth ?? DEFAULT_STORAGE_BYTES_PER_SECOND;
    this.writeBw = cfg.writeBandwidth ?? DEFAULT_STORAGE_BYTES_PER_SECOND;
    if (!(this.capacityBytes > 0)) throw new RangeError("shared storage: capacity must be > 0 bytes");
    if (!(this.readBw > 0) || !(this.writeBw > 0))
      throw new RangeError("shared storage: bandwidths must be > 0 bytes/s");
  }

  /**
   * Registers a replica's CPU tier as a writer; returns its id for write and takeEvents. Every
   * writer stores chunks of `chunkBytes` (one model, one offload chunk size per fleet).
   */
  attach(chunkBytes: number, emitEvents: boolean): number {
    if (this.chunkBytes === 0) {
      this.chunkBytes = chunkBytes;
      this.capacity = Math.floor(this.capacityBytes / chunkBytes);
      if (this.capacity < 1)
        throw new RangeError(
          `shared storage: ${this.capacityBytes} bytes hold no ${chunkBytes}-byte chunk; raise its capacity`,
        );
    } else if (chunkBytes !== this.chunkBytes)
      throw new RangeError(
        `shared storage: a replica stores ${chunkBytes}-byte chunks, another ${this.chunkBytes}; one model and offload block size per shared tier`,
      );
    this.events.push([]);
    this.emit.push(emitEvents);
    return this.events.length - 1;
  }

  /** The chunk is stored and its write has ended by `now`; a hit refreshes it in the LRU. */
  hit(k: string, now: number): boolean {
    const c = this.chunks.get(k);
    if (c === undefined || c.readyAt > now) return false;
    this.chunks.delete(k);
    this.chunks.set(k, c);
    return true;
  }

  /** The chunk is stored or being written. */
  has(k: string): boolean {
    return this.chunks.has(k);
  }

  /** Starts reading `keys` at `now` behind the reads in flight; pins them. */
  startRead(keys: readonly string[], now: number): { startTime: number; readyAt: number; bytes: number } {
    for (const k of keys) {
      const c = this.chunks.get(k);
      if (c === undefined) throw new Error(`shared storage: chunk ${k} vanished between lookup and load`);
      c.pins++;
    }
    const bytes = keys.length * this.chunkBytes;
    const seconds = bytes / this.readBw;
    const startTime = Math.max(now, this.readFreeAt);
    this.readFreeAt = startTime + seconds;
    this.counters.readBytes += bytes;
    this.counters.readTime += seconds;
    this.counters.readChunks += keys.length;
    return { startTime, readyAt: startTime + seconds, bytes };
  }

  /** Unpins a read's chunks (its copy ended, or its request went away). */
  endRead(keys: readonly string[]): void {
    for (const k of keys) {
      const c = this.chunks.get(k);
      if (c !== undefined && c.pins > 0) c.pins--;
    }
  }

  /**
   * Writes `items` (chunks not stored yet) for `writer`, starting no earlier than `from` (when their
   * CPU copy exists) behind the writes in flight; dropping LRU chunks that are written and unpinned
   * to make room. Returns when the write ends, or null when room cannot be made (nothing is written).
   */
  write(writer: number, items: readonly StorageItem[], from: number): number | null {
    const fresh = items.filter((it) => !this.chunks.has(it.key));
    if (fresh.length === 0) return null;
    if (!this.makeRoom(fresh.length, from)) {
      this.counters.allocationFailures++;
      return null;
    }
    const bytes = fresh.length * this.chunkBytes;
    const seconds = bytes / this.writeBw;
    const begin = Math.max(from, this.writeFreeAt);
    const readyAt = begin + seconds;
    this.writeFreeAt = readyAt;
    this.counters.writeBytes += bytes;
    this.counters.writeTime += seconds;
    this.counters.writtenChunks += fresh.length;
    const job = ++this.jobs;
    for (const it of fresh) {
      const c: StoredChunk = { readyAt, pins: 0, writer, job, published: false, hash: it.hash };
      this.chunks.set(it.key, c);
      this.pending.push(c);
    }
    return readyAt;
  }

  /** Publishes BlockStored for the writes that ended by `now`, each to its writer's events. */
  advance(now: number): void {
    if (this.pending.length === 0) return;
    const still: StoredChunk[] = [];
    const due: StoredChunk[] = [];
    for (const c of this.pending) {
      if (c.published) continue;
      if (c.readyAt > now) still.push(c);
      else due.push(c);
    }
    this.pending = still;
    this.publish(due);
  }

  /** Events for `writer` since its last call. */
  takeEvents(writer: number): KVEvent[] {
    const e = this.events[writer];
    if (e.length === 0) return e;
    this.events[writer] = [];
    return e;
  }

  private makeRoom(n: number, now: number): boolean {
    const victims = lruVictims(this.chunks, this.capacity, n, now);
    if (victims === null) return false;
    if (victims.length === 0) return true;
    const removed = new Map<number, bigint[]>();
    const unannounced: StoredChunk[] = [];
    for (const k of victims) {
      const c = this.chunks.get(k) as StoredChunk;
      this.chunks.delete(k);
      this.counters.evictedChunks++;
      if (!c.published) unannounced.push(c);
      let list = removed.get(c.writer);
      if (list === undefined) removed.set(c.writer, (list = []));
      list.push(c.hash);
    }
    // A write that ended is announced before its removal, by the same writer, so the pair keeps its order.
    this.publish(unannounced);
    for (const [w, hashes] of removed)
      if (this.emit[w])
        this.events[w].push({
          type: "BlockRemoved",
          blockHashes: hashes,
          medium: STORAGE_MEDIUM,
          groupIdx: 0,
        });
    return true;
  }

  private publish(cs: StoredChunk[]): void {
    for (let i = 0; i < cs.length; i++) {
      const c = cs[i];
      c.published = true;
      if (!this.emit[c.writer]) continue;
      const hashes = [c.hash];
      while (i + 1 < cs.length && cs[i + 1].job === c.job) {
        cs[++i].published = true;
        hashes.push(cs[i].hash);
      }
      this.events[c.writer].push(placeholderEvent(hashes, STORAGE_MEDIUM));
    }
  }

  /** Chunks held (written or being written). */
  get size(): number {
    return this.chunks.size;
  }

  /** Capacity in chunks (0 before the first attach). */
  get capacityChunks(): number {
    return this.capacity;
  }

  /** Sum of the pins (each in-flight read pins its chunks once). For tests. */
  get totalPins(): number {
    let n = 0;
    for (const c of this.chunks.values()) n += c.pins;
    return n;
  }

  /** Throws on a broken invariant: capacity, pins. For tests. */
  checkInvariants(): void {
    if (this.chunks.size > this.capacity)
      throw new Error(`shared storage holds ${this.chunks.size} chunks, capacity ${this.capacity}`);
    for (const [k, c] of this.chunks) if (c.pins < 0) throw new Error(`storage chunk ${k} pins ${c.pins}`);
  }
}
