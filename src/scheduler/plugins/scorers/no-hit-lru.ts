/**
 * no-hit-lru-scorer (llm-d/llm-d-router@ebab6879 `pkg/epp/framework/plugins/scheduling/scorer/`): spreads
 * cache-cold requests. If any candidate holds
 * part of the prefix ("warm"), every candidate scores 0.5 (neutral). Otherwise candidates are
 * ranked never-used first (in candidate order), then used ones from least to most recently used,
 * and rank p scores 1 − p/(N−1). After the pick, a cold request's endpoint (and the `prefill`
 * profile's) moves to most recently used. Keeps at most lruSize endpoints.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import { ScoreBuffer } from "../../scores.ts";
import type {
  CycleState,
  DataKey,
  EndpointState,
  PreRequestHook,
  ScheduleResult,
  Scorer,
  TypedName,
} from "../../types.ts";
import type { PrefixMatchInfo } from "../data.ts";
import { prefixKey } from "../data.ts";
import { PREFILL_PROFILE } from "../prefix/producer.ts";

export const noHitLruParams = z.strictObject({
  lruSize: z.number().int().positive().default(1024),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});

export class NoHitLruScorer implements Scorer, PreRequestHook {
  readonly typedName: TypedName;
  readonly category = "distribution" as const;
  readonly #key: DataKey<PrefixMatchInfo>;
  /** endpoint id → last-use sequence; Map order is oldest first. */
  readonly #lru = new Map<string, number>();
  #seq = 0;

  constructor(
    name: string,
    readonly params: z.output<typeof noHitLruParams>,
  ) {
    this.typedName = { type: "no-hit-lru-scorer", name };
    this.#key = prefixKey(params.prefixMatchInfoProducerName as string);
  }

  consumes() {
    return { required: [this.#key] };
  }

  readonly #out = new ScoreBuffer();

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const n = endpoints.length;
    const out = this.#out.get(n);
    const info = cycle.get(this.#key);
    if (info?.anyMatch) return out.fill(0.5);
    if (n === 1) return out.fill(1);
    const used: number[] = [];
    let p = 0;
    for (let i = 0; i < n; i++) {
      if (this.#lru.has(endpoints[i].id)) used.push(i);
      else out[i] = 1 - p++ / (n - 1);
    }
    used.sort(
      (a, b) => (this.#lru.get(endpoints[a].id) as number) - (this.#lru.get(endpoints[b].id) as number),
    );
    for (const i of used) out[i] = 1 - p++ / (n - 1);
    return out;
  }

  preRequest(cycle: CycleState, result: ScheduleResult): void {
    if (cycle.get(this.#key)?.anyMatch) return;
    const ids = [result.target?.id, result.profiles[PREFILL_PROFILE]?.target?.id];
    for (const id of ids) {
      if (id === undefined) continue;
      this.#lru.delete(id);
      this.#lru.set(id, ++this.#seq);
      if (this.#lru.size > this.params.lruSize) this.#lru.delete(this.#lru.keys().next().value as string);
    }
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const id of [...this.#lru.keys()]) if (!pool.has(id)) this.#lru.delete(id);
  }
}

export const noHitLruSpec = spec({
  type: "no-hit-lru-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Spreads cache-cold requests: never-used endpoints first, then least recently used.",
  params: noHitLruParams,
  needs: () => [{ family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true }],
  factory: (name, p) => new NoHitLruScorer(name, p),
});
