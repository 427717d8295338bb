/**
 * The KV-transfer link of a prefill/decode fleet, pure: how long a decoder takes to pull a
 * request's KV cache from its prefiller, in virtual time.
 *
 * Model (published figures in the comments of TRANSPORTS):
 *   - First contact: the first transfer between a (decoder, prefiller) pair waits for the NIXL
 *     handshake (`handshakeS`, ~5 s in vLLM's NixlConnector); it runs once per pair in the
 *     background, so it delays only that pair's transfers, never the decoder's others.
 *   - Contention: FIFO per decoder NIC. Every GPU has its own NIC (`bandwidth` each; GKE A3 Ultra
 *     and DGX H200 nodes give each GPU one), and each TP rank pulls its own KV shard, so a transfer
 *     from a TP_p prefiller into a TP_d decoder runs on min(TP_p, TP_d) of the decoder's TP_d NICs
 *     at once, each carrying its share of the bytes. The decoder pulls (NIXL READ), so its NICs
 *     carry every transfer into it: a transfer takes the NICs that are free soonest and starts
 *     when all of them are, queuing behind earlier transfers (first come, first served). FIFO
 *     rather than fair share keeps each completion time fixed when the transfer starts (fair share
 *     gives the same aggregate throughput and later mean completions). The prefiller's NICs are
 *     not modelled as a bottleneck.
 *   - Per-transfer overhead (`overheadS`, NIXL's post/notification time, ~1–7 ms) is latency
 *     after the bytes land; it does not hold the NIC.
 *   - bytes = transferred tokens × the profile's KV bytes per token.
 */

export type Transport = "rdma" | "tcp";

export interface KvLinkConfig {
  transport: Transport;
  /** Bytes/s of one GPU's NIC. */
  bandwidth: number;
  /** Seconds added to every transfer after its bytes land. */
  overheadS: number;
  /** Seconds of the one-time handshake per (decoder, prefiller) pair. */
  handshakeS: number;
}

/** Defaults per transport, from published measurements. */
export const TRANSPORTS: Readonly<Record<Transport, Omit<KvLinkConfig, "transport">>> = {
  // RDMA: 4 GB in ~360 ms (≈ 11 GB/s) on 200 Gb/s links (llm-d v0.5 blog, 2026-02); 7.1 GB/s for a
  // 70 MB transfer with 5.7 ms post (vLLM PR #25388); 4.3 GB/s aggregate, 6.7 ms post in a 3P1D
  // run (vLLM #50913). 8 GB/s and 5 ms sit inside those ranges.
  rdma: { bandwidth: 8e9, overheadS: 0.005, handshakeS: 5 },
  // NIXL falling back to TCP: 0.5 GB/s (vLLM #52607, same node without RDMA); 0.5–1 GB/s is the
  // range seen without an RDMA-capable UCX build.
  tcp: { bandwidth: 0.5e9, overheadS: 0.005, handshakeS: 5 },
};

/** A link config from a transport and optional overrides (GB/s and ms, as scenario files give them). */
export function kvLinkConfig(
  transport: Transport = "rdma",
  o: { bandwidthGBps?: number; overheadMs?: number; handshakeS?: number } = {},
): KvLinkConfig {
  const d = TRANSPORTS[transport];
  const c: KvLinkConfig = {
    transport,
    bandwidth: o.bandwidthGBps !== undefined ? o.bandwidthGBps * 1e9 : d.bandwidth,
    overheadS: o.overheadMs !== undefined ? o.overheadMs / 1000 : d.overheadS,
    handshakeS: o.handshakeS ?? d.handshakeS,
  };
  if (!(c.bandwidth > 0) || !Number.isFinite(c.bandwidth))
    throw new RangeError(`KV link bandwidth must be > 0 GB/s, got ${c.bandwidth / 1e9}`);
  if (!(c.overheadS >= 0) || !Number.isFinite(c.overheadS))
    throw new RangeError(`KV link overhead must be ≥ 0 ms, got ${c.overheadS * 1000}`);
  if (!(c.handshakeS >= 0) || !Number.isFinite(c.handshakeS))
    throw new RangeError(`KV link handshake must be ≥ 0 s, got ${c.handshakeS}`);
  return c;
}

export interface KvLinkStats {
  transfers: number;
  bytes: number;
  /** Σ (completion − request) over transfers, seconds. */
  transferSeconds: number;
  handshakes: number;
  /** Σ seconds transfers waited for a busy NIC. */
  queuedSeconds: number;
}

export class KvLink {
  readonly config: KvLinkConfig;
  /** Per decoder: when each of its NICs is free. */
  readonly #nicFreeAt = new Map<string, Float64Array>();
  /** Per "decoder→prefiller" pair: when its handshake completes. */
  readonly #pairReadyAt = new Map<string, number>();
  readonly stats: KvLinkStats = {
    transfers: 0,
    bytes: 0,
    transferSeconds: 0,
    handshakes: 0,
    queuedSeconds: 0,
  };

  constructor(config: KvLinkConfig) {
    this.config = config;
  }

  /**
   * When a transfer between the pair, asked for at `now`, may start: `now` once the pair has
   * shaken hands (or is shaking), else the handshake's end (and the handshake starts now).
   */
  readyAt(decoder: string, prefiller: string, now: number): number {
    const key = `${decoder}\u0000${prefiller}`;
    let at = this.#pairReadyAt.get(key);
    if (at === undefined) {
      at = now + this.config.handshakeS;
      this.#pairReadyAt.set(key, at);
      this.stats.handshakes++;
    }
    return Math.max(now, at);
  }

  /**
   * Starts a ready transfer of `bytes` into `decoder` at `now` (≥ its readyAt) over `lanes` of the
   * decoder's `nics` NICs (min(TP_p, TP_d) of TP_d; default one of one); returns when its KV is
   * usable on the decoder. `requestedAt` (≤ now) is when the decoder asked, for the stats.
   */
  start(decoder: string, bytes: number, now: number, requestedAt = now, lanes = 1, nics = lanes): number {
    if (!(bytes >= 0) || !Number.isFinite(bytes))
      throw new RangeError(`transfer bytes must be ≥ 0, got ${bytes}`);
    if (!(Number.isInteger(lanes) && Number.isInteger(nics) && lanes >= 1 && lanes <= nics))
      throw new RangeError(`a transfer needs 1 ≤ lanes (${lanes}) ≤ NICs (${nics})`);
    let free = this.#nicFreeAt.get(decoder);
    if (free === undefined || free.length !== nics) {
      free = new Float64Array(nics);
      this.#nicFreeAt.set(decoder, free);
    }
    // The `lanes` NICs free soonest (ties: lowest index), and when the last of them is.
    const order = Array.from(free.keys()).sort((a, b) => free[a] - free[b] || a - b);
    const use = order.slice(0, lanes);
    const begin = Math.max(now, ...use.map((k) => free[k]));
    const landed = begin + bytes / (lanes * this.config.bandwidth);
    for (const k of use) free[k] = landed;
    const done = landed + this.config.overheadS;
    const s = this.stats;
    s.transfers++;
    s.bytes += bytes;
    s.queuedSeconds += begin - now;
    s.transferSeconds += done - requestedAt;
    return done;
  }
}
