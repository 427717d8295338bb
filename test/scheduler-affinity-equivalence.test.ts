// prefix-cache-affinity-filter's fast paths (matched-id list, sticky-first load gate) against the
// straightforward per-endpoint algorithm, on random match counts, loads and parameters.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { InFlightInfo, PrefixMatchInfo } from "../src/scheduler/plugins/data.ts";
import { inflightKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  type AffinityParams,
  affinityParams,
  PrefixCacheAffinityFilter,
} from "../src/scheduler/plugins/filters/prefix-affinity.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState } from "../src/scheduler/types.ts";

/** The filter as first written: one ratio per endpoint, best TTFT of both groups always computed. */
function reference(
  p: AffinityParams,
  info: PrefixMatchInfo | undefined,
  load: InFlightInfo | undefined,
  eps: readonly EndpointState[],
): readonly EndpointState[] {
  if (eps.length <= 1 || p.affinityThreshold <= 0) return eps;
  const ratio = (id: string) =>
    info === undefined || info.totalBlocks <= 0 ? 0 : info.matchBlocks(id) / info.totalBlocks;
  const sticky = eps.filter((e) => ratio(e.id) >= p.affinityThreshold);
  const rest = eps.filter((e) => ratio(e.id) < p.affinityThreshold);
  if (sticky.length === 0) return eps;
  if (p.maxTTFTPenaltyMs > 0 && rest.length > 0) {
    if (load === undefined) return eps;
    const best = (g: EndpointState[]) =>
      Math.min(...g.map((e) => (load.tokens(e.id) / p.peakPrefillThroughput) * 1000));
    if (best(sticky) - best(rest) > p.maxTTFTPenaltyMs) return eps;
  }
  return sticky;
}

describe("prefix-cache-affinity-filter fast paths", () => {
  it("pick exactly the reference's endpoints", () => {
    const rng = createRng(11);
    for (let k = 0; k < 4000; k++) {
      const n = 1 + rng.int(40);
      const eps = Array.from({ length: n }, (_, i) => endpoint(`10.0.0.${i}:8000`));
      const total = rng.next() < 0.05 ? 0 : 1 + rng.int(200);
      const counts = new Map<string, number>();
      const matched = rng.next() < 0.3 ? 0 : rng.int(Math.min(n, 1 + rng.int(40)) + 1);
      for (let j = 0; j < matched; j++) counts.set(eps[rng.int(n)].id, 1 + rng.int(Math.max(1, total)));
      if (rng.next() < 0.2) counts.set("not-a-candidate:1", total);
      const withList = rng.next() < 0.5;
      const info: PrefixMatchInfo = {
        totalBlocks: total,
        blockSizeTokens: 64,
        promptTokens: total * 64,
        anyMatch: counts.size > 0,
        matchBlocks: (id) => counts.get(id) ?? 0,
        ...(withList ? { matches: () => counts } : {}),
      };
      const tokens = new Map(eps.map((e) => [e.id, rng.next() < 0.3 ? 0 : rng.int(600000)]));
      const load: InFlightInfo = {
        requests: () => 0,
        tokens: (id) => tokens.get(id) ?? 0,
        uncachedRequestTokens: () => 0,
      };
      const params = affinityParams.parse({
        prefixMatchInfoProducerName: "p",
        inFlightLoadProducerName: "i",
        affinityThreshold: [0, 0.5, 0.8, 1][rng.int(4)],
        maxTTFTPenaltyMs: [0, 1000, 18000][rng.int(3)],
        peakPrefillThroughput: [1000, 15928][rng.int(2)],
      });
      const cycle = cycleFor(completion(`r${k}`, "x"), eps);
      if (rng.next() < 0.95) cycle.set(prefixKey("p"), info);
      const hasLoad = rng.next() < 0.95;
      if (hasLoad) cycle.set(inflightKey("i"), load);
      const got = new PrefixCacheAffinityFilter("f", params).filter(cycle, eps);
      const want = reference(params, cycle.get(prefixKey("p")), hasLoad ? load : undefined, eps);
      assert.deepEqual(
        got.map((e) => e.id),
        want.map((e) => e.id),
        `case ${k}`,
      );
    }
  });
});
