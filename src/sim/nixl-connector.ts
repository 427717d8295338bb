/**
 * The simulated replica's NixlConnector (vLLM vllm/distributed/kv_transfer/kv_connector/v1/nixl/):
 * both roles over one engine and the side channel (nixl-side-channel.ts), in scaled real time.
 *
 * Producer: a request with kv_transfer_params.do_remote_decode that ends length-capped returns
 * vLLM's kv_transfer_params and its blocks stay held under a lease; the side channel answers reads,
 * frees the blocks on read-complete or release, renews leases on heartbeats, and a timer expires
 * leases (vllm:nixl_num_kv_expired_reqs).
 * Consumer (nixl-consumer.ts): a request with do_remote_prefill and all of remote_engine_id,
 * remote_request_id, remote_host, remote_port waits deferred while the KV is pulled over the side
 * channel in the modelled time; failures go by kv_load_failure_policy.
 */

import type { Registry } from "prom-client";
import { kvBytesPerToken } from "../engine/profile.ts";
import type { RemoteKvNeed, RequestRecord } from "../engine/types.ts";
import type { KvLink, KvTransferConfig } from "./kv-transfer-config.ts";
import { NixlConsumer } from "./nixl-consumer.ts";
import { NixlMetrics } from "./nixl-metrics.ts";
import { type ReadStatus, SideChannelServer } from "./nixl-side-channel.ts";
import type { ReplicaDriver } from "./replica-driver.ts";
import type { ReplicaOptions } from "./replica-options.ts";

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

/** How many expired ids a producer remembers, to answer "expired" rather than "unknown". */
const EXPIRED_MEMORY = 10_000;

export class NixlConnector {
  readonly config: KvTransferConfig;
  private server: SideChannelServer | null = null;
  private readonly consumer: NixlConsumer;
  private readonly expired = new Set<string>();
  private leaseTimer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(private readonly o: NixlConnectorOptions) {
    this.config = o.config;
    this.consumer = new NixlConsumer(o);
  }

  /** The connector of a replica with these options (which set a kv-transfer config). */
  static forReplica(opts: ReplicaOptions, driver: ReplicaDriver, registry: Registry): NixlConnector {
    return new NixlConnector({
      config: opts.kvTransferConfig!,
      driver,
      metrics: new NixlMetrics(registry, {
        model_name: opts.servedModelNames[0]!,
        engine: String(opts.dataParallelRank),
      }),
      link: opts.kvLink,
      kvBytesPerToken: kvBytesPerToken(opts.profile.model),
      blockSize: opts.blockSize,
      tpSize: opts.profile.hardware.tensorParallel,
      sideChannel: opts.sideChannel,
      log: opts.log,
    });
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
    this.consumer.onFinished(rec);
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

  // ---- consumer (nixl-consumer.ts) ----

  prepare(engineRequestId: string, params: Record<string, unknown> | undefined): boolean {
    return this.consumer.prepare(engineRequestId, params);
  }

  forget(engineRequestId: string): void {
    this.consumer.forget(engineRequestId);
  }

  rejectedBeforeAdmission(params: Record<string, unknown> | undefined): void {
    this.consumer.rejectedBeforeAdmission(params);
  }

  onRemoteKvNeeded(needs: RemoteKvNeed[]): void {
    this.consumer.onRemoteKvNeeded(needs);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.consumer.close();
    await this.server?.close();
  }
}
