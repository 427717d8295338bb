/**
 * Leases on a P/D producer's held KV blocks (vLLM v0.22+ NixlConnector, design doc
 * docs/design/nixl_kv_cache_lease.md, PR vllm-project/vllm#41383): a finished prefill's blocks are
 * held for `duration` seconds (kv_connector_extra_config.kv_lease_duration, default 30); while the
 * consumer still has the request queued it heartbeats every duration // 6 seconds, and each
 * heartbeat sets the expiry to max(old expiry, now + duration * 2 // 3). A lease that runs out frees
 * the blocks (the caller does, and counts vllm:nixl_num_kv_expired_reqs). Pure: `now` is passed in.
 */

export const DEFAULT_KV_LEASE_SECONDS = 30;

/** vLLM's integer arithmetic for integral durations; fractions (short test leases) scale exactly. */
function intOr(x: number, exact: boolean): number {
  return exact ? Math.floor(x) : x;
}

export class KvLeases {
  readonly duration: number;
  /** How far a heartbeat pushes the expiry past its arrival (vLLM lease_duration * 2 // 3). */
  readonly extension: number;
  /** How often a consumer heartbeats (vLLM lease_duration // 6; at least a sixth when that is 0). */
  readonly heartbeatInterval: number;
  private readonly expiry = new Map<string, number>();

  constructor(duration = DEFAULT_KV_LEASE_SECONDS) {
    if (!(Number.isFinite(duration) && duration > 0))
      throw new RangeError(`kv_lease_duration must be a number of seconds > 0, got ${duration}`);
    const integral = Number.isInteger(duration);
    this.duration = duration;
    this.extension = intOr((duration * 2) / 3, integral) || (duration * 2) / 3;
    this.heartbeatInterval = intOr(duration / 6, integral) || duration / 6;
  }

  /** Starts the lease of `id` at `now`; returns its expiry. */
  grant(id: string, now: number): number {
    const at = now + this.duration;
    this.expiry.set(id, at);
    return at;
  }

  /** A heartbeat for `id` at `now`: expiry = max(old, now + extension). False if `id` holds no lease. */
  renew(id: string, now: number): boolean {
    const old = this.expiry.get(id);
    if (old === undefined) return false;
    this.expiry.set(id, Math.max(old, now + this.extension));
    return true;
  }

  /** Ends the lease of `id` (blocks read or released). False if it held none. */
  delete(id: string): boolean {
    return this.expiry.delete(id);
  }

  has(id: string): boolean {
    return this.expiry.has(id);
  }

  expiresAt(id: string): number | undefined {
    return this.expiry.get(id);
  }

  get size(): number {
    return this.expiry.size;
  }

  /** Removes and returns the leases that ran out at or before `now`. */
  takeExpired(now: number): string[] {
    const out: string[] = [];
    for (const [id, at] of this.expiry)
      if (at <= now) {
        out.push(id);
        this.expiry.delete(id);
      }
    return out;
  }

  /** The earliest expiry, or null without leases (the caller's next wake-up). */
  nextExpiry(): number | null {
    let min: number | null = null;
    for (const at of this.expiry.values()) if (min === null || at < min) min = at;
    return min;
  }

  /** Ids holding a lease, oldest grant first. */
  ids(): string[] {
    return [...this.expiry.keys()];
  }
}
