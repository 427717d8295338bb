/**
 * The multi-pool step of a decision: the model a request asks for → InferenceModelRewrite (rename or
 * weighted split, model-rewrite.ts) → the pool serving the target model. A pool's declared models
 * are a Map lookup; a pool without declared models is asked whether one of its replicas lists the
 * model (`learned`), in pools-file order. Pure: no sockets or clocks; the rng is the caller's.
 *
 * A weighted split draws each rule's targets from its own low-discrepancy sequence (golden-ratio
 * steps from a start the seeded rng draws): every draw is uniform on [0, 1) over the start, as an
 * independent draw is, but the shares over any n requests stay within a few requests of the weights
 * instead of wandering by ±√n (independent draws miss a 70/30 split by more than 2 points over 1,000
 * requests about one time in six).
 *
 * Costs (bench:picker): rewrites are resolved once per source model at construction (the pools file
 * is static), so a request's rewrite is a Map lookup; a learned model's pool is remembered after the
 * first scan until forgetLearned() (the front door calls it every second, so a model that moves
 * between pools is followed within about a second).
 */
import type { ModelRewrite, ModelRewriteRule } from "../../datalayer/pool-resources.ts";
import { findRewriteRule, pickTarget, type RewriteDecision } from "../model-rewrite.ts";

const GOLDEN = (Math.sqrt(5) - 1) / 2;

export interface RoutedPool<P> {
  readonly pool: P;
  /** The model sent to the pool (after any rewrite). */
  readonly model: string;
  readonly rewrite: RewriteDecision | null;
}

type Found = NonNullable<ReturnType<typeof findRewriteRule>>;

export interface PoolEntry<P> {
  readonly name: string;
  readonly pool: P;
  /** Declared models, or null: ask `learned`. */
  readonly models: readonly string[] | null;
}

export class PoolRouter<P> {
  readonly #declared = new Map<string, P>();
  readonly #byName = new Map<string, P>();
  readonly #learning: Array<PoolEntry<P>>;
  readonly #rewrites: readonly ModelRewrite[];
  readonly #learned: (pool: P, model: string) => boolean;
  readonly #sequences = new WeakMap<ModelRewriteRule, () => number>();
  /** Source model → its resource and rule; `#generic` for every other model. */
  readonly #rules = new Map<string, Found>();
  readonly #generic: Found | null;
  readonly #learnedCache = new Map<string, P>();

  constructor(
    entries: ReadonlyArray<PoolEntry<P>>,
    rewrites: readonly ModelRewrite[],
    learned: (pool: P, model: string) => boolean,
  ) {
    for (const e of entries) {
      this.#byName.set(e.name, e.pool);
      for (const m of e.models ?? []) if (!this.#declared.has(m)) this.#declared.set(m, e.pool);
    }
    this.#learning = entries.filter((e) => e.models === null);
    this.#rewrites = rewrites;
    this.#learned = learned;
    for (const rw of rewrites)
      for (const r of rw.rules)
        for (const m of r.matches)
          if (!this.#rules.has(m)) this.#rules.set(m, findRewriteRule(rewrites, m) as Found);
    // A name no exact rule lists finds the generic rule, if any.
    this.#generic = findRewriteRule(rewrites, "\u0000");
  }

  /** Drops the remembered pools of learned models (the replicas' lists may have changed). */
  forgetLearned(): void {
    this.#learnedCache.clear();
  }

  /** The pool named `name`, or undefined. */
  byName(name: string): P | undefined {
    return this.#byName.get(name);
  }

  /** The pool that serves `model` (no rewrite), or null. */
  poolOf(model: string): P | null {
    const p = this.#declared.get(model);
    if (p !== undefined) return p;
    const known = this.#learnedCache.get(model);
    if (known !== undefined) return known;
    for (const e of this.#learning)
      if (this.#learned(e.pool, model)) {
        if (this.#learnedCache.size < 10_000) this.#learnedCache.set(model, e.pool);
        return e.pool;
      }
    return null;
  }

  /** The rewrite for `model` (null when none applies). */
  rewrite(model: string, rng: () => number): RewriteDecision | null {
    if (this.#rewrites.length === 0) return null;
    const found = this.#rules.get(model) ?? this.#generic;
    if (!found) return null;
    const { rule } = found;
    let next = this.#sequences.get(rule);
    if (!next) {
      let x = rng();
      next = () => {
        x += GOLDEN;
        if (x >= 1) x -= 1;
        return x;
      };
      this.#sequences.set(rule, next);
    }
    return { rewriteName: found.rewrite.name, model, target: pickTarget(rule, next) };
  }

  /** model → rewrite → pool; null when no pool serves the (rewritten) model. */
  route(model: string, rng: () => number): RoutedPool<P> | null {
    const rewrite = this.rewrite(model, rng);
    const target = rewrite?.target ?? model;
    const pool = this.poolOf(target);
    return pool === null ? null : { pool, model: target, rewrite };
  }

  /** The source model names of exact-match rewrite rules (what a client may ask for besides served models). */
  rewriteSources(): string[] {
    const out = new Set<string>();
    for (const rw of this.#rewrites) for (const r of rw.rules) for (const m of r.matches) out.add(m);
    return [...out];
  }
}
