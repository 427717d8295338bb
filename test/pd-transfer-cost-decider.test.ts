/**
 * transfer-cost-pd-decider: disaggregates only when the KV pull plus the prefill pool's queue
 * costs less than prefilling on the decode endpoint (its queue plus this prompt at its rate);
 * and through the real scheduler, the disagg-profile-handler runs the prefill profile only then.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createXxHasher } from "../src/scheduler/hash.ts";
import type { InFlightInfo } from "../src/scheduler/plugins/data.ts";
import { inflightKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  TransferCostPdDecider,
  transferCostParams,
} from "../src/scheduler/plugins/profiles/transfer-cost-decider.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, cycleFor, endpoint, prefixInfo } from "../src/scheduler/testing.ts";
import type { ScheduleResult } from "../src/scheduler/types.ts";

const ROLE = "llm-d.ai/role";
const P = endpoint("p:1", {}, { [ROLE]: "prefill" });
const P2 = endpoint("p2:1", {}, { [ROLE]: "prefill" });
const D = endpoint("d:1", {}, { [ROLE]: "decode" });
const handle = { hasher: null, plugin: () => undefined };

function decider(params: Record<string, unknown> = {}) {
  return new TransferCostPdDecider(
    "tc",
    transferCostParams.parse({
      prefixMatchInfoProducerName: "px",
      inFlightLoadProducerName: "in",
      ...params,
    }),
    handle,
  );
}

/** A cycle for a prompt of `tokens` tokens, D holding `cachedBlocks` 64-token blocks, and in-flight tokens. */
function cycle(
  tokens: number,
  queued: Record<string, number> = {},
  cachedBlocks = 0,
  rates: Record<string, number> = {},
  eps = [P, D],
) {
  const c = cycleFor(completion("r", "x", { tokenIds: new Array(tokens).fill(7) }), eps);
  c.set(prefixKey("px"), prefixInfo(Math.floor(tokens / 64), 64, { [D.id]: cachedBlocks }));
  const load: InFlightInfo = {
    requests: () => 0,
    tokens: (id) => queued[id] ?? 0,
    uncachedRequestTokens: () => tokens,
    prefillRate: (id) => rates[id],
  };
  c.set(inflightKey("in"), load);
  return c;
}

describe("transfer-cost-pd-decider", () => {
  it("says yes for a long uncached prompt on an idle fleet over RDMA", () => {
    const d = decider({ kvBytesPerToken: 36864, peakPrefillThroughput: 30000 });
    // local 5000/30000 = 167 ms; remote 5000·36864/8e9 + 5 ms = 28 ms
    assert.equal(d.decide(cycle(5000), D), true);
    assert.equal(d.last?.prefillEndpoint, P.id);
    assert.ok(Math.abs((d.last?.remoteS ?? 0) - 0.028) < 1e-3);
  });

  it("says no for a short prompt: the per-transfer overhead exceeds its prefill", () => {
    const d = decider({ kvBytesPerToken: 36864, peakPrefillThroughput: 30000 });
    // local 64/30000 = 2.1 ms < remote ≥ 5 ms
    assert.equal(d.decide(cycle(64), D), false);
    assert.equal(d.stats().local, 1);
  });

  it("says no over a TCP-speed link, where pulling a token's KV is slower than computing it", () => {
    const d = decider({ kvBytesPerToken: 131072, linkBandwidthGBps: 0.5, peakPrefillThroughput: 15928 });
    // per token: 131072/0.5e9 = 262 µs on the link vs 63 µs of prefill
    assert.equal(d.decide(cycle(20000), D), false);
    // the same prompt over RDMA goes remote
    assert.equal(decider({ kvBytesPerToken: 131072 }).decide(cycle(20000), D), true);
  });

  it("says no when the prefill pool's queue outweighs the decode endpoint's, yes when the decode endpoint is the busy one", () => {
    const d = decider({ kvBytesPerToken: 36864, peakPrefillThroughput: 30000 });
    // P holds 60k queued tokens (2 s); D idle: local 167 ms < remote 2.03 s
    assert.equal(d.decide(cycle(5000, { [P.id]: 60000 }), D), false);
    // both queued, D more: local (90k+5k)/30k = 3.2 s > remote 2.03 s
    assert.equal(d.decide(cycle(5000, { [P.id]: 60000, [D.id]: 90000 }), D), true);
    // the least loaded prefill endpoint counts
    const two = cycle(5000, { [P.id]: 60000, [P2.id]: 0 }, 0, {}, [P, P2, D]);
    assert.equal(d.decide(two, D), true);
    assert.equal(d.last?.prefillEndpoint, P2.id);
  });

  it("uses the decode endpoint's learned prefill rate over the configured one", () => {
    const d = decider({ kvBytesPerToken: 131072, peakPrefillThroughput: 15928 });
    // 131072 B/token at 8 GB/s = 16.4 µs/token; a decoder learned at 200k tok/s (5 µs/token) keeps it local
    assert.equal(d.decide(cycle(20000, {}, 0, { [D.id]: 200000 }), D), false);
    assert.equal(d.decide(cycle(20000, {}, 0, {}), D), true);
  });

  it("counts only the tokens the decode endpoint lacks, and honours nonCachedTokens", () => {
    const d = decider({ kvBytesPerToken: 36864, peakPrefillThroughput: 30000 });
    // D holds 78 of 78 blocks (4992 tokens): 8 uncached tokens → local
    assert.equal(d.decide(cycle(5000, {}, 78), D), false);
    assert.equal(d.last?.uncachedTokens, 8);
    assert.equal(decider({ kvBytesPerToken: 36864, nonCachedTokens: 6000 }).decide(cycle(5000), D), false);
  });

  it("takes the prompts it sent away out of the decode endpoint's queue until their first token", () => {
    const d = decider({ kvBytesPerToken: 36864, peakPrefillThroughput: 30000 });
    const first = cycle(60000);
    assert.equal(d.decide(first, D), true);
    const picked = { requestId: "r", profiles: { prefill: { target: P } } } as unknown as ScheduleResult;
    d.preRequest(first, picked);
    // The in-flight producer counts those 60k tokens on D as well as on P; D will not compute them:
    // local (0 + 5000)/30000 = 167 ms < remote 28 ms + 60000/30000 s.
    const busy = () => cycle(5000, { [P.id]: 60000, [D.id]: 60000 });
    assert.equal(d.decide(busy(), D), false);
    d.onResponseStarted(completion("r", ""));
    // Settled: D's 60k are its own again → local 2.17 s > remote 2.03 s.
    assert.equal(d.decide(busy(), D), true);
  });

  it("never disaggregates without a prefill endpoint among the candidates", () => {
    const d = decider({ kvBytesPerToken: 36864 });
    assert.equal(d.decide(cycle(50000, {}, 0, {}, [D]), D), false);
    assert.equal(d.stats()["no-prefill-endpoint"], 1);
  });
});

const CONFIG = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
- type: disagg-profile-handler
  parameters: { deciders: { prefill: transfer-cost-pd-decider } }
- type: transfer-cost-pd-decider
  parameters: { kvBytesPerToken: 36864, peakPrefillThroughput: 30000 }
schedulingProfiles:
- name: prefill
  plugins: [{ pluginRef: prefill-filter }, { pluginRef: queue-scorer }, { pluginRef: max-score-picker }]
- name: decode
  plugins: [{ pluginRef: decode-filter }, { pluginRef: queue-scorer }, { pluginRef: max-score-picker }]
`;

describe("transfer-cost-pd-decider in the scheduler", () => {
  it("loads with its producers added, and the handler runs the prefill profile only when it says yes", async () => {
    const { scheduler } = await createScheduler(CONFIG, { hasher: await createXxHasher() });
    const long = scheduler.schedule(completion("a", "x", { tokenIds: new Array(5000).fill(3) }), [P, D], 0);
    assert.equal(long.target?.id, D.id);
    assert.equal(long.profiles.prefill?.target?.id, P.id);
    const short = scheduler.schedule(completion("b", "x", { tokenIds: new Array(40).fill(3) }), [P, D], 0);
    assert.equal(short.target?.id, D.id);
    assert.equal(short.profiles.prefill, undefined);
  });
});
