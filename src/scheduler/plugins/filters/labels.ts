/**
 * Label filters (llm-d/llm-d-router@ebab6879 `pkg/epp/framework/plugins/scheduling/filter/bylabel/`): role
 * filters on the
 * `llm-d.ai/role` label and label-selector-filter with Kubernetes matchLabels/matchExpressions.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { CycleState, EndpointState, Filter, TypedName } from "../../types.ts";

export const ROLE_LABEL = "llm-d.ai/role";

/**
 * The last input and output of a label filter. A label filter's answer depends only on the
 * endpoints and their labels objects, so while the pool is unchanged it returns the same array
 * object: no per-request filtering of every endpoint, and later plugins can keep positions for it
 * (CycleState.positions). The datastore replaces an endpoint's labels object when labels change.
 */
class LastResult {
  #in: readonly EndpointState[] = [];
  #labels: Record<string, string>[] = [];
  #out: readonly EndpointState[] | null = null;

  get(endpoints: readonly EndpointState[], keep: (e: EndpointState) => boolean): readonly EndpointState[] {
    const n = endpoints.length;
    const last = this.#in;
    const labels = this.#labels;
    if (this.#out !== null && n === last.length) {
      let i = 0;
      while (i < n && endpoints[i] === last[i] && endpoints[i].labels === labels[i]) i++;
      if (i === n) return this.#out;
    }
    const out = endpoints.filter(keep);
    this.#in = endpoints.slice();
    this.#labels = endpoints.map((e) => e.labels);
    this.#out = out;
    return out;
  }
}

/** Keeps endpoints whose label value is in `values` (and unlabelled ones if `allowUnlabelled`). */
export class ByLabelFilter implements Filter {
  readonly typedName: TypedName;
  readonly #values: ReadonlySet<string>;

  constructor(
    type: string,
    name: string,
    readonly label: string,
    readonly allowUnlabelled: boolean,
    values: readonly string[],
  ) {
    this.typedName = { type, name };
    this.#values = new Set(values);
  }

  readonly #last = new LastResult();
  readonly #keep = (e: EndpointState): boolean => {
    const v = e.labels[this.label];
    return v === undefined ? this.allowUnlabelled : this.#values.has(v);
  };

  filter(_cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    return this.#last.get(endpoints, this.#keep);
  }
}

const noParams = z.strictObject({});

export const decodeFilterSpec = spec({
  type: "decode-filter",
  stability: "stable",
  kind: "filter",
  summary:
    "Keeps decode-capable endpoints (role decode, prefill-decode, both, encode-prefill-decode) and unlabelled ones.",
  params: noParams,
  factory: (name) =>
    new ByLabelFilter("decode-filter", name, ROLE_LABEL, true, [
      "decode",
      "prefill-decode",
      "both",
      "encode-prefill-decode",
    ]),
});

export const prefillFilterSpec = spec({
  type: "prefill-filter",
  stability: "stable",
  kind: "filter",
  summary:
    "Keeps prefill-capable endpoints (prefill, encode-prefill, prefill-decode, both, encode-prefill-decode).",
  params: noParams,
  factory: (name) =>
    new ByLabelFilter("prefill-filter", name, ROLE_LABEL, false, [
      "prefill",
      "encode-prefill",
      "prefill-decode",
      "both",
      "encode-prefill-decode",
    ]),
});

export const encodeFilterSpec = spec({
  type: "encode-filter",
  stability: "stable",
  kind: "filter",
  summary: "Keeps encode-capable endpoints (encode, encode-prefill, encode-prefill-decode).",
  params: noParams,
  factory: (name) =>
    new ByLabelFilter("encode-filter", name, ROLE_LABEL, false, [
      "encode",
      "encode-prefill",
      "encode-prefill-decode",
    ]),
});

const expression = z.strictObject({
  key: z.string().min(1),
  operator: z.enum(["In", "NotIn", "Exists", "DoesNotExist"]),
  values: z.array(z.string()).optional(),
});

export const selectorParams = z
  .strictObject({
    matchLabels: z.record(z.string(), z.string()).default({}),
    matchExpressions: z.array(expression).default([]),
  })
  .superRefine((p, ctx) => {
    p.matchExpressions.forEach((e, i) => {
      const n = e.values?.length ?? 0;
      if ((e.operator === "In" || e.operator === "NotIn") && n === 0) {
        ctx.addIssue({
          code: "custom",
          path: ["matchExpressions", i, "values"],
          message: `${e.operator} needs values`,
        });
      }
      if ((e.operator === "Exists" || e.operator === "DoesNotExist") && n > 0) {
        ctx.addIssue({
          code: "custom",
          path: ["matchExpressions", i, "values"],
          message: `${e.operator} takes no values`,
        });
      }
    });
  });
export type SelectorParams = z.output<typeof selectorParams>;

export function matchesSelector(labels: Record<string, string>, s: SelectorParams): boolean {
  for (const [k, v] of Object.entries(s.matchLabels)) if (labels[k] !== v) return false;
  for (const e of s.matchExpressions) {
    const v = labels[e.key];
    const has = v !== undefined;
    switch (e.operator) {
      case "In":
        if (!has || !(e.values ?? []).includes(v)) return false;
        break;
      case "NotIn":
        if (has && (e.values ?? []).includes(v)) return false;
        break;
      case "Exists":
        if (!has) return false;
        break;
      case "DoesNotExist":
        if (has) return false;
        break;
    }
  }
  return true;
}

export class LabelSelectorFilter implements Filter {
  readonly typedName: TypedName;

  constructor(
    name: string,
    readonly selector: SelectorParams,
  ) {
    this.typedName = { type: "label-selector-filter", name };
  }

  readonly #last = new LastResult();
  readonly #keep = (e: EndpointState): boolean => matchesSelector(e.labels, this.selector);

  filter(_cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    return this.#last.get(endpoints, this.#keep);
  }
}

export const labelSelectorSpec = spec({
  type: "label-selector-filter",
  stability: "stable",
  kind: "filter",
  summary: "Keeps endpoints matching a Kubernetes label selector (matchLabels, matchExpressions).",
  params: selectorParams,
  factory: (name, p) => new LabelSelectorFilter(name, p),
});
