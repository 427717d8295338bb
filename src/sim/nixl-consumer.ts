/**
 * The consumer (decoder) half of the simulated NixlConnector: checks a decode request's
 * kv_transfer_params, and once the engine parks the request, handshakes once per prefiller (the
 * modelled ~5 s), asks it for the blocks over the side channel, waits the modelled transfer time
 * (transfers queue on this decoder's link), notifies it, and completes the request in the engine.
 * Heartbeats renew the prefiller's lease from arrival to the end of the transfer; an abort
 * releases the prefiller's blocks at once. A dead prefiller or a refused read is a failed transfer
 * (vllm:nixl_num_failed_transfers), handled by kv_load_failure_policy in the engine.
 */
import type { RemoteKvNeed, RequestRecord } from "../engine/types.ts";
import { isConsumer, transferSeconds } from "./kv-transfer-config.ts";
import type { NixlConnectorOptions } from "./nixl-connector.ts";
import { SideChannelClient } from "./nixl-side-channel.ts";

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

interface Remote {
  engineId: string;
  requestId: string;
  host: string;
  port: number;
  blockIds: number[];
}

/**
 * The producer's coordinates in kv_transfer_params, or null unless all of remote_engine_id,
 * remote_request_id, remote_host and remote_port are there (vLLM update_state_after_alloc).
 * remote_block_ids: one list per KV group (current vLLM) or a flat list (older); one group here.
 */
function remoteOf(params: Record<string, unknown>): Remote | null {
  const {
    remote_engine_id: engineId,
    remote_request_id: requestId,
    remote_host: host,
    remote_port: port,
  } = params;
  const groups = params["remote_block_ids"] ?? [];
  const blockIds = Array.isArray(groups) && Array.isArray(groups[0]) ? groups[0] : groups;
  const valid =
    typeof engineId === "string" &&
    typeof requestId === "string" &&
    typeof host === "string" &&
    host !== "" &&
    typeof port === "number" &&
    Number.isInteger(port) &&
    port > 0 &&
    port < 65536 &&
    Array.isArray(blockIds) &&
    blockIds.every((b) => Number.isInteger(b));
  return valid ? { engineId, requestId, host, port, blockIds: blockIds as number[] } : null;
}

export class NixlConsumer {
  private readonly pulls = new Map<string, Pull>();
  private readonly clients = new Map<string, SideChannelClient>();
  /** (prefiller engine id, address) pairs past their first-contact handshake, or on the way. */
  private readonly handshakes = new Map<string, Promise<void>>();
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;
  /** Simulated time this decoder's link is busy until: transfers share it one after another. */
  private linkFreeAt = 0;

  constructor(private readonly o: NixlConnectorOptions) {}

  /** A finished (or aborted) request: an abort before its KV arrived releases the prefiller's blocks. */
  onFinished(rec: RequestRecord): void {
    const pull = this.pulls.get(rec.id);
    if (pull === undefined) return;
    this.pulls.delete(rec.id);
    if (!pull.settled) {
      // vLLM sends a NIXL notification so the prefiller frees now instead of at lease expiry.
      pull.settled = true;
      pull.client.request({ type: "release", remote_request_id: pull.requestId }).catch((err: Error) => {
        this.o.metrics.failedNotification();
        this.o.log(`sim-replica: could not release ${pull.requestId} on the prefiller: ${err.message}`);
      });
    }
    this.syncHeartbeats();
  }

  /**
   * Checks a decode request's kv_transfer_params (vLLM update_state_after_alloc): true if the engine
   * should treat it as remotePrefill (it then pulls once parked). Invalid params mean a local
   * prefill, logged as vLLM does.
   */
  prepare(engineRequestId: string, params: Record<string, unknown> | undefined): boolean {
    if (params?.["do_remote_prefill"] !== true || !isConsumer(this.o.config)) return false;
    const remote = remoteOf(params);
    if (remote === null) {
      this.o.log(
        `sim-replica: Got invalid KVTransferParams: ${JSON.stringify(params)}. This request will not utilize KVTransfer (it needs remote_engine_id, remote_request_id, remote_host and remote_port)`,
      );
      return false;
    }
    this.pulls.set(engineRequestId, {
      ...remote,
      client: this.clientFor(remote.host, remote.port),
      need: null,
      settled: false,
    });
    this.syncHeartbeats();
    return true;
  }

  private clientFor(host: string, port: number): SideChannelClient {
    const key = `${host}:${port}`;
    let client = this.clients.get(key);
    if (client === undefined) {
      client = new SideChannelClient(host, port);
      this.clients.set(key, client);
    }
    return client;
  }

  /**
   * A decode request with valid remote params was rejected before the engine took it (bad model,
   * too long, ...): tell the prefiller to free its blocks now, as vLLM does since PR #41269
   * (notify_kv_transfer_request_rejected), instead of leaving them to the lease.
   */
  rejectedBeforeAdmission(params: Record<string, unknown> | undefined): void {
    if (params?.["do_remote_prefill"] !== true || !isConsumer(this.o.config)) return;
    const remote = remoteOf(params);
    if (remote === null) return;
    this.clientFor(remote.host, remote.port)
      .request({ type: "release", remote_request_id: remote.requestId })
      .catch((err: Error) => {
        this.o.metrics.failedNotification();
        this.o.log(`sim-replica: could not release ${remote.requestId} on the prefiller: ${err.message}`);
      });
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

  /**
   * Waits until simulated time `deadline`. Modelled durations run from when their step began, so
   * the side channel's own round trips (real milliseconds, magnified by --time-scale) are inside
   * them rather than added on top.
   */
  private sleepUntil(deadline: number): Promise<void> {
    const d = this.o.driver;
    const ms = Math.max(0, ((deadline - d.simNow()) / d.timeScale) * 1000);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.timers.delete(t);
        resolve();
      }, ms);
      this.timers.add(t);
    });
  }

  /** First contact with a prefiller: connect, exchange engine ids, and pay the modelled handshake. */
  private handshake(pull: Pull): Promise<void> {
    const key = `${pull.engineId}@${pull.client.address}`;
    let h = this.handshakes.get(key);
    if (h === undefined) {
      h = (async () => {
        const t0 = this.o.driver.simNow();
        const r = await pull.client.request({ type: "handshake", engine_id: this.o.config.engineId });
        if (r["engine_id"] !== pull.engineId)
          throw new Error(
            `the side channel at ${pull.client.address} belongs to engine ${String(r["engine_id"])}, not ${pull.engineId}`,
          );
        await this.sleepUntil(t0 + this.o.link.handshake);
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
      const posted = this.o.driver.simNow();
      const r = await pull.client.request({
        type: "read",
        remote_engine_id: pull.engineId,
        remote_request_id: pull.requestId,
        block_ids: blockIds,
      });
      if (r["status"] !== "ok")
        throw new Error(`the prefiller answered ${String(r["status"])} for ${pull.requestId}`);
      const bytes = need.blocks * this.o.blockSize * this.o.kvBytesPerToken;
      const seconds = this.occupyLink(bytes, posted);
      await this.sleepUntil(posted + seconds);
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
   * Seconds from post to completion of a transfer of `bytes` posted at simulated time `now`: the
   * post overhead, then the wire time after the transfers already on this decoder's link (its NIC is
   * the shared bottleneck; vLLM's nixl_xfer_time_seconds includes such queueing).
   */
  private occupyLink(bytes: number, now: number): number {
    const start = Math.max(now + this.o.link.overhead, this.linkFreeAt);
    this.linkFreeAt = start + (transferSeconds(this.o.link, bytes) - this.o.link.overhead);
    return this.linkFreeAt - now;
  }

  private finish(id: string, ok: boolean, why: string): void {
    if (this.closed) return;
    const d = this.o.driver;
    if (!ok)
      this.o.log(
        `sim-replica: KV transfer for ${id} failed (${why}); kv_load_failure_policy=${this.o.config.kvLoadFailurePolicy}`,
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

  close(): void {
    this.closed = true;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    for (const c of this.clients.values()) c.close();
  }
}
