/**
 * InferenceModelRewrite resolution (llm-d.ai/v1alpha2, llm-d/llm-d-router@ebab6879
 * `apix/v1alpha2/inferencemodelrewrite_types.go`): which model a request for `model` is sent to.
 * Precedence as llm-d's datastore applies it: a rule naming the model exactly beats a generic rule
 * (empty `matches`) in any resource; among resources with a matching rule the oldest
 * (creationTimestamp) wins, then the name; within one resource the first matching rule in list order.
 * The target is drawn by weight (uniform when no weights are set) with the caller's seeded rng.
 * Pure: no clock, no globals.
 *
 * llm-d also reads an `x-llm-d-model-name-rewrite` request header as the starting target
 * (`pkg/epp/requestcontrol/director.go`); kvgate does not, because a client header must never steer
 * routing, and the ext_proc server removes that header before the request reaches a replica.
 */
import type { ModelRewrite, ModelRewriteRule } from "../datalayer/pool-resources.ts";

export interface RewriteDecision {
  /** The InferenceModelRewrite's metadata.name (metric label `model_rewrite_name`). */
  readonly rewriteName: string;
  /** The model the client asked for. */
  readonly model: string;
  /** The model the request is sent to (may equal `model` when a target names it). */
  readonly target: string;
}

function byAge(a: ModelRewrite, b: ModelRewrite): number {
  return a.createdAtMs - b.createdAtMs || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
}

function firstRule(rw: ModelRewrite, pred: (r: ModelRewriteRule) => boolean): ModelRewriteRule | undefined {
  for (const r of rw.rules) if (r.targets.length > 0 && pred(r)) return r;
  return undefined;
}

/** One target of a rule: weighted by `weight` when every target has one, else uniform. */
export function pickTarget(rule: ModelRewriteRule, rng: () => number): string {
  const ts = rule.targets;
  if (ts.length === 1) return ts[0].model;
  const weighted = ts.every((t) => t.weight !== null && t.weight > 0);
  if (!weighted) return ts[Math.min(ts.length - 1, Math.floor(rng() * ts.length))].model;
  let total = 0;
  for (const t of ts) total += t.weight as number;
  let x = rng() * total;
  for (const t of ts) {
    x -= t.weight as number;
    if (x < 0) return t.model;
  }
  return ts[ts.length - 1].model;
}

/** The resource and rule that apply to `model` by the precedence above, or null. */
export function findRewriteRule(
  rewrites: readonly ModelRewrite[],
  model: string,
): { rewrite: ModelRewrite; rule: ModelRewriteRule } | null {
  if (rewrites.length === 0) return null;
  const ordered = [...rewrites].sort(byAge);
  for (const generic of [false, true]) {
    for (const rw of ordered) {
      const rule = firstRule(rw, (r) => (generic ? r.matches.length === 0 : r.matches.includes(model)));
      if (rule) return { rewrite: rw, rule };
    }
  }
  return null;
}

/** The rewrite that applies to `model`, or null when no rule matches it. */
export function resolveModelRewrite(
  rewrites: readonly ModelRewrite[],
  model: string,
  rng: () => number,
): RewriteDecision | null {
  const found = findRewriteRule(rewrites, model);
  return found ? { rewriteName: found.rewrite.name, model, target: pickTarget(found.rule, rng) } : null;
}
