/** The per-request CycleState: typed scratch shared by producers and scheduling plugins. */
import { CandidateIndex } from "./candidate-index.ts";
import type { Rng } from "./rng.ts";
import type { CycleState, DataKey, EndpointState, ProfileResult, RequestFacts } from "./types.ts";

export class Cycle implements CycleState {
  readonly #data = new Map<string, unknown>();
  readonly profileResults = new Map<string, ProfileResult>();
  readonly #index: CandidateIndex;
  #prepared = false;

  constructor(
    readonly request: RequestFacts,
    readonly candidates: readonly EndpointState[],
    readonly now: number,
    readonly rng: Rng,
    /** Shared across cycles by the scheduler, so an unchanged candidate list is not re-indexed. */
    index: CandidateIndex = new CandidateIndex(),
  ) {
    this.#index = index;
  }

  candidateIndexOf(endpointId: string): number {
    if (!this.#prepared) {
      this.#index.prepare(this.candidates);
      this.#prepared = true;
    }
    return this.#index.indexOf(endpointId);
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
