/**
 * The prefill reserve's bookkeeping (pure): which endpoints have a long prefill pending, as the
 * gateway sees it. A dispatched request whose prompt is long (vtc-fairness-policy's
 * `longPrefillTokens`) is pending from its dispatch until its first token comes back (or it ends
 * without one: failure, disconnect); first unplaced, then on the endpoint the scheduler picked.
 * flow-control.ts reads `free()` to keep `prefillReserve` endpoints free of long prefills for
 * flows that have none in flight: a step cannot be interrupted, so a short request that lands on a
 * replica prefilling a long prompt waits for that whole step (about 65 ms for 2,400 tokens of
 * Llama-3.1-8B on an H100), while one that lands on a replica with only decodes waits one decode
 * step.
 */

export interface PendingPrefill {
  fairnessId: string;
  priority: number;
}

interface Entry extends PendingPrefill {
  endpoint: string | null;
}

export class PrefillTracker {
  readonly #pending = new Map<string, Entry>();
  /** Long prefills pending per endpoint (entries > 0 only). */
  readonly #perEndpoint = new Map<string, number>();
  #unplaced = 0;

  /** Long prefills pending (placed or not). */
  get size(): number {
    return this.#pending.size;
  }

  /** A long request was dispatched: pending, not yet on an endpoint. */
  dispatched(id: string, flow: PendingPrefill): void {
    if (this.#pending.has(id)) return;
    this.#pending.set(id, { ...flow, endpoint: null });
    this.#unplaced++;
  }

  /** The scheduler picked `endpoint` for it (false: not a pending long prefill). */
  placed(id: string, endpoint: string): boolean {
    const e = this.#pending.get(id);
    if (e === undefined) return false;
    if (e.endpoint === null) this.#unplaced--;
    else this.#bump(e.endpoint, -1);
    e.endpoint = endpoint;
    this.#bump(endpoint, 1);
    return true;
  }

  /** Its first token came back, or it ended without one: no longer pending. Its flow, if it was. */
  ended(id: string): PendingPrefill | undefined {
    const e = this.#pending.get(id);
    if (e === undefined) return undefined;
    this.#pending.delete(id);
    if (e.endpoint === null) this.#unplaced--;
    else this.#bump(e.endpoint, -1);
    return { fairnessId: e.fairnessId, priority: e.priority };
  }

  /**
   * How many of `endpoints` are free of long prefills, less one for each dispatched long request
   * not yet placed (it may still take a free one); never below 0.
   */
  free(endpoints: readonly string[]): number {
    let free = 0;
    for (const id of endpoints) if (!this.#perEndpoint.has(id)) free++;
    return Math.max(0, free - this.#unplaced);
  }

  #bump(endpoint: string, d: number): void {
    const n = (this.#perEndpoint.get(endpoint) ?? 0) + d;
    if (n > 0) this.#perEndpoint.set(endpoint, n);
    else this.#perEndpoint.delete(endpoint);
  }
}
