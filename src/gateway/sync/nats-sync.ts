/**
 * `--nats URL`: active-active gateway replicas share routing state over NATS. The network edge of
 * src/scheduler/sync.ts: every `flushMs` this gateway publishes what its picks taught it (prefix
 * insertions, precise speculative entries, session bindings, its own in-flight load and prefix-home
 * counts) on `<subject>.batch` and merges its peers' batches as they arrive. Nothing on the request
 * path waits for NATS: a pick only appends to a bounded buffer, and a gateway that cannot reach NATS
 * keeps routing on its own view (buffering its news up to the bound, then dropping the oldest,
 * counted) and says so in kvgate_sync_connected.
 *
 * A gateway that joins late — or reconnects after an outage — publishes `<subject>.hello`; every
 * peer answers on `<subject>.replay.<origin>` with its recent own insertions and bindings (a bounded
 * log), so the newcomer's approximate index starts warm instead of cache-blind. Load, home counts and
 * speculative entries are never replayed: the next live batch carries each peer's current load and
 * counts, a peer silent for `staleAfterSeconds` counts for none, and speculative entries live seconds.
 */
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { Counter, Gauge, type Registry } from "prom-client";
import type { Scheduler } from "../../scheduler/scheduler.ts";
import { GatewaySync } from "../../scheduler/sync.ts";
import { decodeBatch, encodeBatch } from "./codec.ts";

export interface NatsSyncOptions {
  /** nats://host:port (comma-separated for several servers). */
  url: string;
  /** Subject prefix shared by the replicas of one pool. */
  subject: string;
  /** This gateway's id among its peers (default: a random one). */
  origin?: string;
  /** Fingerprint of the routing config; peers with another are not merged. */
  config: string;
  /** Between batches, ms (default 20). */
  flushMs?: number;
  /** A heartbeat at least this often, ms (default 500). */
  heartbeatMs?: number;
  /** Peers silent this long count for no load (default 5). */
  staleAfterSeconds?: number;
  registry?: Registry;
  log?: (line: string) => void;
}

/** Prefix blocks per message: ~11 bytes each on the wire, well under NATS's 1 MB default max_payload. */
const MAX_BLOCKS_PER_MESSAGE = 16_384;

export class NatsSync {
  readonly sync: GatewaySync;
  connected = false;
  /** Messages received, sent, and dropped (garbled, foreign config, stale sequence, or unsent while disconnected). */
  readonly messages = { in: 0, out: 0, dropped: 0 };
  readonly #o: Required<Pick<NatsSyncOptions, "flushMs" | "heartbeatMs" | "subject" | "url">> &
    NatsSyncOptions;
  #nc: NatsConnection | null = null;
  #timer: ReturnType<typeof setInterval> | null = null;
  #closed = false;
  #lastSent = 0;
  #lastLag = 0;
  readonly #log: (line: string) => void;

  constructor(scheduler: Scheduler, o: NatsSyncOptions) {
    this.#o = { flushMs: 20, heartbeatMs: 500, ...o };
    this.#log = o.log ?? ((l) => process.stderr.write(`${l}\n`));
    const origin = o.origin ?? `kvgate-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
    this.sync = new GatewaySync(scheduler, {
      origin,
      config: o.config,
      staleAfterSeconds: o.staleAfterSeconds ?? 5,
    });
    if (o.registry) this.#metrics(o.registry);
  }

  get origin(): string {
    return this.sync.origin;
  }

  /** Connects in the background (retrying for ever) and starts the flush timer; never throws. */
  start(): void {
    this.#timer = setInterval(() => this.#tick(), this.#o.flushMs);
    this.#timer.unref();
    void this.#connect();
  }

  async #connect(): Promise<void> {
    try {
      const nc = await connect({
        servers: this.#o.url.split(",").map((s) => s.trim()),
        name: this.origin,
        noEcho: true,
        waitOnFirstConnect: true,
        maxReconnectAttempts: -1,
        reconnectTimeWait: 500,
        pingInterval: 2_000,
        maxPingOut: 2,
      });
      if (this.#closed) {
        await nc.close();
        return;
      }
      this.#nc = nc;
      this.#subscribe(nc);
      this.#up();
      void this.#watch(nc);
    } catch (err) {
      if (!this.#closed)
        this.#log(
          `kvgate: --nats ${this.#o.url}: ${(err as Error).message}; routing on this gateway's own view (check the URL and that nats-server runs)`,
        );
    }
  }

  #subscribe(nc: NatsConnection): void {
    const s = this.#o.subject;
    nc.subscribe(`${s}.batch`, {
      callback: (err, m) => {
        if (!err) this.#receive(m.data, false);
      },
    });
    nc.subscribe(`${s}.replay.${this.origin}`, {
      callback: (err, m) => {
        if (!err) this.#receive(m.data, true);
      },
    });
    nc.subscribe(`${s}.hello`, {
      callback: (err, m) => {
        if (err) return;
        let peer: unknown;
        try {
          peer = JSON.parse(Buffer.from(m.data).toString("utf8")).origin;
        } catch {
          this.messages.dropped++;
          return;
        }
        if (typeof peer !== "string" || peer === this.origin || !/^[\w.-]{1,128}$/.test(peer)) return;
        for (const b of this.sync.replay()) this.#publish(`${s}.replay.${peer}`, encodeBatch(b));
      },
    });
  }

  async #watch(nc: NatsConnection): Promise<void> {
    for await (const st of nc.status()) {
      if (st.type === "disconnect" || st.type === "staleConnection") {
        if (this.connected)
          this.#log(
            `kvgate: lost NATS (${this.#o.url}); routing on this gateway's own view until it is back`,
          );
        this.connected = false;
      } else if (st.type === "reconnect") this.#up();
    }
  }

  /** Connected (again): ask the peers for what was missed. */
  #up(): void {
    this.connected = true;
    this.#publish(`${this.#o.subject}.hello`, Buffer.from(JSON.stringify({ origin: this.origin })));
  }

  #publish(subject: string, data: Uint8Array): void {
    const nc = this.#nc;
    if (nc === null || !this.connected) {
      this.messages.dropped++;
      return;
    }
    try {
      nc.publish(subject, data);
      this.messages.out++;
    } catch {
      this.messages.dropped++;
    }
  }

  #receive(data: Uint8Array, replay: boolean): void {
    this.messages.in++;
    let b: ReturnType<typeof decodeBatch>;
    try {
      b = decodeBatch(data);
    } catch {
      this.messages.dropped++;
      return;
    }
    if (!this.sync.apply(b, Date.now() / 1000, replay)) this.messages.dropped++;
  }

  #tick(): void {
    const now = Date.now() / 1000;
    this.sync.expire(now);
    // Disconnected: keep the news buffered (bounded) for when NATS is back.
    if (!this.connected || this.#nc === null) return;
    const due = now - this.#lastSent >= this.#o.heartbeatMs / 1000;
    if (!due && !this.sync.hasNews()) return;
    do {
      this.#publish(`${this.#o.subject}.batch`, encodeBatch(this.sync.take(now, MAX_BLOCKS_PER_MESSAGE)));
    } while (this.sync.pendingBlocks > 0);
    this.#lastSent = now;
  }

  /** Re-hooks after a config reload. */
  attach(scheduler: Scheduler, config: string): void {
    this.sync.attach(scheduler, config);
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    this.sync.detach();
    const nc = this.#nc;
    this.#nc = null;
    this.connected = false;
    if (nc) await nc.close().catch(() => {});
  }

  #metrics(registry: Registry): void {
    const self = this;
    const registers = [registry];
    new Gauge({
      name: "kvgate_sync_connected",
      help: "1 while this gateway is connected to NATS (--nats) and sharing routing state with its peers; 0 while it routes on its own view.",
      registers,
      collect() {
        this.set(self.connected ? 1 : 0);
      },
    });
    new Gauge({
      name: "kvgate_sync_peers",
      help: "Peer gateways heard from within the staleness bound.",
      registers,
      collect() {
        this.set(self.sync.peers);
      },
    });
    new Gauge({
      name: "kvgate_sync_lag_seconds",
      help: "Largest delay from a peer's batch to its merge here since the last scrape (includes clock skew between hosts); the last value while no batch arrives.",
      registers,
      collect() {
        const s = self.sync.snapshot();
        if (s.batchesIn > 0 && s.maxLagSeconds > 0) self.#lastLag = s.maxLagSeconds;
        this.set(self.#lastLag);
      },
    });
    new Counter({
      name: "kvgate_sync_messages_total",
      help: "Sync messages by direction: in (received), out (published), dropped (garbled, foreign config, stale sequence, or not sent while disconnected).",
      labelNames: ["direction"],
      registers,
      collect() {
        this.reset();
        for (const d of ["in", "out", "dropped"] as const) this.inc({ direction: d }, self.messages[d]);
      },
    });
    new Counter({
      name: "kvgate_sync_blocks_total",
      help: "Approximate-prefix blocks shared: in (merged from peers), out (published), dropped (outgoing buffer full while NATS was unreachable).",
      labelNames: ["direction"],
      registers,
      collect() {
        const s = self.sync.stats;
        this.reset();
        this.inc({ direction: "in" }, s.blocksIn);
        this.inc({ direction: "out" }, s.blocksOut);
        this.inc({ direction: "dropped" }, s.blocksDroppedOut);
      },
    });
    new Counter({
      name: "kvgate_sync_gaps_total",
      help: "Peer batches missed (sequence gaps): state lost in transit; insertions are not repaired, load is by the next batch.",
      registers,
      collect() {
        this.reset();
        this.inc(self.sync.stats.gaps);
      },
    });
    new Counter({
      name: "kvgate_sync_peers_expired_total",
      help: "Peers whose in-flight load was dropped after they went silent.",
      registers,
      collect() {
        this.reset();
        this.inc(self.sync.stats.peersExpired);
      },
    });
  }
}
