/**
 * What a pool's Kubernetes resources tell the router besides its endpoints: InferenceObjective
 * priorities (llm-d.ai/v1alpha2, legacy inference.networking.x-k8s.io/v1alpha2) and
 * InferenceModelRewrite rules (llm-d.ai/v1alpha2, llm-d/llm-d-router
 * `apix/v1alpha2/inferencemodelrewrite_types.go`). Kubernetes discovery produces these; the
 * ext_proc server and the proxy consume them. Types only, so neither side imports the other.
 */

/** One InferenceModelRewrite rule: the first rule (in list order) whose matches hit wins. */
export interface ModelRewriteRule {
  /** Exact model names; empty = matches every model (a generic rule, beaten by any exact match). */
  readonly matches: readonly string[];
  /** At least one; weights all set or all absent (absent = uniform). Share = weight / Σ weight. */
  readonly targets: ReadonlyArray<{ readonly model: string; readonly weight: number | null }>;
}

/** One InferenceModelRewrite resource. */
export interface ModelRewrite {
  /** metadata.name, for metrics (`model_rewrite_name`). */
  readonly name: string;
  /** metadata.creationTimestamp in ms since the epoch: across resources the oldest wins a tie. */
  readonly createdAtMs: number;
  readonly rules: readonly ModelRewriteRule[];
}

/** The current view of the pool's objectives and rewrites; replaced wholesale on every change. */
export interface PoolResources {
  /** InferenceObjective metadata.name → spec.priority (unset = 0). */
  readonly objectives: ReadonlyMap<string, number>;
  readonly rewrites: readonly ModelRewrite[];
}
