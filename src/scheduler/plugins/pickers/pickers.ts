/**
 * Pickers (llm-d/llm-d-router@ebab6879 `pkg/epp/framework/plugins/scheduling/picker/`) plus the kvgate
 * round-robin baseline.
 *   max-score-picker       highest score; ties broken uniformly at random (llm-d: shuffle, then
 *                          stable sort by score); returns the top maxNumOfEndpoints
 *   random-picker          uniform random, top maxNumOfEndpoints of a shuffle
 *   weighted-random-picker A-Res: key = U^(1/score), score ≤ 0 → key 0; all ≤ 0 → uniform
 *   round-robin-picker     kvgate-only: the next candidate id after the last pick, in id order,
 *                          ignoring scores
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { Rng } from "../../rng.ts";
import { shuffleInPlace } from "../../rng.ts";
import { ScoreBuffer } from "../../scores.ts";
import type { CycleState, EndpointState, Picker, TypedName } from "../../types.ts";

export const pickerParams = z.strictObject({ maxNumOfEndpoints: z.number().int().positive().default(1) });
type PickerParams = z.output<typeof pickerParams>;

function indices(n: number): number[] {
  const a = new Array<number>(n);
  for (let i = 0; i < n; i++) a[i] = i;
  return a;
}

export class MaxScorePicker implements Picker {
  readonly typedName: TypedName;

  constructor(
    name: string,
    readonly params: PickerParams,
  ) {
    this.typedName = { type: "max-score-picker", name };
  }

  pick(cycle: CycleState, endpoints: readonly EndpointState[], scores: Float64Array): number[] {
    const n = endpoints.length;
    if (n === 0) return [];
    if (this.params.maxNumOfEndpoints === 1) return [argmaxRandomTie(cycle.rng, scores, n)];
    const order = shuffleInPlace(cycle.rng, indices(n));
    order.sort((a, b) => scores[b] - scores[a]);
    return order.slice(0, this.params.maxNumOfEndpoints);
  }
}

/**
 * Argmax with a uniform choice among ties (same law as llm-d's shuffle + stable sort): one pass
 * for the maximum and its count, then one draw only if it is shared. With 256 idle endpoints
 * all tied, a draw per tie (reservoir sampling) cost ~2 µs.
 */
export function argmaxRandomTie(rng: Rng, scores: ArrayLike<number>, n: number): number {
  let best = scores[0];
  let first = 0;
  let ties = 1;
  for (let i = 1; i < n; i++) {
    const s = scores[i];
    if (s > best) {
      best = s;
      first = i;
      ties = 1;
    } else if (s === best) ties++;
  }
  if (ties === 1) return first;
  let k = rng.int(ties);
  for (let i = first; i < n; i++) if (scores[i] === best && k-- === 0) return i;
  return first;
}

export class RandomPicker implements Picker {
  readonly typedName: TypedName;

  constructor(
    name: string,
    readonly params: PickerParams,
  ) {
    this.typedName = { type: "random-picker", name };
  }

  pick(cycle: CycleState, endpoints: readonly EndpointState[]): number[] {
    const n = endpoints.length;
    if (n === 0) return [];
    if (this.params.maxNumOfEndpoints === 1) return [cycle.rng.int(n)];
    return shuffleInPlace(cycle.rng, indices(n)).slice(0, this.params.maxNumOfEndpoints);
  }
}

export class WeightedRandomPicker implements Picker {
  readonly typedName: TypedName;
  readonly #keys = new ScoreBuffer();

  constructor(
    name: string,
    readonly params: PickerParams,
  ) {
    this.typedName = { type: "weighted-random-picker", name };
  }

  pick(cycle: CycleState, endpoints: readonly EndpointState[], scores: Float64Array): number[] {
    const n = endpoints.length;
    if (n === 0) return [];
    let anyPositive = false;
    for (let i = 0; i < n; i++) if (scores[i] > 0) anyPositive = true;
    if (!anyPositive) return new RandomPicker(this.typedName.name, this.params).pick(cycle, endpoints);
    const keys = this.#keys.get(n);
    for (let i = 0; i < n; i++) keys[i] = scores[i] > 0 ? cycle.rng.next() ** (1 / scores[i]) : 0;
    if (this.params.maxNumOfEndpoints === 1) return [argmaxRandomTie(cycle.rng, keys, n)];
    return indices(n)
      .sort((a, b) => keys[b] - keys[a])
      .slice(0, this.params.maxNumOfEndpoints);
  }
}

export class RoundRobinPicker implements Picker {
  readonly typedName: TypedName;
  #last: string | null = null;

  constructor(name: string) {
    this.typedName = { type: "round-robin-picker", name };
  }

  pick(_cycle: CycleState, endpoints: readonly EndpointState[]): number[] {
    const n = endpoints.length;
    if (n === 0) return [];
    let next = -1;
    let first = 0;
    for (let i = 0; i < n; i++) {
      const id = endpoints[i].id;
      if (id < endpoints[first].id) first = i;
      if (this.#last !== null && id > this.#last && (next < 0 || id < endpoints[next].id)) next = i;
    }
    const chosen = next < 0 ? first : next;
    this.#last = endpoints[chosen].id;
    return [chosen];
  }
}

export const maxScorePickerSpec = spec({
  type: "max-score-picker",
  stability: "stable",
  kind: "picker",
  summary: "Highest total score, random among ties.",
  params: pickerParams,
  factory: (name, p) => new MaxScorePicker(name, p),
});

export const randomPickerSpec = spec({
  type: "random-picker",
  stability: "stable",
  kind: "picker",
  summary: "Uniformly random, ignoring scores.",
  params: pickerParams,
  factory: (name, p) => new RandomPicker(name, p),
});

export const weightedRandomPickerSpec = spec({
  type: "weighted-random-picker",
  stability: "stable",
  kind: "picker",
  summary: "Random with probability weighted by score (A-Res reservoir sampling).",
  params: pickerParams,
  factory: (name, p) => new WeightedRandomPicker(name, p),
});

export const roundRobinPickerSpec = spec({
  type: "round-robin-picker",
  stability: "stable",
  kind: "picker",
  kvgateOnly: true,
  summary: "kvgate baseline: cycles through candidates in endpoint-id order, ignoring scores.",
  params: z.strictObject({}),
  factory: (name) => new RoundRobinPicker(name),
});
