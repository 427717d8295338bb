// Filters: the sticky-until-saturated affinity gate, role and label-selector filters.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { InFlightInfo } from "../src/scheduler/plugins/data.ts";
import { inflightKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  decodeFilterSpec,
  LabelSelectorFilter,
  prefillFilterSpec,
  selectorParams,
} from "../src/scheduler/plugins/filters/labels.ts";
import {
  affinityParams,
  PrefixCacheAffinityFilter,
} from "../src/scheduler/plugins/filters/prefix-affinity.ts";
import { completion, cycleFor, endpoint, prefixInfo } from "../src/scheduler/testing.ts";
import type { Filter } from "../src/scheduler/types.ts";

const handle = { hasher: null, plugin: () => undefined };
const a = endpoint("a:1");
const b = endpoint("b:1");
const c = endpoint("c:1");
const ids = (eps: readonly { id: string }[]) => eps.map((e) => e.id);

describe("prefix-cache-affinity-filter", () => {
  const filter = (params: Record<string, unknown> = {}) =>
    new PrefixCacheAffinityFilter(
      "f",
      affinityParams.parse({ prefixMatchInfoProducerName: "p", inFlightLoadProducerName: "i", ...params }),
    );
  const cyc = (matches: Record<string, number>, tokens: Record<string, number>, seed = 1) => {
    const x = cycleFor(completion("r", "p"), [a, b, c], 0, seed);
    x.set(prefixKey("p"), prefixInfo(10, 64, matches));
    const info: InFlightInfo = {
      requests: () => 0,
      tokens: (id) => tokens[id] ?? 0,
      uncachedRequestTokens: () => 0,
    };
    x.set(inflightKey("i"), info);
    return x;
  };

  it("keeps only sticky endpoints (ratio ≥ 0.8) while the warm one is not too far behind", () => {
    const f = filter();
    // a: 100000 / 15928 · 1000 ≈ 6278 ms behind b (0 ms) < 18000 ms
    assert.deepEqual(ids(f.filter(cyc({ "a:1": 8, "c:1": 7 }, { "a:1": 100000 }), [a, b, c])), ["a:1"]);
  });

  it("releases stickiness once the best sticky TTFT exceeds the best other by more than maxTTFTPenaltyMs", () => {
    const f = filter();
    // a: 300000 / 15928 · 1000 ≈ 18835 ms > 18000
    assert.deepEqual(ids(f.filter(cyc({ "a:1": 10 }, { "a:1": 300000 }), [a, b, c])), ["a:1", "b:1", "c:1"]);
    assert.equal(f.decisions["load-override"], 1);
  });

  it("compares penalty > max strictly, against the best of each group", () => {
    const f = filter({ peakPrefillThroughput: 1000, maxTTFTPenaltyMs: 1000 });
    // sticky a: 2000 ms; others b: 1000 ms, c: 5000 ms → penalty 1000, not > 1000
    assert.deepEqual(
      ids(f.filter(cyc({ "a:1": 10 }, { "a:1": 2000, "b:1": 1000, "c:1": 5000 }), [a, b, c])),
      ["a:1"],
    );
    // b: 999 ms → penalty 1001 > 1000
    assert.equal(f.filter(cyc({ "a:1": 10 }, { "a:1": 2000, "b:1": 999 }), [a, b, c]).length, 3);
  });

  it("keeps all when nothing is sticky; the threshold is inclusive", () => {
    const f = filter();
    assert.equal(f.filter(cyc({ "a:1": 7 }, {}), [a, b, c]).length, 3);
    assert.deepEqual(ids(f.filter(cyc({ "a:1": 8, "b:1": 9 }, {}), [a, b, c])), ["a:1", "b:1"]);
  });

  it("maxTTFTPenaltyMs 0 always sticks; explorationProbability 1 always keeps all", () => {
    assert.deepEqual(
      ids(filter({ maxTTFTPenaltyMs: 0 }).filter(cyc({ "a:1": 10 }, { "a:1": 1e9 }), [a, b, c])),
      ["a:1"],
    );
    assert.equal(filter({ explorationProbability: 1 }).filter(cyc({ "a:1": 10 }, {}), [a, b, c]).length, 3);
  });

  it("needs the in-flight producer only when the load gate is on", () => {
    assert.equal(filter().consumes().required.length, 2);
    assert.equal(filter({ maxTTFTPenaltyMs: 0 }).consumes().required.length, 1);
  });
});

describe("prefix-cache-affinity-filter, releaseWhenSlotsFull", () => {
  const req = completion("r", "p");
  const filter = (on = true) =>
    new PrefixCacheAffinityFilter(
      "f",
      affinityParams.parse({
        prefixMatchInfoProducerName: "p",
        inFlightLoadProducerName: "i",
        ...(on ? { releaseWhenSlotsFull: true } : {}),
      }),
    );
  /** a is the home (sticky); b and c hold nothing. `inflight`: the gateway's requests per endpoint. */
  const run = (
    f: PrefixCacheAffinityFilter,
    eps: ReturnType<typeof endpoint>[],
    inflight: Record<string, number>,
    uncached: number,
  ) => {
    const x = cycleFor(req, eps, 0, 1);
    x.set(prefixKey("p"), prefixInfo(10, 64, { "a:1": 10 }));
    const info: InFlightInfo = {
      requests: (id) => inflight[id] ?? 0,
      tokens: () => 0,
      uncachedRequestTokens: (id) => (id === "a:1" ? 0 : uncached),
    };
    x.set(inflightKey("i"), info);
    return ids(f.filter(x, eps));
  };
  /** A scrape at `t` of a running 4 with `waiting` waiting (a stepping engine's KV moves); b, c idle. */
  const fullAt = (t: number, waiting: number) => [
    endpoint("a:1", {
      runningRequestsSize: 4,
      waitingQueueSize: waiting,
      kvCacheUsagePercent: t / 100,
      updateTime: t,
    }),
    endpoint("b:1", { runningRequestsSize: 1, updateTime: t }),
    endpoint("c:1", { runningRequestsSize: 1, updateTime: t }),
  ];
  /** Scrapes showing a's 4 slots taken with requests waiting (its cap), then a response every 0.5 s there. */
  const teach = (f: PrefixCacheAffinityFilter) => {
    for (let t = 1; t <= 6; t++) run(f, fullAt(t, 3), { "a:1": 3 }, 100);
    for (let t = 0; t <= 5; t++) f.onResponseComplete(req, "a:1", 10 + t * 0.5);
  };
  const now = [
    endpoint("a:1", { updateTime: 7 }),
    endpoint("b:1", { updateTime: 7 }),
    endpoint("c:1", { updateTime: 7 }),
  ];

  it("sends the request where it starts sooner when every slot of its home is taken", () => {
    const f = filter();
    teach(f);
    // a: 6 in flight for 4 slots, so the third end from now: (3 + 1.28·√3) × 0.5 s ≈ 2.6 s at the
    // 90th percentile; b and c: 1,000 cold tokens ≈ 63 ms.
    assert.deepEqual(run(f, now, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000), ["b:1", "c:1"]);
    assert.equal(f.decisions["slots-full"], 1);
  });

  it("keeps the home while a cold prefill elsewhere would take longer than the wait for a slot", () => {
    const f = filter();
    teach(f);
    // 100,000 cold tokens ≈ 6.3 s at 15,928 tok/s, against ≈ 2.6 s for a slot at home.
    assert.deepEqual(run(f, now, { "a:1": 6, "b:1": 1, "c:1": 1 }, 100_000), ["a:1"]);
  });

  it("weighs the wait for a slot at its tail, not its mean", () => {
    const f = filter();
    teach(f);
    // a at exactly its cap: the next end is 0.5 s away on average, (1 + 1.28) × 0.5 ≈ 1.14 s at the
    // 90th percentile; 12,000 cold tokens elsewhere take ≈ 0.75 s, so the request leaves.
    assert.deepEqual(run(f, now, { "a:1": 4, "b:1": 1, "c:1": 1 }, 12_000), ["b:1", "c:1"]);
    // 20,000 cold tokens (≈ 1.26 s) are slower than even that tail: it stays.
    assert.deepEqual(run(f, now, { "a:1": 4, "b:1": 1, "c:1": 1 }, 20_000), ["a:1"]);
  });

  it("keeps the home while it has a free slot, and skips endpoints whose slots are taken too", () => {
    const f = filter();
    teach(f);
    assert.deepEqual(run(f, now, { "a:1": 3, "b:1": 1, "c:1": 1 }, 1000), ["a:1"]);
    // c is at a's cap (its own not learned yet): only b takes the request.
    assert.deepEqual(run(f, now, { "a:1": 6, "b:1": 1, "c:1": 4 }, 1000), ["b:1"]);
  });

  it("knows a home full after two scrapes while a request of the gateway's is stalled there", () => {
    /** Two scrapes of a at 4 running, 1 waiting; `stalled`: a request there picked 0.5 s before. */
    const learn = (stalled: boolean) => {
      const f = filter();
      for (let t = 1; t <= 2; t++) {
        const eps = fullAt(t, 1);
        const x = cycleFor(req, eps, t, 1);
        x.set(prefixKey("p"), prefixInfo(10, 64, { "a:1": 10 }));
        const info: InFlightInfo = {
          requests: (id) => (id === "a:1" ? 5 : 1),
          tokens: () => 0,
          uncachedRequestTokens: (id) => (id === "a:1" ? 0 : 100),
          oldestWaitingSince: (id) => (id === "a:1" && stalled ? t - 0.5 : undefined),
          usualWaitToStart: () => 0.05,
        };
        x.set(inflightKey("i"), info);
        f.filter(x, eps);
      }
      for (let t = 0; t <= 5; t++) f.onResponseComplete(req, "a:1", 10 + t * 0.5);
      return run(f, now, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000);
    };
    // Half a second against a usual 50 ms start: a's 4 slots are its cap, and the request leaves.
    assert.deepEqual(learn(true), ["b:1", "c:1"]);
    // Without the stall, two scrapes with one request waiting teach nothing: a keeps it.
    assert.deepEqual(learn(false), ["a:1"]);
  });

  it("drops a full home for another home with a free slot that starts the request sooner", () => {
    const f = filter();
    teach(f);
    // The prompt is held by a and c. `queued`: uncached prompt tokens waiting for prefill on each.
    const both = (inflight: Record<string, number>, queued: Record<string, number>) => {
      const x = cycleFor(req, now, 0, 1);
      x.set(prefixKey("p"), prefixInfo(10, 64, { "a:1": 10, "c:1": 10 }));
      const info: InFlightInfo = {
        requests: (id) => inflight[id] ?? 0,
        tokens: (id) => queued[id] ?? 0,
        uncachedRequestTokens: (id) => (id === "b:1" ? 1000 : 0),
      };
      x.set(inflightKey("i"), info);
      return ids(f.filter(x, now));
    };
    // a: 6 in flight for 4 slots, ≈ 2.6 s to a slot at the 90th percentile; c: a free slot behind
    // 10,000 queued tokens, ≈ 0.63 s at 15,928 tok/s. The request stays warm, on c.
    assert.deepEqual(both({ "a:1": 6, "c:1": 2 }, { "c:1": 10_000 }), ["c:1"]);
    assert.equal(f.decisions["slots-full"], 1);
    // c behind 100,000 queued tokens (≈ 6.3 s): a's slot comes sooner, and both stay to the scorers.
    assert.deepEqual(both({ "a:1": 6, "c:1": 2 }, { "c:1": 100_000 }), ["a:1", "c:1"]);
    // a with a free slot: nothing is dropped.
    assert.deepEqual(both({ "a:1": 3, "c:1": 2 }, { "c:1": 10_000 }), ["a:1", "c:1"]);
    assert.equal(f.decisions["slots-full"], 1);
  });

  /**
   * b's scrapes show its 4 slots taken with requests waiting (its cap); a's, `aRunning` running and
   * none waiting; a response every 0.5 s at a. `blocks`: each endpoint's KV block count (its shape).
   */
  const teachPeer = (f: PrefixCacheAffinityFilter, aRunning: number, blocks: Record<string, number>) => {
    for (let t = 1; t <= 6; t++) {
      const eps = [
        endpoint("a:1", { runningRequestsSize: aRunning, updateTime: t, cacheNumBlocks: blocks["a:1"] }),
        endpoint("b:1", {
          runningRequestsSize: 4,
          waitingQueueSize: 3,
          kvCacheUsagePercent: t / 100,
          updateTime: t,
          cacheNumBlocks: blocks["b:1"],
        }),
        endpoint("c:1", { runningRequestsSize: 1, updateTime: t, cacheNumBlocks: blocks["c:1"] }),
      ];
      run(f, eps, { "a:1": aRunning }, 100);
    }
    for (let t = 0; t <= 5; t++) f.onResponseComplete(req, "a:1", 10 + t * 0.5);
    return ["a:1", "b:1", "c:1"].map((id) => endpoint(id, { updateTime: 7, cacheNumBlocks: blocks[id] }));
  };
  const same = { "a:1": 2000, "b:1": 2000, "c:1": 2000 };

  it("takes a home's cap from a replica of its shape before the home has shown its own", () => {
    const f = filter();
    const eps = teachPeer(f, 2, same);
    // a has never filled its slots, but b (same KV shape) has 4: a with 6 in flight is full.
    assert.deepEqual(run(f, eps, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000), ["b:1", "c:1"]);
    assert.equal(f.decisions["slots-full"], 1);
  });

  it("lends no cap across shapes, nor to a home that has already run more than it", () => {
    const other = filter();
    const eps = teachPeer(other, 2, { ...same, "a:1": 1000 });
    assert.deepEqual(run(other, eps, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000), ["a:1"]);
    const more = filter();
    const eps2 = teachPeer(more, 5, same);
    assert.deepEqual(run(more, eps2, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000), ["a:1"]);
  });

  it("is refused, with what to do, beside a gate it cannot join", () => {
    for (const extra of [{ maxTTFTPenaltyMs: 0 }, { ttftSource: "latencyPredictor" }])
      assert.throws(
        () => affinityParams.parse({ releaseWhenSlotsFull: true, ...extra }),
        /prefill-throughput gate only: set maxTTFTPenaltyMs > 0 and ttftSource: prefillThroughput/,
      );
  });

  it("holds until a cap and a pace are learned, and is off unless asked for", () => {
    const fresh = filter();
    assert.deepEqual(run(fresh, now, { "a:1": 60, "b:1": 1, "c:1": 1 }, 1000), ["a:1"]);
    const off = filter(false);
    teach(off);
    assert.deepEqual(run(off, now, { "a:1": 6, "b:1": 1, "c:1": 1 }, 1000), ["a:1"]);
  });
});

describe("role filters (llm-d.ai/role)", () => {
  const roles = ["prefill", "decode", "prefill-decode", "both", "encode", undefined];
  const eps = roles.map((r, i) => endpoint(`e${i}:1`, {}, r === undefined ? {} : { "llm-d.ai/role": r }));
  const run = (f: Filter) => ids(f.filter(cycleFor(completion("r", "p"), eps), eps));
  it("decode-filter keeps decode-capable and unlabelled endpoints", () => {
    assert.deepEqual(run(decodeFilterSpec.factory("d", {}, handle) as Filter), [
      "e1:1",
      "e2:1",
      "e3:1",
      "e5:1",
    ]);
  });
  it("prefill-filter keeps prefill-capable endpoints only", () => {
    assert.deepEqual(run(prefillFilterSpec.factory("p", {}, handle) as Filter), ["e0:1", "e2:1", "e3:1"]);
  });
  it("answers an unchanged pool with the same array, and follows endpoint and label changes", () => {
    const f = prefillFilterSpec.factory("p", {}, handle) as Filter;
    const pool = roles.map((r, i) => endpoint(`e${i}:1`, {}, r === undefined ? {} : { "llm-d.ai/role": r }));
    const cyc = cycleFor(completion("r", "p"), pool);
    const first = f.filter(cyc, pool);
    assert.equal(f.filter(cyc, [...pool]), first, "a fresh array of the same endpoints");
    pool[1].labels = { "llm-d.ai/role": "prefill" }; // the datastore replaces labels objects
    assert.deepEqual(ids(f.filter(cyc, [...pool])), ["e0:1", "e1:1", "e2:1", "e3:1"]);
    assert.deepEqual(ids(f.filter(cyc, pool.slice(2))), ["e2:1", "e3:1"]);
    assert.deepEqual(ids(f.filter(cyc, [pool[0], pool[2], pool[1], pool[3], pool[4], pool[5]])), [
      "e0:1",
      "e2:1",
      "e1:1",
      "e3:1",
    ]);
  });
});

describe("label-selector-filter", () => {
  const eps = [
    endpoint("a:1", {}, { zone: "x", gpu: "h100" }),
    endpoint("b:1", {}, { zone: "y", gpu: "h100" }),
    endpoint("c:1", {}, { zone: "y" }),
  ];
  const run = (sel: unknown) =>
    ids(
      new LabelSelectorFilter("l", selectorParams.parse(sel)).filter(
        cycleFor(completion("r", "p"), eps),
        eps,
      ),
    );
  it("applies matchLabels and every matchExpressions operator", () => {
    assert.deepEqual(run({ matchLabels: { zone: "y" } }), ["b:1", "c:1"]);
    assert.deepEqual(run({ matchExpressions: [{ key: "zone", operator: "In", values: ["x", "z"] }] }), [
      "a:1",
    ]);
    assert.deepEqual(run({ matchExpressions: [{ key: "gpu", operator: "NotIn", values: ["h100"] }] }), [
      "c:1",
    ]);
    assert.deepEqual(run({ matchExpressions: [{ key: "gpu", operator: "Exists" }] }), ["a:1", "b:1"]);
    assert.deepEqual(
      run({ matchLabels: { zone: "y" }, matchExpressions: [{ key: "gpu", operator: "DoesNotExist" }] }),
      ["c:1"],
    );
    assert.deepEqual(run({}), ["a:1", "b:1", "c:1"]);
  });
  it("rejects In without values", () => {
    assert.equal(
      selectorParams.safeParse({ matchExpressions: [{ key: "k", operator: "In" }] }).success,
      false,
    );
  });
});
