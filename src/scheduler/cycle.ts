/** The per-request CycleState: typed scratch shared by producers and scheduling plugins. */
import { IndexCache } from "./candidate-index.ts";
import type { Rng } from "./rng.ts";
import type {
  CycleState,
  DataKey,
  EndpointPositions,
  EndpointState,
  ProfileResult,
  RequestFacts,
} from "./types.ts";

export class Cycle implements CycleState {
  readonly #data = new Map<string, unknown>();
  readonly profileResults = new Map<string, ProfileResult>();
  readonly #indexes: IndexCache;
  #prepared = false;

  constructor(
    readonly request: RequestFacts,
    readonly candidates: readonly EndpointState[],
    readonly now: number,
    readonly rng: Rng,
    /** Shared across cycles by the scheduler, so unchanged endpoint lists are not re-indexed. */
    indexes: IndexCache = new IndexCache(),
  ) {
    this.#indexes = indexes;
  }

  positions(endpoints: readonly EndpointState[]): EndpointPositions | null {
    if (endpoints !== this.candidates) return endpoints.length > 16 ? this.#indexes.of(endpoints) : null;
    const ix = this.#indexes.candidates;
    if (!this.#prepared) {
      ix.prepare(endpoints);
      this.#prepared = true;
    }
    return ix;
  }

  get<T>(key: DataKey<T>): T | undefined {
    return this.#data.get(key.name) as T | undefined;
  }

  set<T>(key: DataKey<T>, value: T): void {
    this.#data.set(key.name, value);
  }

  memo<T>(key: DataKey<T>, compute: () => T): T {
    if (this.#data.has(key.name)) return this.#data.get(key.name) as T;
    const v = compute();
    this.#data.set(key.name, v);
    return v;
  }
}
