/**
 * bench:picker's locality-filter measurements.
 *
 * `<config>~spill-set` twin of a locality-filter config: the same config deciding
 * over the very candidate list its locality-filter leaves, without paying for the filter. A shadow
 * scheduler of the config itself runs each decision first, untimed (runDecisions' `shadow`), and
 * its filter's output is captured; the timed twin's filter only hands that list back. So the gap
 * between `<config>` and `<config>~spill-set` is the locality step's own cost, not the cost of
 * scoring a different number of candidates (spilling leaves both regions' unsaturated replicas).
 */
import { LOCALITY_FILTER_TYPE } from "../scheduler/plugins/filters/locality.ts";
import { createScheduler, type Scheduler } from "../scheduler/scheduler.ts";
import type { CycleState, EndpointState, Filter } from "../scheduler/types.ts";
import { type Percentiles, percentiles } from "./picker-decision.ts";

export const SPILL_SET = "~spill-set";

/** `s`'s one locality-filter; throws when its config has none or several (`name` for the error). */
function localityFilter(name: string, s: Scheduler): Filter {
  const out: Filter[] = [];
  for (const p of s.plugins.values())
    if ((p as Partial<Filter>).typedName?.type === LOCALITY_FILTER_TYPE) out.push(p as Filter);
  if (out.length !== 1)
    throw new Error(
      `${name}: needs exactly one locality-filter in its config, found ${out.length}: use ${SPILL_SET} only on a locality config (e.g. locality${SPILL_SET})`,
    );
  return out[0];
}

/**
 * The twin (timed) and its shadow (untimed), both built from `text`, seeded alike. Throws when the
 * config has no locality-filter or more than one (the captured list would be ambiguous).
 */
export async function spillSetPair(
  name: string,
  text: string,
  seed: number,
): Promise<{ twin: Scheduler; shadow: Scheduler }> {
  const shadow = (await createScheduler(text, { seed })).scheduler;
  const twin = (await createScheduler(text, { seed })).scheduler;
  const [fs, ft] = [localityFilter(name, shadow), localityFilter(name, twin)];
  let captured: readonly EndpointState[] | null = null;
  const real = fs.filter.bind(fs);
  fs.filter = (cycle: CycleState, eps: readonly EndpointState[]) => {
    captured = real(cycle, eps);
    return captured;
  };
  ft.filter = (_cycle: CycleState, eps: readonly EndpointState[]) => captured ?? eps;
  return { twin, shadow };
}

/**
 * Times `s`'s one locality-filter on its own: wraps its filter() so every call's duration is kept,
 * for the caller to run decisions through `s` (their own timings are not this step's). The step
 * alone is the figure the 10% target reads, the way the multi-pool step is timed alone; the
 * twin's difference of two whole decisions' p99s is the same cost seen through both tails' noise.
 * Its refresh() calls (the measurement the gateway takes between requests, on a timer) are timed
 * apart: they are off the request path. Throws as spillSetPair does when the config has no
 * locality-filter or more than one.
 */
export function timeLocalityFilter(
  name: string,
  s: Scheduler,
): { last(n: number): Percentiles; refresh(): Percentiles | null } {
  const f = localityFilter(name, s);
  const ns: number[] = [];
  const refreshNs: number[] = [];
  const real = f.filter.bind(f);
  f.filter = (cycle: CycleState, eps: readonly EndpointState[]) => {
    const t0 = process.hrtime.bigint();
    const out = real(cycle, eps);
    ns.push(Number(process.hrtime.bigint() - t0));
    return out;
  };
  const refresh = f.refresh?.bind(f);
  if (refresh !== undefined)
    f.refresh = (now: number) => {
      const t0 = process.hrtime.bigint();
      refresh(now);
      refreshNs.push(Number(process.hrtime.bigint() - t0));
    };
  return {
    last: (n) => percentiles(Float64Array.from(ns.slice(-n))),
    refresh: () => (refreshNs.length === 0 ? null : percentiles(Float64Array.from(refreshNs))),
  };
}
