/**
 * The data model of a parsed Prometheus text exposition (families of samples), and how a series
 * name (`x_bucket`, `x_sum`, `x_count`, `x_total`, `x_created`) maps to the family it belongs to.
 */

export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped";

export interface PromSample {
  /** The full sample name, e.g. `vllm:time_to_first_token_seconds_bucket`. */
  name: string;
  labels: Record<string, string>;
  value: number;
  timestampMs?: number;
}

export interface PromFamily {
  name: string;
  type: MetricType;
  help: string;
  /** In exposition order; histogram `_bucket`/`_sum`/`_count` and summary series included. */
  samples: PromSample[];
}

/** Families keyed by family name, in order of first appearance. */
export type PromFamilies = Map<string, PromFamily>;

const SUFFIXES: Array<[string, MetricType[]]> = [
  ["_bucket", ["histogram"]],
  ["_sum", ["histogram", "summary"]],
  ["_count", ["histogram", "summary"]],
  ["_total", ["counter"]],
  ["_created", ["histogram", "summary", "counter"]],
];

/** The family name and the types it may have, if `name` ends like a histogram/summary/counter series. */
export function seriesBase(name: string): { name: string; types: MetricType[] } | undefined {
  for (const [suffix, types] of SUFFIXES) {
    if (name.length > suffix.length && name.endsWith(suffix)) {
      return { name: name.slice(0, name.length - suffix.length), types };
    }
  }
  return undefined;
}
