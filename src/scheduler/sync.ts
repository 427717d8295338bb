/**
 * Active-active gateway replicas: the routing state one gateway cannot observe from the others —
 * approximate-prefix insertions made by their decisions, precise routing's speculative entries,
 * their in-flight load per endpoint, the prefix homes they founded (prefix-home-balance-scorer), and
 * session_id bindings — captured from this gateway's scheduler as batches and merged into it from
 * its peers'. Pure: time is passed in, the transport (NATS, or the fleet simulator's event queue)
 * is the caller's. The hot path only appends to a bounded buffer; nothing waits on a peer.
 *
 * Merge rules: prefix insertions, speculative entries and bindings are operations, applied in
 * arrival order (an insert touches the LRU, so a peer's recent pick counts as recent here too);
 * in-flight load and home counts are state — each batch carries the sender's whole own load and
 * counts, which replace the last ones from that sender, so a lost or duplicated batch never leaves
 * load behind, and a sender silent for `staleAfterSeconds` counts for nothing. Precise prefix
 * routing needs no insertions (every gateway reads the replicas' own KV events), but a new prefix's
 * second request reaching another gateway before the engine's first KV event found nothing there
 * without its peer's speculative entry: on gateways-sync precise behind 8 synced gateways made 8,021
 * output tok/s against 8,316 with one, and 8,319 once the entries were shared. They live seconds,
 * so they are never replayed.
 */
import type { PackedHashes } from "./hash.ts";
import { InflightLoadProducer } from "./plugins/inflight/producer.ts";
import { PrecisePrefixProducer } from "./plugins/precise-prefix-cache-producer.ts";
import { ApproxPrefixProducer } from "./plugins/prefix/producer.ts";
import { PrefixHomeBalanceScorer } from "./plugins/scorers/prefix-home.ts";
import { SessionAffinity } from "./plugins/session.ts";
import type { Scheduler } from "./scheduler.ts";

/** One chain of prefix blocks a gateway recorded on an endpoint after its pick. */
export interface PrefixInsert {
  /** Producer (plugin) name. */
  p: string;
  /** Endpoint id. */
  e: string;
  /** LRU capacity the sender used, in index blocks. */
  c: number;
  /** Block hashes as int32 halves (PackedHashes). */
  h: number[];
}

/** A speculative entry a precise producer added after its pick: its request's keys on an endpoint. */
export interface SpeculativeEntry {
  /** Producer (plugin) name. */
  p: string;
  /** Endpoint id. */
  e: string;
  /** Seconds it lives. */
  t: number;
  /** Block keys as [lo, hi] pairs (PackedKeys). */
  h: number[];
}

export interface SessionBinding {
  /** Session plugin name. */
  p: string;
  s: string;
  e: string;
}

export interface SyncBatch {
  origin: string;
  /** Per-origin sequence, from 1. */
  seq: number;
  /** The sender's clock at take(), seconds (wall clock over NATS; virtual time in the simulator). */
  at: number;
  /** Config fingerprint: peers with another routing config are not merged. */
  config: string;
  prefix: PrefixInsert[];
  sessions: SessionBinding[];
  /** Per inflight producer, the sender's own load: [endpoint, requests, tokens]. Absent in replays. */
  load?: Record<string, Array<[string, number, number]>>;
  /** Per prefix-home-balance scorer, the prefixes the sender homed: [endpoint, count]. Absent in replays. */
  homes?: Record<string, Array<[string, number]>>;
  /** Precise producers' speculative entries since the last batch. Absent in replays. */
  speculative?: SpeculativeEntry[];
}

export interface SyncOptions {
  /** This gateway's id (unique among peers). */
  origin: string;
  /** A fingerprint of the routing config (batches from peers with another are dropped). */
  config: string;
  /** A peer not heard from for this long counts for no in-flight load (default 5 s). */
  staleAfterSeconds?: number;
  /** Outgoing prefix blocks held between takes; beyond it the oldest are dropped (default 262,144). */
  maxPendingBlocks?: number;
  /** Own insertions kept for a late-joining peer's replay, in blocks (default 1,048,576). */
  replayBlocks?: number;
}

export interface SyncStats {
  batchesOut: number;
  batchesIn: number;
  /** Batches not merged: wrong config, unknown plugin, duplicate or older sequence. */
  batchesDropped: number;
  /** Sequence numbers skipped by a peer's live batches (lost messages). */
  gaps: number;
  blocksOut: number;
  blocksIn: number;
  /** Outgoing blocks dropped because the buffer was full (the transport could not keep up). */
  blocksDroppedOut: number;
  sessionsIn: number;
  sessionsOut: number;
  /** Peers heard from within staleAfterSeconds. */
  peers: number;
  /** Peers whose load was dropped for silence. */
  peersExpired: number;
  /** Largest (receive clock − batch clock) seen since the last stats() call, seconds. */
  maxLagSeconds: number;
}

interface Peer {
  lastSeq: number;
  lastHeard: number;
  /** Whether it sent load or home counts (state to drop when it falls silent). */
  hasState: boolean;
}

export class GatewaySync {
  readonly origin: string;
  config: string;
  readonly #staleAfter: number;
  readonly #maxPending: number;
  readonly #replayBlocks: number;
  #scheduler: Scheduler | null = null;
  #prefix = new Map<string, ApproxPrefixProducer>();
  #inflight = new Map<string, InflightLoadProducer>();
  #sessions = new Map<string, SessionAffinity>();
  #homes = new Map<string, PrefixHomeBalanceScorer>();
  #precise = new Map<string, PrecisePrefixProducer>();
  #pendingSpeculative: SpeculativeEntry[] = [];
  #pending: PrefixInsert[] = [];
  #pendingBlocks = 0;
  #pendingSessions: SessionBinding[] = [];
  #seq = 0;
  readonly #log: SyncBatch[] = [];
  #logBlocks = 0;
  readonly #peers = new Map<string, Peer>();
  readonly stats: Omit<SyncStats, "peers"> = {
    batchesOut: 0,
    batchesIn: 0,
    batchesDropped: 0,
    gaps: 0,
    blocksOut: 0,
    blocksIn: 0,
    blocksDroppedOut: 0,
    sessionsIn: 0,
    sessionsOut: 0,
    peersExpired: 0,
    maxLagSeconds: 0,
  };

  constructor(scheduler: Scheduler, o: SyncOptions) {
    this.origin = o.origin;
    this.config = o.config;
    this.#staleAfter = o.staleAfterSeconds ?? 5;
    this.#maxPending = o.maxPendingBlocks ?? 262_144;
    this.#replayBlocks = o.replayBlocks ?? 1_048_576;
    this.attach(scheduler);
  }

  /**
   * Hooks the scheduler's plugins (again after a config reload, with the new config's fingerprint:
   * the old plugins are unhooked).
   */
  attach(scheduler: Scheduler, config = this.config): void {
    this.detach();
    this.#scheduler = scheduler;
    this.config = config;
    for (const p of scheduler.plugins.values()) {
      const name = p.typedName.name;
      if (p instanceof ApproxPrefixProducer) {
        this.#prefix.set(name, p);
        p.onLearn = (e, h, c) => this.#learn(name, e, h, c);
      } else if (p instanceof PrecisePrefixProducer) {
        this.#precise.set(name, p);
        p.onSpeculate = (e, keys, t) => {
          this.#pendingSpeculative.push({ p: name, e, t, h: Array.from(keys) });
          // They live seconds: a backlog beyond this is stale (the transport is down or behind).
          if (this.#pendingSpeculative.length > 1024) this.#pendingSpeculative.shift();
        };
      } else if (p instanceof InflightLoadProducer) this.#inflight.set(name, p);
      else if (p instanceof PrefixHomeBalanceScorer) this.#homes.set(name, p);
      else if (p instanceof SessionAffinity) {
        this.#sessions.set(name, p);
        p.onBind = (s, e) => {
          this.#pendingSessions.push({ p: name, s, e });
          if (this.#pendingSessions.length > 65_536) this.#pendingSessions.shift();
        };
      }
    }
  }

  detach(): void {
    for (const p of this.#prefix.values()) p.onLearn = null;
    for (const p of this.#sessions.values()) p.onBind = null;
    for (const p of this.#precise.values()) p.onSpeculate = null;
    this.#prefix = new Map();
    this.#inflight = new Map();
    this.#sessions = new Map();
    this.#homes = new Map();
    this.#precise = new Map();
    this.#scheduler = null;
  }

  /** Whether the attached scheduler has any state to share (else peers only exchange heartbeats). */
  get shares(): boolean {
    return (
      this.#prefix.size + this.#inflight.size + this.#sessions.size + this.#homes.size + this.#precise.size >
      0
    );
  }

  #learn(producer: string, endpoint: string, hashes: PackedHashes, capacity: number): void {
    const n = hashes.length >>> 1;
    if (n === 0) return;
    this.#pending.push({ p: producer, e: endpoint, c: capacity, h: Array.from(hashes) });
    this.#pendingBlocks += n;
    while (this.#pendingBlocks > this.#maxPending && this.#pending.length > 1) {
      const old = this.#pending.shift() as PrefixInsert;
      this.#pendingBlocks -= old.h.length >>> 1;
      this.stats.blocksDroppedOut += old.h.length >>> 1;
    }
  }

  #lastStateKey = "";

  /**
   * Whether a take() now would carry anything new: insertions, speculative entries, bindings, or own
   * load or home counts that differ from the last batch's. A transport sends heartbeats on its own
   * schedule regardless.
   */
  hasNews(): boolean {
    if (this.#pending.length > 0 || this.#pendingSessions.length > 0 || this.#pendingSpeculative.length > 0)
      return true;
    return this.#stateKey() !== this.#lastStateKey;
  }

  #stateKey(): string {
    let k = "";
    for (const [name, p] of this.#inflight) {
      k += `${name}|`;
      for (const [id, [r, t]] of p.localLoad()) k += `${id},${r},${t};`;
    }
    for (const [name, p] of this.#homes) {
      k += `${name}#`;
      for (const [id, n] of p.localHomes()) k += `${id},${n};`;
    }
    return k;
  }

  /** Outgoing prefix blocks waiting for the next take(). */
  get pendingBlocks(): number {
    return this.#pendingBlocks;
  }

  /**
   * Pending own insertions (up to `maxBlocks` blocks, at least one chain), speculative entries
   * (within what the insertions left of `maxBlocks`) and bindings, and the current own load and home
   * counts, as one batch (a heartbeat when nothing is pending).
   */
  take(now: number, maxBlocks = Number.POSITIVE_INFINITY): SyncBatch {
    let prefix = this.#pending;
    let blocks = this.#pendingBlocks;
    if (blocks > maxBlocks) {
      let k = 0;
      let b = 0;
      while (k < prefix.length && (k === 0 || b + (prefix[k].h.length >>> 1) <= maxBlocks))
        b += prefix[k++].h.length >>> 1;
      this.#pending = prefix.slice(k);
      prefix = prefix.slice(0, k);
      blocks = b;
    } else this.#pending = [];
    this.#pendingBlocks -= blocks;
    const sessions = this.#pendingSessions;
    this.#pendingSessions = [];
    // Speculative entries fill what the insertions left of maxBlocks; the rest wait for the next take.
    let k = 0;
    for (let b = blocks; k < this.#pendingSpeculative.length; k++) {
      b += this.#pendingSpeculative[k].h.length >>> 1;
      if (b > maxBlocks) break;
    }
    const speculative = this.#pendingSpeculative.slice(0, k);
    this.#pendingSpeculative = this.#pendingSpeculative.slice(k);
    const load: Record<string, Array<[string, number, number]>> = {};
    for (const [name, p] of this.#inflight) {
      const rows: Array<[string, number, number]> = [];
      for (const [id, [r, t]] of p.localLoad()) rows.push([id, r, t]);
      load[name] = rows;
    }
    const homes: Record<string, Array<[string, number]>> = {};
    for (const [name, p] of this.#homes) homes[name] = [...p.localHomes()];
    this.#lastStateKey = this.#stateKey();
    const batch: SyncBatch = {
      origin: this.origin,
      seq: ++this.#seq,
      at: now,
      config: this.config,
      prefix,
      sessions,
      load,
      ...(this.#homes.size > 0 && { homes }),
      ...(speculative.length > 0 && { speculative }),
    };
    this.stats.batchesOut++;
    this.stats.blocksOut += blocks;
    this.stats.sessionsOut += sessions.length;
    if (prefix.length + sessions.length > 0)
      this.#remember({ ...batch, load: undefined, homes: undefined, speculative: undefined }, blocks);
    return batch;
  }

  #remember(b: SyncBatch, blocks: number): void {
    this.#log.push(b);
    this.#logBlocks += blocks;
    while (this.#logBlocks > this.#replayBlocks && this.#log.length > 1) {
      const old = this.#log.shift() as SyncBatch;
      for (const p of old.prefix) this.#logBlocks -= p.h.length >>> 1;
    }
  }

  /** This gateway's own recent insertions and bindings, oldest first, for a peer that joins late. */
  replay(): readonly SyncBatch[] {
    return this.#log;
  }

  /**
   * Merges a peer's batch. `replay` batches (answers to a late join) carry older sequences and no
   * load, and are merged whatever this gateway has already heard from their origin. Returns whether
   * anything was merged.
   */
  apply(b: SyncBatch, now: number, replay = false): boolean {
    if (b.origin === this.origin) return false;
    if (b.config !== this.config || this.#scheduler === null) {
      this.stats.batchesDropped++;
      return false;
    }
    let peer = this.#peers.get(b.origin);
    if (peer === undefined) {
      peer = { lastSeq: 0, lastHeard: now, hasState: false };
      this.#peers.set(b.origin, peer);
    }
    if (!replay) {
      if (b.seq <= peer.lastSeq) {
        // An older batch, or the peer restarted (its sequence began again): a restart is heard as
        // a sequence far below ours; take it as a new peer.
        if (b.seq > 1) {
          this.stats.batchesDropped++;
          return false;
        }
        peer.lastSeq = 0;
      }
      if (peer.lastSeq > 0 && b.seq > peer.lastSeq + 1) this.stats.gaps += b.seq - peer.lastSeq - 1;
      peer.lastSeq = b.seq;
      peer.lastHeard = now;
      const lag = now - b.at;
      if (lag > this.stats.maxLagSeconds) this.stats.maxLagSeconds = lag;
    }
    this.stats.batchesIn++;
    for (const ins of b.prefix) {
      const p = this.#prefix.get(ins.p);
      if (p === undefined) continue;
      p.index.addPacked(ins.e, ins.h, ins.c);
      this.stats.blocksIn += ins.h.length >>> 1;
    }
    if (!replay)
      for (const x of b.speculative ?? []) this.#precise.get(x.p)?.index.addSpeculative(x.e, x.h, now, x.t);
    for (const s of b.sessions) {
      const p = this.#sessions.get(s.p);
      if (p === undefined) continue;
      p.bind(s.s, s.e, now);
      this.stats.sessionsIn++;
    }
    if (!replay && b.load !== undefined) {
      for (const [name, rows] of Object.entries(b.load)) {
        const p = this.#inflight.get(name);
        if (p === undefined) continue;
        const m = new Map<string, readonly [number, number]>();
        for (const [id, r, t] of rows) m.set(id, [r, t]);
        p.setPeerLoad(b.origin, m);
      }
      peer.hasState = true;
    }
    if (!replay && b.homes !== undefined) {
      for (const [name, rows] of Object.entries(b.homes))
        this.#homes.get(name)?.setPeerHomes(b.origin, new Map(rows));
      peer.hasState = true;
    }
    return true;
  }

  /** Drops the load of peers silent for staleAfterSeconds; returns their ids. */
  expire(now: number): string[] {
    const gone: string[] = [];
    for (const [id, peer] of this.#peers) {
      if (now - peer.lastHeard <= this.#staleAfter) continue;
      if (peer.hasState) {
        for (const p of this.#inflight.values()) p.setPeerLoad(id, null);
        for (const p of this.#homes.values()) p.setPeerHomes(id, null);
      }
      this.#peers.delete(id);
      this.stats.peersExpired++;
      gone.push(id);
    }
    return gone;
  }

  /** Peers heard from within staleAfterSeconds (as of the last expire()). */
  get peers(): number {
    return this.#peers.size;
  }

  /** The stats, and resets maxLagSeconds. */
  snapshot(): SyncStats {
    const s = { ...this.stats, peers: this.#peers.size };
    this.stats.maxLagSeconds = 0;
    return s;
  }
}
