/**
 * The simulated replica's NixlConnector (vLLM vllm/distributed/kv_transfer/kv_connector/v1/nixl/):
 * both roles over one engine and the side channel (nixl-side-channel.ts), in scaled real time.
 *
 * Producer: a request with kv_transfer_params.do_remote_decode that ends length-capped returns
 * vLLM's kv_transfer_params and its blocks stay held under a lease; the side channel answers reads,
 * frees the blocks on read-complete or release, renews leases on heartbeats, and a timer expires
 * leases (vllm:nixl_num_kv_expired_reqs).
 * Consumer: a request with do_remote_prefill and all of remote_engine_id, remote_request_id,
 * remote_host, remote_port waits deferred while this side handshakes once per prefiller (the
 * modelled ~5 s), asks it for the blocks, waits the modelled transfer time (transfers queue on the
 * decoder's link), notifies it, and hands
 * the result to the engine; heartbeats renew the prefiller's lease meanwhile; an abort releases the
 * prefiller's blocks at once. A dead prefiller or an expired lease is a failed transfer
 * (vllm:nixl_num_failed_transfers) handled by kv_load_failure_policy.
 */
import type { RemoteKvNeed, RequestRecord } from "../engine/types.ts";
import { isConsumer, type KvLink, type KvTransferConfig, transferSeconds } from "./kv-transfer-config.ts";
import type { NixlMetrics } from "./nixl-metrics.ts";
import { type ReadStatus, SideChannelClient, SideChannelServer } from "./nixl-side-channel.ts";
import type { ReplicaDriver } from "./replica-driver.ts";

export interface NixlConnectorOptions {
  config: KvTransferConfig;
  driver: ReplicaDriver;
  metrics: NixlMetrics;
  link: KvLink;
  /** KV bytes of one token across the TP group (profile). */
  kvBytesPerToken: number;
  blockSize: number;
  tpSize: number;
  /** Where the side channel listens (host, port; 0 = any free port), also what it advertises. */
  sideChannel: { host: string; port: number };
  log: (line: string) => void;
}

/** A consumer request's remote params, from arrival to the end of its transfer. */
interface Pull {
  engineId: string;
  requestId: string;
  blockIds: number[];
  client: SideChannelClient;
  /** Set once the engine parked it. */
  need: RemoteKvNeed | null;
  settled: boolean;
}

/** How many expired ids a producer remembers, to answer "expired" rather than "unknown". */
const EXPIRED_MEMORY = 10_000;

export class NixlConnector {
  readonly config: KvTransferConfig;
  private server: SideChannelServer | null = null;
  private readonly pulls = new Map<string, Pull>();
  private readonly clients = new Map<string, SideChannelClient>();
  /** (prefiller engine id, address) pairs past their first-contact handshake, or on the way. */
  private readonly handshakes = new Map<string, Promise<void>>();
  private readonly expired = new Set<string>();
  private leaseTimer: NodeJS.Timeout | null = null;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;
  /** Simulated time this decoder's link is busy until: transfers share it one after another. */
  private linkFreeAt = 0;

  constructor(private readonly o: NixlConnectorOptions) {
    this.config = o.config;
  }

  /** Starts the producer's side channel (every role listens, as vLLM's NIXL agent does). */
  async start(): Promise<void> {
    const { host, port } = this.o.sideChannel;
    this.server = await SideChannelServer.listen(host, port, {
      engineId: this.config.engineId,
      read: (id, blocks) => this.answerRead(id, blocks),
      release: (id, why) => this.releaseHeld(id, why),
      heartbeat: (ids) => this.renew(ids),
      log: this.o.log,
    });
  }

  /** The side-channel port actually bound (the advertised remote_port). */
  get sideChannelPort(): number {
    return this.server?.port ?? this.o.sideChannel.port;
  }

  describe(): string {
    const c = this.config;
    return ` kv_transfer=${c.kvConnector}(${c.kvRole}) engine_id=${c.engineId} side_channel=${this.o.sideChannel.host}:${this.sideChannelPort}`;
  }

  // ---- producer ----

  /** vLLM request_finished's kv_transfer_params for a finished record, or null (not held). */
  transferParams(rec: RequestRecord): Record<string, unknown> | null {
    if (rec.remoteBlockIds === undefined) return null;
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: rec.remoteBlockIds,
      remote_engine_id: this.config.engineId,
      remote_request_id: rec.id,
      remote_host: this.o.sideChannel.host,
      remote_port: this.sideChannelPort,
      tp_size: this.o.tpSize,
      remote_num_tokens: rec.remoteNumTokens,
    };
  }

  /** Called for every finished request: arms the lease timer for holds, settles consumer pulls. */
  onFinished(rec: RequestRecord): void {
    if (rec.remoteBlockIds !== undefined) this.armLeaseTimer();
    const pull = this.pulls.get(rec.id);
    if (pull === undefined) return;
    this.pulls.delete(rec.id);
    if (!pull.settled) {
      // An abort before the KV arrived: tell the prefiller to free its blocks now (vLLM sends a
      // NIXL notification), instead of leaving them to the lease.
      pull.settled = true;
      pull.client.request({ type: "release", remote_request_id: pull.requestId }).catch((err: Error) => {
        this.o.metrics.failedNotification();
        this.o.log(`sim-replica: could not release ${pull.requestId} on the prefiller: ${err.message}`);
      });
    }
    this.syncHeartbeats();
  }

  private answerRead(id: string, blockIds: number[]): ReadStatus {
    const held = this.o.driver.engine.heldKv(id);
    if (held === undefined) {
      if (this.expired.has(id))
        this.o.log(`sim-replica: a decode worker asked for the KV blocks of ${id} after its lease expired`);
      return this.expired.has(id) ? "expired" : "unknown";
    }
    const have = new Set(held.blocks);
    return blockIds.every((b) => have.has(b)) ? "ok" : "unknown";
  }

  private releaseHeld(id: string, _why: "read" | "abort"): boolean {
    return this.o.driver.act((e, now) => e.releaseHeld(id, now));
  }

  private renew(ids: string[]): void {
    this.o.driver.act((e, now) => {
      for (const id of ids) e.leases.renew(id, now);
    });
    this.armLeaseTimer();
  }

  private armLeaseTimer(): void {
    if (this.closed) return;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.leaseTimer = null;
    const d = this.o.driver;
    const due = d.engine.leases.nextExpiry();
    if (due === null) return;
    const ms = Math.max(0, Math.ceil(((due - d.simNow()) / d.timeScale) * 1000));
    this.leaseTimer = setTimeout(() => {
      this.leaseTimer = null;
      const ids = d.act((e, now) => e.expireLeases(now));
      for (const id of ids) {
        this.expired.add(id);
        if (this.expired.size > EXPIRED_MEMORY) this.expired.delete(this.expired.values().next().value!);
        this.o.log(`sim-replica: KV lease of ${id} expired; its blocks are freed`);
      }
      this.o.metrics.expiredRequests(ids.length);
      this.armLeaseTimer();
    }, ms + 1);
  }

  // ---- consumer ----

  /**
   * Checks a decode request's kv_transfer_params (vLLM update_state_after_alloc): true if the engine
   * should treat it as remotePrefill (it then pulls once parked). Invalid params mean a local
   * prefill, logged as vLLM does.
   */
  prepare(engineRequestId: string, params: Record<string, unknown> | undefined): boolean {
    if (params?.["do_remote_prefill"] !== true || !isConsumer(this.config)) return false;
    const engineId = params["remote_engine_id"];
    const requestId = params["remote_request_id"];
    const host = params["remote_host"];
    const port = params["remote_port"];
    const groups = params["remote_block_ids"] ?? [];
    // One list per KV group (current vLLM) or a flat list (older): our models have one group.
    const blockIds = Array.isArray(groups) && Array.isArray(groups[0]) ? groups[0] : groups;
    const valid =
      typeof engineId === "string" &&
      typeof requestId === "string" &&
      typeof host === "string" &&
      host !== "" &&
      Number.isInteger(port) &&
      (port as number) > 0 &&
      (port as number) < 65536 &&
      Array.isArray(blockIds) &&
      blockIds.every((b) => Number.isInteger(b));
    if (!valid) {
      this.o.log(
        `sim-replica: Got invalid KVTransferParams: ${JSON.stringify(params)}. This request will not utilize KVTransfer (it needs remote_engine_id, remote_request_id, remote_host and remote_port)`,
      );
      return false;
    }
    const key = `${host}:${port}`;
    let client = this.clients.get(key);
    if (client === undefined) {
      client = new SideChannelClient(host as string, port as number);
      this.clients.set(key, client);
    }
    this.pulls.set(engineRequestId, {
      engineId: engineId as string,
      requestId: requestId as string,
      blockIds: blockIds as number[],
      client,
      need: null,
      settled: false,
    });
    this.syncHeartbeats();
    return true;
  }

  /** Forgets a prepared request the engine never took. */
  forget(engineRequestId: string): void {
    this.pulls.delete(engineRequestId);
    this.syncHeartbeats();
  }

  /** The engine parked these requests: start their pulls. */
  onRemoteKvNeeded(needs: RemoteKvNeed[]): void {
    for (const need of needs) {
      const pull = this.pulls.get(need.requestId);
      if (pull === undefined) {
        // Parked without params (cannot happen through the HTTP layer): fail it by the policy.
        this.finish(need.requestId, false, "no kv_transfer_params were recorded for it");
        continue;
      }
      pull.need = need;
      void this.pull(need.requestId, pull);
    }
  }

  private sleep(simSeconds: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(
        () => {
          this.timers.delete(t);
          resolve();
        },
        (simSeconds / this.o.driver.timeScale) * 1000,
      );
      this.timers.add(t);
    });
  }

  /** First contact with a prefiller: connect, exchange engine ids, and pay the modelled handshake. */
  private handshake(pull: Pull): Promise<void> {
    const key = `${pull.engineId}@${pull.client.address}`;
    let h = this.handshakes.get(key);
    if (h === undefined) {
      h = (async () => {
        const r = await pull.client.request({ type: "handshake", engine_id: this.config.engineId });
        if (r["engine_id"] !== pull.engineId)
          throw new Error(
            `the side channel at ${pull.client.address} belongs to engine ${String(r["engine_id"])}, not ${pull.engineId}`,
          );
        await this.sleep(this.o.link.handshake);
      })();
      this.handshakes.set(key, h);
      h.catch(() => this.handshakes.delete(key));
    }
    return h;
  }

  private async pull(id: string, pull: Pull): Promise<void> {
    const need = pull.need!;
    try {
      await this.handshake(pull);
      if (pull.settled) return;
      if (pull.blockIds.length < need.blocks)
        throw new Error(`the prefiller sent ${pull.blockIds.length} block ids, ${need.blocks} are needed`);
      const blockIds = pull.blockIds.slice(pull.blockIds.length - need.blocks);
      const r = await pull.client.request({
        type: "read",
        remote_engine_id: pull.engineId,
        remote_request_id: pull.requestId,
        block_ids: blockIds,
      });
      if (r["status"] !== "ok")
        throw new Error(`the prefiller answered ${String(r["status"])} for ${pull.requestId}`);
      const bytes = need.blocks * this.o.blockSize * this.o.kvBytesPerToken;
      const seconds = this.occupyLink(bytes);
      await this.sleep(seconds);
      if (pull.settled) return;
      if (!pull.client.alive)
        throw new Error(`the prefiller at ${pull.client.address} went away mid-transfer`);
      pull.settled = true;
      pull.client.request({ type: "done", remote_request_id: pull.requestId }).catch(() => {
        this.o.metrics.failedNotification();
      });
      this.o.metrics.observeTransfer(seconds, this.o.link.overhead, bytes);
      this.finish(id, true, "");
    } catch (err) {
      if (pull.settled) return;
      pull.settled = true;
      this.o.metrics.failedTransfer();
      this.finish(id, false, (err as Error).message);
    }
  }

  /**
   * Seconds from post to completion of a transfer of `bytes` posted now: the post overhead, then the
   * wire time after the transfers already on this decoder's link (its NIC is the shared bottleneck;
   * vLLM's nixl_xfer_time_seconds includes such queueing).
   */
  private occupyLink(bytes: number): number {
    const now = this.o.driver.simNow();
    const start = Math.max(now + this.o.link.overhead, this.linkFreeAt);
    this.linkFreeAt = start + (transferSeconds(this.o.link, bytes) - this.o.link.overhead);
    return this.linkFreeAt - now;
  }

  private finish(id: string, ok: boolean, why: string): void {
    if (this.closed) return;
    const d = this.o.driver;
    if (!ok)
      this.o.log(
        `sim-replica: KV transfer for ${id} failed (${why}); kv_load_failure_policy=${this.config.kvLoadFailurePolicy}`,
      );
    const out = d.act((e, now) => e.completeRemoteKv(id, now, ok));
    this.pulls.delete(id);
    this.syncHeartbeats();
    if (out.outcome === "failed" && out.record) d.finishOutside(out.record);
  }

  /** Heartbeats run while any consumer request is between arrival and the end of its transfer. */
  private syncHeartbeats(): void {
    const want = !this.closed && [...this.pulls.values()].some((p) => !p.settled);
    if (want && this.heartbeatTimer === null) {
      const l = this.o.driver.engine.leases;
      const ms = (l.heartbeatInterval / this.o.driver.timeScale) * 1000;
      this.heartbeatTimer = setInterval(() => this.heartbeat(), Math.max(1, ms));
    } else if (!want && this.heartbeatTimer !== null) {
      clearInterval(this.heartbeatTimer);
      this.heartbeatTimer = null;
    }
  }

  private heartbeat(): void {
    const byClient = new Map<SideChannelClient, string[]>();
    for (const p of this.pulls.values()) {
      if (p.settled) continue;
      const ids = byClient.get(p.client) ?? [];
      ids.push(p.requestId);
      byClient.set(p.client, ids);
    }
    for (const [client, ids] of byClient) client.notify({ type: "heartbeat", remote_request_ids: ids });
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    for (const c of this.clients.values()) c.close();
    await this.server?.close();
  }
}
