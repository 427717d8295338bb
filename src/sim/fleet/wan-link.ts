/**
 * The links between regions in the fleet simulator, pure: how long a prefill/decode KV transfer
 * takes when the decoder and its prefiller sit in different regions (locality.ts).
 *
 * Model: one link per pair of regions, both directions sharing it, first come first served at the
 * scenario's `bandwidthGbps` for that pair; a transfer's bytes land one round trip after they are
 * on the wire (the decoder pulls: its read request crosses first, then the data). The transfer also
 * crosses the decoder's NICs (kv-link.ts); the two run pipelined, so the slower of them paces it.
 * A pair without a bandwidth pays the round trip only.
 */

export interface WanStats {
  transfers: number;
  bytes: number;
  /** Σ seconds transfers waited for the link behind earlier ones. */
  queuedSeconds: number;
}

export class WanLink {
  /** Per unordered region pair: when the link is next free. */
  readonly #freeAt = new Map<string, number>();
  readonly stats: WanStats = { transfers: 0, bytes: 0, queuedSeconds: 0 };

  constructor(
    /** Bytes/s per "a\0b" (both orders); a pair without an entry is not bandwidth-limited. */
    readonly bandwidth: ReadonlyMap<string, number>,
    /** One-way seconds per "a\0b" (both orders). */
    readonly oneWay: ReadonlyMap<string, number>,
  ) {}

  /** When `bytes` pulled at `now` from region `from` into region `to` have landed. */
  transfer(from: string, to: string, bytes: number, now: number): number {
    const pair = from < to ? `${from}\u0000${to}` : `${to}\u0000${from}`;
    const rtt = 2 * (this.oneWay.get(`${from}\u0000${to}`) ?? 0);
    const bw = this.bandwidth.get(`${from}\u0000${to}`);
    this.stats.transfers++;
    this.stats.bytes += bytes;
    if (bw === undefined) return now + rtt;
    const start = Math.max(now, this.#freeAt.get(pair) ?? now);
    this.stats.queuedSeconds += start - now;
    const end = start + bytes / bw;
    this.#freeAt.set(pair, end);
    return end + rtt;
  }
}
