/**
 * KV-events subscriber for precise mode: one ZMQ SUB socket per endpoint on its vLLM KV-events PUB
 * address, decoding each `[topic, seq u64 BE, msgpack batch]` message (vLLM v0.26.0
 * `vllm/distributed/kv_events.py`)
 * (with the specialised decoder, precise-decode.ts) and applying its events, in order, to the PreciseIndex.
 *
 * Sequence tracking per endpoint (seq counts batches):
 * - the first message sets the baseline;
 * - a gap (seq > last + 1) asks the endpoint's replay ROUTER, when configured, for everything from
 *   last + 1 (a DEALER sends `["", seq8]`; replies are `[seq, payload]` or `[topic, seq, payload]` after
 *   the empty delimiter, ended by seq ff×8, as vLLM's ZmqEventPublisher replies). If the first replayed seq
 *   is past the one asked for,
 *   that history is gone: the endpoint's entries are reset and rebuilt from what came back. Without a
 *   replay socket, or when the replay fails or times out, the endpoint's entries are reset;
 * - a seq that goes backwards is an engine restart: reset, then (with replay) fetch the new engine's
 *   batches from 0 that were missed;
 * - so is any jump right after the SUB socket lost its connection: a restarted engine's seq may lie past
 *   ours, and patching that "gap" would keep the old engine's blocks (llm-d's stale-index-after-restart).
 * Live messages that arrive during a replay wait in the socket and are skipped when the replay already
 * applied them.
 * Garbage (wrong frame count, a seq frame that is not 8 bytes, an undecodable payload) is counted and
 * skipped, never fatal; an undecodable payload with a valid seq still advances the seq (a replay would
 * return the same bytes). Bursts are applied in chunks: after `chunkBlocks` blocks the loop yields to
 * the event loop. removeEndpoint closes the sockets and drops the endpoint's entries at once.
 */
import { setImmediate as yieldToLoop } from "node:timers/promises";
import { Dealer, Subscriber } from "zeromq";
import { decodeEventBatchFast } from "../kv/precise-decode.ts";
import type { PreciseIndex } from "../kv/precise-index.ts";
import {
  type KvEndpointStats,
  type KvEventsEndpoint,
  type KvSubscriberStats,
  newStats,
} from "./kv-events-endpoint.ts";

export {
  type KvEndpointStats,
  type KvEventsEndpoint,
  type KvSubscriberStats,
  kvEventsEndpointFor,
} from "./kv-events-endpoint.ts";

export interface KvEventsSubscriberOptions {
  index: PreciseIndex;
  /** SUB prefix filter on the topic frame. Default "kv@"; "" subscribes to everything. */
  topicFilter?: string;
  /** Blocks applied between yields to the event loop. Default 2048. */
  chunkBlocks?: number;
  /** How long a replay may take before it counts as failed (then the endpoint is reset). Default 2000 ms. */
  replayTimeoutMs?: number;
  log?: (line: string) => void;
}

interface State {
  cfg: KvEventsEndpoint;
  sub: Subscriber;
  dealer: Dealer | null;
  closed: boolean;
  /** The SUB socket lost its connection since the last message. */
  disconnected: boolean;
  model: string | null;
  /** After a replay from `dupFloor`, live messages in [dupFloor, lastSeq] are duplicates. */
  dupFloor: number | null;
  stats: KvEndpointStats;
  loop: Promise<void>;
}

const EMPTY = Buffer.alloc(0);

function seqOf(frame: Buffer): number | null {
  return frame.length === 8 ? Number(frame.readBigUInt64BE(0)) : null;
}

const isEndMarker = (frame: Buffer): boolean => frame.length === 8 && frame.every((b) => b === 0xff);

export class KvEventsSubscriber {
  private readonly index: PreciseIndex;
  private readonly topicFilter: string;
  private readonly chunkBlocks: number;
  private readonly replayTimeoutMs: number;
  private readonly log: (line: string) => void;
  private readonly states = new Map<string, State>();
  private budget: number;

  constructor(opts: KvEventsSubscriberOptions) {
    this.index = opts.index;
    this.topicFilter = opts.topicFilter ?? "kv@";
    this.chunkBlocks = opts.chunkBlocks ?? 2048;
    this.replayTimeoutMs = opts.replayTimeoutMs ?? 2000;
    this.log = opts.log ?? (() => {});
    this.budget = this.chunkBlocks;
  }

  /** Subscribes to an endpoint's events (replacing any previous subscription under that id). */
  async addEndpoint(cfg: KvEventsEndpoint): Promise<void> {
    if (this.states.has(cfg.id)) await this.removeEndpoint(cfg.id);
    const sub = new Subscriber({ linger: 0, receiveHighWaterMark: 100_000 });
    sub.connect(cfg.address);
    if (this.topicFilter === "") sub.subscribe();
    else sub.subscribe(this.topicFilter);
    const st: State = {
      cfg,
      sub,
      dealer: null,
      closed: false,
      disconnected: false,
      model: cfg.model ?? null,
      dupFloor: null,
      stats: newStats(),
      loop: Promise.resolve(),
    };
    if (st.model !== null) this.index.setEndpointModel(cfg.id, st.model);
    sub.events.on("disconnect", () => {
      st.disconnected = true;
    });
    this.states.set(cfg.id, st);
    st.loop = this.run(st);
  }

  /** Closes the endpoint's sockets and drops its index entries now; resolves when its loop has ended. */
  removeEndpoint(id: string): Promise<void> {
    const st = this.states.get(id);
    if (!st) return Promise.resolve();
    this.states.delete(id);
    this.shut(st);
    this.index.removeEndpoint(id);
    return st.loop;
  }

  /** Closes every socket (index entries are kept). */
  async close(): Promise<void> {
    const all = [...this.states.values()];
    this.states.clear();
    for (const st of all) this.shut(st);
    await Promise.all(all.map((st) => st.loop));
  }

  stats(): KvSubscriberStats {
    const total = { ...newStats(), endpoints: {} as Record<string, KvEndpointStats> };
    for (const [id, st] of this.states) {
      total.endpoints[id] = { ...st.stats };
      for (const k of Object.keys(st.stats) as (keyof KvEndpointStats)[]) {
        if (k !== "lastSeq") total[k] += st.stats[k];
      }
    }
    const { lastSeq: _, ...rest } = total;
    return rest;
  }

  private shut(st: State): void {
    st.closed = true;
    st.sub.close();
    st.dealer?.close();
  }

  private async run(st: State): Promise<void> {
    try {
      for await (const frames of st.sub) {
        if (st.closed) return;
        await this.onLive(st, frames);
        if (st.closed) return;
      }
    } catch (err) {
      if (!st.closed) this.log(`kv-events ${st.cfg.id}: subscriber stopped: ${(err as Error).message}`);
    }
  }

  private async onLive(st: State, frames: Buffer[]): Promise<void> {
    const s = st.stats;
    const seq = frames.length === 3 ? seqOf(frames[1]) : null;
    if (seq === null) {
      s.garbage++;
      return;
    }
    if (st.model === null) {
      const parts = frames[0].toString("utf8").split("@");
      st.model = parts.length === 3 ? parts[2] : "";
      this.index.setEndpointModel(st.cfg.id, st.model);
      if (st.model === "")
        this.log(`kv-events ${st.cfg.id}: topic names no model and none is configured; keys use ""`);
    }
    if (st.disconnected) {
      st.disconnected = false;
      // The publisher went away: if the stream does not simply continue, the engine may have restarted
      // with a seq that happens to lie past ours, so rebuild from its history instead of patching a gap.
      if (s.lastSeq !== null && seq !== s.lastSeq + 1) {
        s.reconnectResets++;
        this.log(`kv-events ${st.cfg.id}: reconnected at seq ${seq} after ${s.lastSeq}; rebuilding`);
        this.reset(st);
        s.lastSeq = -1;
      }
    }
    const last = s.lastSeq;
    if (last !== null && seq <= last) {
      if (st.dupFloor !== null && seq >= st.dupFloor) {
        s.duplicates++;
        return;
      }
      s.restarts++;
      this.log(`kv-events ${st.cfg.id}: seq went back from ${last} to ${seq} (engine restart); resetting`);
      this.reset(st);
      s.lastSeq = -1;
    }
    st.dupFloor = null;
    const expected = s.lastSeq === null ? seq : s.lastSeq + 1;
    if (seq > expected) {
      const afterRestart = s.lastSeq === -1; // already reset; the new engine's first batches were missed
      if (!afterRestart) s.gaps++;
      if (st.cfg.replayAddress) {
        await this.replay(st, expected, seq, frames[2]);
        return;
      }
      if (!afterRestart) this.reset(st);
    }
    await this.apply(st, seq, frames[2]);
  }

  /** Replays [from, ...] from the endpoint's ROUTER; then applies the live message unless replay covered it. */
  private async replay(st: State, from: number, liveSeq: number, livePayload: Buffer): Promise<void> {
    const s = st.stats;
    s.replays++;
    const dealer = new Dealer({ linger: 0, receiveTimeout: this.replayTimeoutMs, sendTimeout: 1000 });
    st.dealer = dealer;
    try {
      dealer.connect(st.cfg.replayAddress!);
      const req = Buffer.alloc(8);
      req.writeBigUInt64BE(BigInt(from));
      await dealer.send([EMPTY, req]);
      let first = true;
      for (;;) {
        let f = await dealer.receive();
        if (st.closed) return;
        if (f.length >= 3 && f[0].length === 0) f = f.slice(1);
        const seqFrame = f.length === 2 ? f[0] : f.length === 3 ? f[1] : null;
        if (seqFrame === null || seqFrame.length !== 8) {
          s.garbage++;
          continue;
        }
        if (isEndMarker(seqFrame)) break;
        const seq = seqOf(seqFrame)!;
        if (first) {
          first = false;
          if (seq > from) {
            s.historyLost++;
            this.log(`kv-events ${st.cfg.id}: replay starts at ${seq}, not ${from}; rebuilding from it`);
            this.reset(st);
          }
        }
        if (s.lastSeq !== null && seq <= s.lastSeq) continue;
        await this.apply(st, seq, f[f.length - 1]);
        if (st.closed) return;
      }
      if (first) {
        s.historyLost++;
        this.reset(st);
      }
    } catch (err) {
      if (st.closed) return;
      s.replayFailures++;
      this.log(`kv-events ${st.cfg.id}: replay from ${from} failed (${(err as Error).message}); resetting`);
      this.reset(st);
      s.lastSeq = null;
    } finally {
      dealer.close();
      if (st.dealer === dealer) st.dealer = null;
    }
    st.dupFloor = from;
    const last = s.lastSeq;
    if (last !== null && liveSeq <= last) {
      s.duplicates++;
      return;
    }
    if (last !== null && liveSeq > last + 1) this.reset(st);
    await this.apply(st, liveSeq, livePayload);
  }

  private reset(st: State): void {
    st.stats.resets++;
    this.index.resetEndpoint(st.cfg.id);
  }

  /** Applies one batch; `lastSeq` becomes `seq` once it is fully applied (or found undecodable). */
  private async apply(st: State, seq: number, payload: Buffer): Promise<void> {
    const s = st.stats;
    let batch: ReturnType<typeof decodeEventBatchFast>;
    try {
      batch = decodeEventBatchFast(payload);
    } catch {
      s.garbage++;
      s.lastSeq = seq;
      return;
    }
    s.batches++;
    s.unknownEvents += batch.skippedEvents;
    for (const ev of batch.events) {
      const n = this.index.applyEvent(st.cfg.id, ev);
      s.events++;
      s.blocks += n;
      this.budget -= n;
      if (this.budget <= 0) {
        this.budget = this.chunkBlocks;
        await yieldToLoop();
        if (st.closed) return;
      }
    }
    s.lastSeq = seq;
  }
}
