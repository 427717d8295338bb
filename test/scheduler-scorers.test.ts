// Each scorer's formula on hand-built endpoint states with hand-computed expectations.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { InFlightInfo } from "../src/scheduler/plugins/data.ts";
import { inflightKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  ActiveRequestScorer,
  activeRequestParams,
  LeastRequestScorer,
  TokenLoadScorer,
  tokenLoadParams,
} from "../src/scheduler/plugins/scorers/inflight.ts";
import {
  kvCacheScorerSpec,
  LoadAwareScorer,
  queueScorerSpec,
  runningRequestsScorerSpec,
} from "../src/scheduler/plugins/scorers/metrics.ts";
import { NoHitLruScorer, noHitLruParams } from "../src/scheduler/plugins/scorers/no-hit-lru.ts";
import { PrefixCacheScorer, prefixScorerParams } from "../src/scheduler/plugins/scorers/prefix.ts";
import {
  SessionAffinityFilter,
  SessionAffinityScorer,
  sessionParams,
} from "../src/scheduler/plugins/session.ts";
import { completion, cycleFor, endpoint, prefixInfo } from "../src/scheduler/testing.ts";
import type { Scorer } from "../src/scheduler/types.ts";

const handle = { hasher: null, plugin: () => undefined };
const a = endpoint("a:1");
const b = endpoint("b:1");
const c = endpoint("c:1");

function inflightInfo(
  requests: Record<string, number>,
  tokens: Record<string, number>,
  uncached = 0,
): InFlightInfo {
  return {
    requests: (id) => requests[id] ?? 0,
    tokens: (id) => tokens[id] ?? 0,
    uncachedRequestTokens: () => uncached,
  };
}

const scores = (s: Scorer, eps = [a, b, c], cyc = cycleFor(completion("r", "p"), eps)) =>
  Array.from(s.score(cyc, eps));

describe("metric scorers", () => {
  it("queue-scorer: (max − q)/(max − min); no metrics → 0; all equal → 1", () => {
    const s = queueScorerSpec.factory("q", {}, handle) as Scorer;
    const eps = [
      endpoint("a:1", { waitingQueueSize: 0 }),
      endpoint("b:1", { waitingQueueSize: 5 }),
      endpoint("c:1", { waitingQueueSize: 10 }),
      endpoint("d:1", null),
    ];
    assert.deepEqual(scores(s, eps), [1, 0.5, 0, 0]);
    assert.deepEqual(
      scores(s, [endpoint("a:1", { waitingQueueSize: 3 }), endpoint("b:1", { waitingQueueSize: 3 })]),
      [1, 1],
    );
  });
  it("running-requests-size-scorer: min-max on running requests", () => {
    const s = runningRequestsScorerSpec.factory("r", {}, handle) as Scorer;
    assert.deepEqual(
      scores(s, [
        endpoint("a:1", { runningRequestsSize: 2 }),
        endpoint("b:1", { runningRequestsSize: 4 }),
        endpoint("c:1", { runningRequestsSize: 3 }),
      ]),
      [1, 0, 0.5],
    );
  });
  it("kv-cache-utilization-scorer: 1 − kv", () => {
    const s = kvCacheScorerSpec.factory("k", {}, handle) as Scorer;
    assert.deepEqual(
      scores(s, [
        endpoint("a:1", { kvCacheUsagePercent: 0.25 }),
        endpoint("b:1", { kvCacheUsagePercent: 0.5 }),
        endpoint("c:1", null),
      ]),
      [0.75, 0.5, 0],
    );
  });
  it("load-aware-scorer: 0.5 at q = 0, 0.5·(1 − min(q, t)/t) above", () => {
    const s = new LoadAwareScorer("l", 128);
    const eps = [
      endpoint("a:1", { waitingQueueSize: 0 }),
      endpoint("b:1", { waitingQueueSize: 64 }),
      endpoint("c:1", { waitingQueueSize: 200 }),
      endpoint("d:1", null),
    ];
    assert.deepEqual(scores(s, eps), [0.5, 0.25, 0, 0]);
  });
});

describe("prefix-cache-scorer", () => {
  const cyc = () => {
    const x = cycleFor(completion("r", "p"), [a, b, c]);
    x.set(prefixKey("p"), prefixInfo(4, 64, { "a:1": 4, "b:1": 1 }));
    return x;
  };
  it("default (matchLengthWeight 0) is matchBlocks/totalBlocks", () => {
    const s = new PrefixCacheScorer("s", prefixScorerParams.parse({}), "p");
    assert.deepEqual(scores(s, [a, b, c], cyc()), [1, 0.25, 0]);
  });
  it("blends w·min(1, match·bs/scale)² + (1 − w)·ratio", () => {
    const s = new PrefixCacheScorer(
      "s",
      prefixScorerParams.parse({ matchLengthWeight: 0.5, matchLengthScaleTokens: 512 }),
      "p",
    );
    // a: 0.5·(256/512)² + 0.5·1 = 0.625; b: 0.5·(64/512)² + 0.5·0.25 = 0.1328125
    assert.deepEqual(scores(s, [a, b, c], cyc()), [0.625, 0.1328125, 0]);
  });
  it("scores 0 without match info", () => {
    assert.deepEqual(scores(new PrefixCacheScorer("s", prefixScorerParams.parse({}), "p")), [0, 0, 0]);
  });
  it("starts every call from zero although it reuses its output array", () => {
    const s = new PrefixCacheScorer("s", prefixScorerParams.parse({}), "p");
    assert.deepEqual(scores(s, [a, b, c], cyc()), [1, 0.25, 0]);
    assert.deepEqual(scores(s), [0, 0, 0], "no match info after a call that scored");
    const x = cycleFor(completion("r", "p"), [a, b, c]);
    x.set(prefixKey("p"), prefixInfo(4, 64, { "c:1": 2 }));
    assert.deepEqual(scores(s, [a, b, c], x), [0, 0, 0.5]);
    assert.deepEqual(scores(s, [a, b], x), [0, 0], "another length");
  });
  it("scores the cycle's own candidates from the match list alike (matched endpoints outside them ignored)", () => {
    const s = new PrefixCacheScorer(
      "s",
      prefixScorerParams.parse({ matchLengthWeight: 0.5, matchLengthScaleTokens: 512 }),
      "p",
    );
    const eps = [c, b, a];
    for (let round = 0; round < 2; round++) {
      const x = cycleFor(completion("r", "p"), eps);
      x.set(prefixKey("p"), prefixInfo(4, 64, { "a:1": 4, "b:1": 1, "z:9": 3 }));
      assert.deepEqual(Array.from(s.score(x, x.candidates)), [0, 0.1328125, 0.625]);
      assert.deepEqual(Array.from(s.score(x, [c, b, a])), [0, 0.1328125, 0.625]);
    }
  });
});

describe("in-flight scorers", () => {
  const cyc = (info: InFlightInfo) => {
    const x = cycleFor(completion("r", "p"), [a, b, c]);
    x.set(inflightKey("i"), info);
    return x;
  };
  it("token-load-scorer: 1 − min(1, (inflight + this request's uncached tokens)/threshold)", () => {
    const s = new TokenLoadScorer(
      "t",
      tokenLoadParams.parse({ queueThresholdTokens: 4000, inFlightLoadProducerName: "i" }),
    );
    assert.deepEqual(scores(s, [a, b, c], cyc(inflightInfo({}, { "a:1": 1000, "c:1": 5000 }))), [0.75, 1, 0]);
    assert.deepEqual(scores(s, [a, b], cyc(inflightInfo({}, { "a:1": 1000 }, 1000))), [0.5, 0.75]);
  });
  it("active-request-scorer: idle → 1, else (max − n)/max · maxBusyScore", () => {
    const s1 = new ActiveRequestScorer("a", activeRequestParams.parse({ inFlightLoadProducerName: "i" }));
    assert.deepEqual(scores(s1, [a, b, c], cyc(inflightInfo({ "b:1": 2, "c:1": 4 }, {}))), [1, 0.5, 0]);
    const s2 = new ActiveRequestScorer(
      "a",
      activeRequestParams.parse({ inFlightLoadProducerName: "i", maxBusyScore: 0.5 }),
    );
    assert.deepEqual(scores(s2, [a, b, c], cyc(inflightInfo({ "b:1": 3, "c:1": 4 }, {}))), [1, 0.125, 0]);
    const s3 = new ActiveRequestScorer(
      "a",
      activeRequestParams.parse({ inFlightLoadProducerName: "i", idleThreshold: 3 }),
    );
    assert.deepEqual(scores(s3, [a, b, c], cyc(inflightInfo({ "b:1": 3, "c:1": 4 }, {}))), [1, 1, 0]);
  });
  it("least-request-scorer: min-max over in-flight requests", () => {
    const s = new LeastRequestScorer("l", { inFlightLoadProducerName: "i" });
    assert.deepEqual(
      scores(s, [a, b, c], cyc(inflightInfo({ "a:1": 1, "b:1": 3, "c:1": 5 }, {}))),
      [1, 0.5, 0],
    );
  });
});

describe("no-hit-lru-scorer", () => {
  const mk = () => new NoHitLruScorer("n", noHitLruParams.parse({ prefixMatchInfoProducerName: "p" }));
  const cyc = (matches: Record<string, number>) => {
    const x = cycleFor(completion("r", "p"), [a, b, c]);
    x.set(prefixKey("p"), prefixInfo(2, 64, matches));
    return x;
  };
  it("cold: never-used first in order, then least recently used; 1 − rank/(N − 1)", () => {
    const s = mk();
    assert.deepEqual(scores(s, [a, b, c], cyc({})), [1, 0.5, 0]);
    s.preRequest(cyc({}), { target: c, profiles: {} } as never);
    s.preRequest(cyc({}), { target: a, profiles: {} } as never);
    // never used: b (rank 0); used oldest first: c (rank 1), a (rank 2)
    assert.deepEqual(scores(s, [a, b, c], cyc({})), [0, 1, 0.5]);
  });
  it("warm requests get 0.5 everywhere and do not touch the LRU", () => {
    const s = mk();
    assert.deepEqual(scores(s, [a, b, c], cyc({ "b:1": 1 })), [0.5, 0.5, 0.5]);
    s.preRequest(cyc({ "b:1": 1 }), { target: b, profiles: {} } as never);
    assert.deepEqual(scores(s, [a, b, c], cyc({})), [1, 0.5, 0]);
  });
});

describe("session affinity", () => {
  it("encoded_endpoint_header: 1 for the decoded token's endpoint; the filter keeps only it", () => {
    const s = new SessionAffinityScorer("s", sessionParams.parse({}));
    const f = new SessionAffinityFilter("f", sessionParams.parse({}));
    const withToken = cycleFor(completion("r", "p", { sessionToken: "b:1" }), [a, b, c]);
    assert.deepEqual(scores(s, [a, b, c], withToken), [0, 1, 0]);
    assert.deepEqual(f.filter(withToken, [a, b, c]), [b]);
    assert.deepEqual(f.filter(withToken, [a, c]), [a, c]);
    assert.deepEqual(scores(s, [a, b, c]), [0, 0, 0]);
  });

  it("session_id: binds after the pick, prefers least-bound when unbound, expires after the TTL", () => {
    const params = sessionParams.parse({
      strategy: "session_id",
      evictionTtlSeconds: 10,
      evictionSweepSeconds: 1,
    });
    const s = new SessionAffinityScorer("s", params);
    const cyc = (sid: string, now: number) =>
      cycleFor(completion("r", "p", { sessionId: sid }), [a, b, c], now);
    assert.deepEqual(scores(s, [a, b, c], cyc("s1", 0)), [1, 0, 0]); // all unbound: first in id order
    s.preRequest(
      cyc("s1", 0),
      { target: b, primaryProfile: "default", profiles: { default: { target: b } } } as never,
      0,
    );
    assert.deepEqual(scores(s, [a, b, c], cyc("s1", 5)), [0, 1, 0]);
    const other = scores(s, [a, b, c], cyc("s2", 5));
    assert.equal(other[1], 0, "a new session avoids the endpoint that already has one");
    assert.deepEqual(
      scores(s, [a, c], cyc("s1", 5)).filter((x) => x === 1).length,
      1,
      "bound endpoint gone: least-bound",
    );
    assert.equal(s.stats().sessions, 1);
    scores(s, [a, b, c], cyc("s1", 20)); // sweep: 20 − 0 > 10
    assert.equal(s.stats().sessions, 0);
  });
});
