/**
 * Endpoint id → position in an endpoint list, without reading every endpoint on every request.
 * A plugin that knows a few endpoint ids (the prefix producer's matches) finds them here instead
 * of scanning all candidates: a cold scan of 256 candidates reads ~500 cache lines (each state
 * object and its id string), which dominates a decision right after a GC (bench:picker).
 *
 * An index is rebuilt only when its list holds other objects than last time: the check compares
 * element references (the array itself, a few cache lines), never the objects. So an
 * EndpointState's id must not change while the object is in use, which the datastore guarantees
 * (one state object per endpoint, metrics updated in place).
 */
import type { EndpointPositions, EndpointState } from "./types.ts";

export class CandidateIndex implements EndpointPositions {
  #last: EndpointState[] = [];
  readonly #pos = new Map<string, number>();
  /** Rebuilds so far: the positions' version. */
  rebuilds = 0;

  get version(): number {
    return this.rebuilds;
  }

  /** Makes lookups answer for `list`; cheap when it holds the same objects as last time. */
  prepare(list: readonly EndpointState[]): void {
    const last = this.#last;
    const n = list.length;
    if (n === last.length) {
      let i = 0;
      while (i < n && list[i] === last[i]) i++;
      if (i === n) return;
    }
    this.rebuilds++;
    this.#pos.clear();
    this.#last = list.slice();
    for (let i = n - 1; i >= 0; i--) this.#pos.set(list[i].id, i);
  }

  /** Position of `endpointId` in the prepared list, or −1. */
  indexOf(endpointId: string): number {
    return this.#pos.get(endpointId) ?? -1;
  }
}

/**
 * The scheduler's indexes, kept across requests: one for the candidate lists handed to
 * schedule(), and one per other list object seen twice, such as a filter's cached output (a
 * role filter returns the same array while the pool is unchanged). A list seen once gets none,
 * so per-request arrays cost a WeakMap entry, not an index build.
 */
export class IndexCache {
  readonly candidates = new CandidateIndex();
  readonly #lists = new WeakMap<readonly EndpointState[], CandidateIndex | null>();

  /** An index of `list` (prepared), or null the first time this array object is seen. */
  of(list: readonly EndpointState[]): CandidateIndex | null {
    const ix = this.#lists.get(list);
    if (ix === undefined) {
      this.#lists.set(list, null);
      return null;
    }
    if (ix === null) {
      const fresh = new CandidateIndex();
      fresh.prepare(list);
      this.#lists.set(list, fresh);
      return fresh;
    }
    ix.prepare(list);
    return ix;
  }
}
