/**
 * Endpoint id → position in the candidate list, without reading every candidate on every request.
 * A plugin that knows a few endpoint ids (the prefix producer's matches) finds them here instead
 * of scanning all candidates: a cold scan of 256 candidates reads ~500 cache lines (each state
 * object and its id string), which dominates a decision right after a GC (bench:picker).
 *
 * The map is rebuilt only when the candidate list holds other objects than last time: the check
 * compares element references (the array itself, a few cache lines), never the objects. So an
 * EndpointState's id must not change while the object is in use, which the datastore guarantees
 * (one state object per endpoint, metrics updated in place).
 */
import type { EndpointState } from "./types.ts";

export class CandidateIndex {
  #last: EndpointState[] = [];
  readonly #pos = new Map<string, number>();
  /** Rebuilds, for metrics and tests. */
  rebuilds = 0;

  /** Makes lookups answer for `candidates`; cheap when they are the same objects as last time. */
  prepare(candidates: readonly EndpointState[]): void {
    const last = this.#last;
    const n = candidates.length;
    if (n === last.length) {
      let i = 0;
      while (i < n && candidates[i] === last[i]) i++;
      if (i === n) return;
    }
    this.rebuilds++;
    this.#pos.clear();
    this.#last = candidates.slice();
    // First occurrence wins, as a scan from the front would find it.
    for (let i = n - 1; i >= 0; i--) this.#pos.set(candidates[i].id, i);
  }

  /** Position of `endpointId` in the prepared candidates, or −1. */
  indexOf(endpointId: string): number {
    return this.#pos.get(endpointId) ?? -1;
  }
}
