/**
 * The simulated replica's KV-event publisher, wire-compatible with vLLM's ZmqEventPublisher
 * (vLLM v0.26.0 vllm/distributed/kv_events.py): a PUB socket sending
 * `[topic, seq u64 BE, msgpack batch]` with seq counting batches from 0, and an optional ROUTER socket that
 * replays the last `buffer_steps` batches on request.
 *
 * A socket that cannot bind fails with KvEventsBindError, naming the address and the config field.
 *
 * Differences from vLLM, all invisible on the wire: batches are encoded and handed to the socket
 * synchronously (no background thread, so `max_queue_size` has no effect), and a batch is kept for replay
 * even when the socket refused it, so a subscriber can recover it.
 */

import { Publisher, Router } from "zeromq";
import { type EventFormat, encodeEventBatch } from "../kv/event-codec.ts";
import type { KVEventBatch } from "../kv/events.ts";
import { type KvEventsConfig, offsetEndpointPort } from "./kv-events-config.ts";

export type ReplayLayout = "v0.26" | "legacy";

export interface PublisherOptions {
  format: EventFormat;
  /** Fills batches whose dataParallelRank is null and offsets both endpoints, as vLLM does. Default 0. */
  dataParallelRank?: number;
  /** "v0.26" (default): replies carry the topic frame (vLLM PR #45177); "legacy": vLLM <= v0.25. */
  replayLayout?: ReplayLayout;
}

export interface PublisherStats {
  /** Batches the PUB socket accepted (it may still drop them per subscriber at the high-water mark). */
  published: number;
  /** Batches refused by the socket or published after close(). */
  dropped: number;
  /** Batches that could not be encoded; their seq is consumed, as in vLLM. */
  encodeErrors: number;
  /** The seq the next batch gets. */
  nextSeq: number;
  /** Well-formed replay requests received (each is answered unless the socket refuses the replies). */
  replayRequestsServed: number;
  /** Replay requests that were not `[identity, delimiter, start_seq]`; ignored. */
  replayRequestsMalformed: number;
  /** Replays cut short because the ROUTER refused a reply. */
  replayErrors: number;
}

/**
 * A KV-events socket that could not be bound (typically: another replica on this host already publishes
 * on that port). The message names the address, the --kv-events-config field that set it, and a fix.
 */
export class KvEventsBindError extends Error {
  override name = "KvEventsBindError";
  readonly code = "KVG_ERR_KV_EVENTS_BIND";
  constructor(
    readonly field: "endpoint" | "replay_endpoint",
    readonly address: string,
    cause: unknown,
    rank: number,
  ) {
    const c = cause as { code?: string; message?: string };
    const port = /:(\d+)$/.exec(address)?.[1];
    const offset = rank > 0 ? ` (the configured port + data-parallel rank ${rank})` : "";
    const inUse = c.code === "EADDRINUSE" || /in use/i.test(c.message ?? "");
    const example = port ? `, e.g. "${field}":"tcp://*:${Number(port) + 10}"` : "";
    super(
      inUse
        ? `--kv-events-config "${field}" ${address}${offset} is already in use (another replica or vLLM on this host publishes there); give each replica its own ports${example}, or use kvgate sim-fleet`
        : `--kv-events-config "${field}" ${address}${offset}: cannot bind: ${c.message ?? String(cause)}`,
      { cause },
    );
  }
}

async function bindOrExplain(
  sock: Publisher | Router,
  field: "endpoint" | "replay_endpoint",
  address: string,
  rank: number,
): Promise<void> {
  try {
    await sock.bind(address);
  } catch (err) {
    throw new KvEventsBindError(field, address, err, rank);
  }
}

/** vLLM's END_SEQ: (-1).to_bytes(8, "big", signed=True). */
export const REPLAY_END_SEQ: Buffer = Buffer.alloc(8, 0xff);
const EMPTY = Buffer.alloc(0);

/** vLLM's bind-or-connect rule for the PUB endpoint. */
export function endpointBinds(endpoint: string): boolean {
  return (
    endpoint.includes("*") ||
    endpoint.includes("::") ||
    endpoint.startsWith("ipc://") ||
    endpoint.startsWith("inproc://")
  );
}

function seqFrame(seq: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(BigInt(seq));
  return b;
}

export class ZmqEventPublisher {
  /** The PUB address actually bound (wildcard ports resolved), or the address dialled. */
  readonly endpoint: string;
  /** The ROUTER address actually bound, or null when replay is off. */
  readonly replayEndpoint: string | null;
  readonly topic: string;

  private readonly topicFrame: Buffer;
  private readonly format: EventFormat;
  private readonly rank: number;
  private readonly layout: ReplayLayout;
  private readonly pub: Publisher;
  private readonly router: Router | null;
  private replayLoop: Promise<void> = Promise.resolve();
  private closing: Promise<void> | null = null;

  // Replay ring buffer of the last `capacity` batches.
  private readonly capacity: number;
  private readonly ringSeq: number[] = [];
  private readonly ringPayload: Uint8Array[] = [];
  private ringStart = 0;

  private nextSeq = 0;
  private published = 0;
  private dropped = 0;
  private encodeErrors = 0;
  private served = 0;
  private malformed = 0;
  private replayErrors = 0;
  private readonly onSent = (): void => {
    this.published++;
  };
  private readonly onRefused = (): void => {
    this.dropped++;
  };

  private constructor(
    cfg: KvEventsConfig,
    opts: PublisherOptions,
    pub: Publisher,
    endpoint: string,
    router: Router | null,
    replayEndpoint: string | null,
  ) {
    this.topic = cfg.topic;
    this.topicFrame = Buffer.from(cfg.topic, "utf8");
    this.format = opts.format;
    this.rank = opts.dataParallelRank ?? 0;
    this.layout = opts.replayLayout ?? "v0.26";
    this.capacity = cfg.bufferSteps;
    this.pub = pub;
    this.endpoint = endpoint;
    this.router = router;
    this.replayEndpoint = replayEndpoint;
    if (router) this.replayLoop = this.serveReplays(router);
  }

  /** Opens the sockets (PUB per the bind-or-connect rule; ROUTER always binds) and starts serving replays. */
  static async start(cfg: KvEventsConfig, opts: PublisherOptions): Promise<ZmqEventPublisher> {
    const rank = opts.dataParallelRank ?? 0;
    const endpoint = offsetEndpointPort(cfg.endpoint, rank);
    const replayAt = offsetEndpointPort(cfg.replayEndpoint, rank);
    // sendTimeout 0: send() never waits; PUB drops at the high-water mark instead of blocking.
    const pub = new Publisher({ sendHighWaterMark: cfg.hwm, sendTimeout: 0, linger: 0 });
    let router: Router | null = null;
    try {
      let bound = endpoint;
      if (endpointBinds(endpoint)) {
        await bindOrExplain(pub, "endpoint", endpoint, rank);
        bound = pub.lastEndpoint ?? endpoint;
      } else {
        pub.connect(endpoint);
      }
      let replayBound: string | null = null;
      if (replayAt !== null) {
        router = new Router({ linger: 0, sendTimeout: 5000 });
        await bindOrExplain(router, "replay_endpoint", replayAt, rank);
        replayBound = router.lastEndpoint ?? replayAt;
      }
      return new ZmqEventPublisher(cfg, opts, pub, bound, router, replayBound);
    } catch (err) {
      pub.close();
      router?.close();
      throw err;
    }
  }

  /**
   * Publishes one batch (one engine step). Never throws: encode failures and refused sends are counted.
   * A null dataParallelRank is filled with this publisher's rank; the caller's object is not modified.
   */
  publish(batch: KVEventBatch): void {
    if (this.closing !== null) {
      this.dropped++;
      return;
    }
    const seq = this.nextSeq++;
    const full = batch.dataParallelRank === null ? { ...batch, dataParallelRank: this.rank } : batch;
    let payload: Uint8Array;
    try {
      payload = encodeEventBatch(full, this.format);
    } catch {
      this.encodeErrors++;
      return;
    }
    this.remember(seq, payload);
    try {
      this.pub.send([this.topicFrame, seqFrame(seq), payload]).then(this.onSent, this.onRefused);
    } catch {
      this.dropped++;
    }
  }

  stats(): PublisherStats {
    return {
      published: this.published,
      dropped: this.dropped,
      encodeErrors: this.encodeErrors,
      nextSeq: this.nextSeq,
      replayRequestsServed: this.served,
      replayRequestsMalformed: this.malformed,
      replayErrors: this.replayErrors,
    };
  }

  /** Closes both sockets and waits for the replay loop to end. Idempotent. */
  close(): Promise<void> {
    if (this.closing === null) {
      this.pub.close();
      this.router?.close();
      this.closing = this.replayLoop;
    }
    return this.closing;
  }

  private remember(seq: number, payload: Uint8Array): void {
    if (this.capacity === 0) return;
    if (this.ringSeq.length < this.capacity) {
      this.ringSeq.push(seq);
      this.ringPayload.push(payload);
      return;
    }
    this.ringSeq[this.ringStart] = seq;
    this.ringPayload[this.ringStart] = payload;
    this.ringStart = (this.ringStart + 1) % this.capacity;
  }

  private async serveReplays(router: Router): Promise<void> {
    try {
      for await (const frames of router) {
        // vLLM accepts exactly [identity, delimiter, start_seq] and reads start_seq as big-endian
        // unsigned of whatever length it has; it checks neither the delimiter nor the length.
        if (frames.length !== 3) {
          this.malformed++;
          continue;
        }
        this.served++;
        try {
          await this.replay(router, frames[0], startSeqOf(frames[2]));
        } catch {
          if (this.closing !== null) return;
          this.replayErrors++;
        }
      }
    } catch {
      // The socket was closed under a pending receive.
    }
  }

  private async replay(router: Router, identity: Buffer, start: bigint): Promise<void> {
    const n = this.ringSeq.length;
    // Snapshot first: publish() may overwrite ring slots while we await sends.
    const seqs: number[] = [];
    const payloads: Uint8Array[] = [];
    for (let k = 0; k < n; k++) {
      const idx = (this.ringStart + k) % n;
      if (BigInt(this.ringSeq[idx]) >= start) {
        seqs.push(this.ringSeq[idx]);
        payloads.push(this.ringPayload[idx]);
      }
    }
    const legacy = this.layout === "legacy";
    for (let k = 0; k < seqs.length; k++) {
      const seq = seqFrame(seqs[k]);
      await router.send(
        legacy ? [identity, EMPTY, seq, payloads[k]] : [identity, EMPTY, this.topicFrame, seq, payloads[k]],
      );
    }
    await router.send(
      legacy ? [identity, EMPTY, REPLAY_END_SEQ, EMPTY] : [identity, EMPTY, EMPTY, REPLAY_END_SEQ, EMPTY],
    );
  }
}

function startSeqOf(frame: Buffer): bigint {
  let x = 0n;
  for (const byte of frame) x = (x << 8n) | BigInt(byte);
  return x;
}
