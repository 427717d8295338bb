/**
 * Where requests went, per endpoint, for the admin API's GET /endpoints: how many requests the
 * gateway sent to each endpoint, how many of those were failover retries (an earlier endpoint had
 * failed the same request before its first byte), and how many failed there before the first byte.
 * Counts live as long as the endpoint is in the pool.
 */

export interface EndpointTraffic {
  /** Requests sent to this endpoint: first choices and failover retries alike. */
  requests: number;
  /** Of those, requests this endpoint got because another one failed them first. */
  retries: number;
  /** Requests that failed here before the first response byte (each moved on, or ended in a 503). */
  failures: number;
}

export class TrafficCounts {
  readonly #byEndpoint = new Map<string, EndpointTraffic>();

  #of(id: string): EndpointTraffic {
    let t = this.#byEndpoint.get(id);
    if (!t) {
      t = { requests: 0, retries: 0, failures: 0 };
      this.#byEndpoint.set(id, t);
    }
    return t;
  }

  /** A request is being sent to `id`; `attempt` > 0 means it is a failover retry. */
  attempt(id: string, attempt: number): void {
    const t = this.#of(id);
    t.requests++;
    if (attempt > 0) t.retries++;
  }

  failure(id: string): void {
    this.#of(id).failures++;
  }

  /** A copy of the counts for `id` (zeros when nothing was sent there yet). */
  get(id: string): EndpointTraffic {
    const t = this.#byEndpoint.get(id);
    return t ? { ...t } : { requests: 0, retries: 0, failures: 0 };
  }

  /** Forgets endpoints that left the pool. */
  retain(ids: ReadonlySet<string>): void {
    for (const id of this.#byEndpoint.keys()) if (!ids.has(id)) this.#byEndpoint.delete(id);
  }
}
