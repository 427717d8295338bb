/**
 * Accessors over parsed Prometheus families: samples by name and labels, sums, first values,
 * gauges and merged histograms.
 */
import { type PromFamilies, type PromSample, seriesBase } from "./prom-families.ts";
import { parseValue } from "./prom-number.ts";

/** Label filter: every listed label must equal the sample's (an absent label counts as ""). */
export type LabelFilter = Record<string, string>;

function matches(labels: Record<string, string>, filter: LabelFilter | undefined): boolean {
  if (!filter) return true;
  for (const k in filter) if ((Object.hasOwn(labels, k) ? labels[k] : "") !== filter[k]) return false;
  return true;
}

/** Samples whose name is exactly `sampleName` (a family name or a series like `x_count`) and match the filter. */
export function samplesOf(families: PromFamilies, sampleName: string, filter?: LabelFilter): PromSample[] {
  let fam = families.get(sampleName);
  if (!fam) {
    const base = seriesBase(sampleName);
    if (base) fam = families.get(base.name);
  }
  if (!fam) return [];
  const out: PromSample[] = [];
  for (const s of fam.samples) if (s.name === sampleName && matches(s.labels, filter)) out.push(s);
  return out;
}

/** Sum over every matching series (e.g. all DP engines of a replica); undefined if none matches. */
export function sumOf(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  const ss = samplesOf(families, name, filter);
  if (ss.length === 0) return undefined;
  let total = 0;
  for (const s of ss) total += s.value;
  return total;
}

/** The first matching series in exposition order; undefined if none matches. */
export function first(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  return samplesOf(families, name, filter)[0]?.value;
}

/**
 * A gauge or counter value: the SUM over the matching series, so a replica with several DP engines
 * reports its total queue. With one engine (the usual vLLM case) that is its single value. Use
 * `first` for a single series, e.g. an info metric.
 */
export function gauge(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  return sumOf(families, name, filter);
}

export interface HistogramData {
  /** [upper bound, cumulative count], ascending, +Inf last when present. */
  buckets: Array<[number, number]>;
  sum: number;
  count: number;
}

/**
 * A histogram family by its family name (without `_bucket`). Series matching the filter are merged:
 * counts at equal `le` and the sums/counts add up. Undefined if no bucket or count series matches.
 */
export function histogram(
  families: PromFamilies,
  name: string,
  filter?: LabelFilter,
): HistogramData | undefined {
  const byLe = new Map<number, number>();
  for (const s of samplesOf(families, `${name}_bucket`, filter)) {
    const le = parseValue(s.labels.le ?? "");
    if (le === undefined || Number.isNaN(le)) continue;
    byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  const sum = sumOf(families, `${name}_sum`, filter);
  const count = sumOf(families, `${name}_count`, filter);
  if (byLe.size === 0 && count === undefined) return undefined;
  const buckets = [...byLe.entries()].sort((a, b) => a[0] - b[0]);
  return { buckets, sum: sum ?? 0, count: count ?? byLe.get(Infinity) ?? 0 };
}
