/**
 * Placeholder offload events the precise index cannot place yet: vLLM's CPU BlockStored without
 * token ids names an engine hash the index learns only from the GPU BlockStored, which may arrive
 * later (a separate storage publisher, a replay). Held per (endpoint, hash) with the tier bits and
 * the chunk span, oldest dropped first beyond `max`. Pure.
 */
export class HeldPlaceholders {
  /** "endpoint,hash" → tier bits (low 8) | span << 8, in insertion order (oldest first). */
  private readonly m = new Map<string, number>();
  /** Entries dropped to stay within max. */
  dropped = 0;

  constructor(readonly max: number) {
    if (!(Number.isInteger(max) && max >= 0))
      throw new RangeError(`maxHeldPlaceholders must be an integer ≥ 0, got ${max}`);
  }

  get size(): number {
    return this.m.size;
  }

  /** Holds tier `bit` of (ep, h) as the newest entry. */
  add(ep: number, h: bigint, bit: number, span: number): void {
    const k = `${ep},${h}`;
    const v = this.m.get(k);
    this.m.delete(k);
    this.m.set(k, ((v ?? 0) & 0xff) | bit | (span << 8));
    if (this.m.size > this.max) {
      this.m.delete(this.m.keys().next().value as string);
      this.dropped++;
    }
  }

  /** Removes and returns (ep, h)'s entry: { bits, span }, or null. */
  take(ep: number, h: bigint): { bits: number; span: number } | null {
    if (this.m.size === 0) return null;
    const k = `${ep},${h}`;
    const v = this.m.get(k);
    if (v === undefined) return null;
    this.m.delete(k);
    return { bits: v & 0xff, span: v >>> 8 };
  }

  /** Clears tier `bit` of (ep, h); true if it was held. */
  cancel(ep: number, h: bigint, bit: number): boolean {
    if (this.m.size === 0) return false;
    const k = `${ep},${h}`;
    const v = this.m.get(k);
    if (v === undefined || (v & bit) === 0) return false;
    if ((v & 0xff & ~bit) === 0) this.m.delete(k);
    else this.m.set(k, v & ~bit);
    return true;
  }

  /** Drops every entry of an endpoint. */
  dropEndpoint(ep: number): void {
    if (this.m.size === 0) return;
    const pre = `${ep},`;
    for (const k of [...this.m.keys()]) if (k.startsWith(pre)) this.m.delete(k);
  }

  clear(): void {
    this.m.clear();
  }
}
