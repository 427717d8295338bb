/**
 * llm-d's predicted-latency plugins: the producer's fallback below minSamples and its learning through
 * the scheduler's hooks, latency-scorer's ordering (and composite fallback), slo-headroom-tier-filter's
 * tiers, latency-slo-admitter's refusal (status and reason), prefix-cache-affinity-filter with
 * ttftSource: latencyPredictor, SLO header parsing, and config loading with llm-d's names.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { parseSloHeaders } from "../src/gateway/slo-headers.ts";
import { ConfigError } from "../src/scheduler/errors.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import { PrefixCacheAffinityFilter } from "../src/scheduler/plugins/filters/prefix-affinity.ts";
import { NO_VALID_ENDPOINT } from "../src/scheduler/plugins/latency/admitter.ts";
import type { LatencyPredictionInfo } from "../src/scheduler/plugins/latency/data.ts";
import { latencyKey } from "../src/scheduler/plugins/latency/data.ts";
import { PredictedLatencyProducer } from "../src/scheduler/plugins/latency/producer.ts";
import { LatencyScorer, latencyScorerParams } from "../src/scheduler/plugins/latency/scorer.ts";
import { SloHeadroomTierFilter } from "../src/scheduler/plugins/latency/tier-filter.ts";
import type { Scheduler } from "../src/scheduler/scheduler.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, cycleFor, endpoint, prefixInfo } from "../src/scheduler/testing.ts";
import type { EndpointState, RequestFacts } from "../src/scheduler/types.ts";

const EXAMPLE = readFileSync(new URL("../config/examples/predicted-latency.yaml", import.meta.url), "utf8");

function pred(p: Partial<LatencyPredictionInfo> & { ttftHeadroom: number }): LatencyPredictionInfo {
  return {
    ttftValid: p.ttftHeadroom > 0,
    tpotValid: (p.tpotHeadroom ?? 0) >= 0,
    tpotHeadroom: 0,
    ttftMs: 100,
    tpotMs: 10,
    dispatchedRequestCount: 1,
    ...p,
  };
}

/** A cycle whose producer "lp" predicted `byId` (undefined: no predictions, model not ready). */
function cycleWith(byId: Record<string, LatencyPredictionInfo> | undefined, eps: EndpointState[], seed = 1) {
  const cycle = cycleFor(completion("r", "hello"), eps, 0, seed);
  cycle.set(latencyKey("lp"), {
    get: (id: string) => byId?.[id],
    unavailable: byId === undefined ? "latency model not ready (TTFT 3/100 samples)" : null,
  });
  cycle.set(prefixKey("px"), prefixInfo(10, 16, { "c:1": 10 }));
  return cycle;
}

const E = ["a:1", "b:1", "c:1"].map((id) => endpoint(id));

function scorer(extra: Record<string, unknown> = {}) {
  return new LatencyScorer(
    "ls",
    latencyScorerParams.parse({
      latencyPredictionInfoProducerName: "lp",
      prefixMatchInfoProducerName: "px",
      ...extra,
    }),
  );
}

describe("latency-scorer", () => {
  it("positive headroom, strategy least: the endpoint closest to its SLO scores highest", () => {
    const c = cycleWith(
      {
        "a:1": pred({ ttftHeadroom: 300 }),
        "b:1": pred({ ttftHeadroom: 20 }),
        "c:1": pred({ ttftHeadroom: 150 }),
      },
      E,
    );
    const s = Array.from(scorer().score(c, E)).slice(0, 3);
    // |headroom| 300, 20, 150 over the range 280: least → (⌊(1 − n)·100⌋ + 1)/100.
    assert.deepEqual(s, [0.01, 1.01, 0.54]);
    assert.deepEqual(scorer().explain(c), { mode: "positive" });
  });

  it("strategy most reverses the order; negatives among positives score 0", () => {
    const c = cycleWith(
      {
        "a:1": pred({ ttftHeadroom: 300 }),
        "b:1": pred({ ttftHeadroom: 20 }),
        "c:1": pred({ ttftHeadroom: -5 }),
      },
      E,
    );
    const s = Array.from(scorer({ headroomSelectionStrategy: "most" }).score(c, E)).slice(0, 3);
    assert.ok(s[0] > s[1], `most headroom first: ${s}`);
    assert.equal(s[2], 0);
  });

  it("all negative: idle endpoints only, then the least severe deficit bucket, smallest deficit first", () => {
    const idle = cycleWith(
      {
        "a:1": pred({ ttftHeadroom: -500 }),
        "b:1": pred({ ttftHeadroom: -50 }),
        "c:1": pred({ ttftHeadroom: -900, dispatchedRequestCount: 0 }),
      },
      E,
    );
    const si = Array.from(scorer().score(idle, E)).slice(0, 3);
    assert.ok(si[2] > 0 && si[0] === 0 && si[1] === 0, `only the idle one: ${si}`);
    const buckets = cycleWith(
      {
        "a:1": pred({ ttftHeadroom: -500, tpotHeadroom: -1 }),
        "b:1": pred({ ttftHeadroom: -50, tpotHeadroom: -1 }),
        "c:1": pred({ ttftHeadroom: 40, tpotHeadroom: -3 }),
      },
      E,
    );
    const sb = Array.from(scorer().score(buckets, E)).slice(0, 3);
    assert.ok(sb[2] > 0 && sb[0] === 0 && sb[1] === 0, `TPOT-only deficit beats TTFT deficits: ${sb}`);
    const both = cycleWith(
      {
        "a:1": pred({ ttftHeadroom: -500 }),
        "b:1": pred({ ttftHeadroom: -50 }),
        "c:1": pred({ ttftHeadroom: -200 }),
      },
      E,
    );
    const s = Array.from(scorer().score(both, E)).slice(0, 3);
    assert.ok(s[1] > s[2] && s[2] > s[0], `smallest deficit first: ${s}`);
    assert.deepEqual(scorer().explain(both), { mode: "ttft-deficit" });
  });

  it("without predictions falls back to the composite of KV headroom, queue and prefix, and says so", () => {
    const eps = [
      endpoint("a:1", { kvCacheUsagePercent: 0.9, waitingQueueSize: 4 }),
      endpoint("b:1", { kvCacheUsagePercent: 0.1, waitingQueueSize: 0 }),
      endpoint("c:1", { kvCacheUsagePercent: 0.5, waitingQueueSize: 2 }),
    ];
    const c = cycleWith(undefined, eps);
    const sc = scorer();
    const s = Array.from(sc.score(c, eps)).slice(0, 3);
    // a: (0.1 + 0 + 0)/3, b: (0.9 + 1 + 0)/3, c: (0.5 + 0.5 + 1)/3 (c holds the whole prefix).
    assert.deepEqual(s, [0.03, 0.63, 0.67]);
    const ex = sc.explain(c) as { mode: string; fallback: string };
    assert.equal(ex.mode, "composite-fallback");
    assert.match(ex.fallback, /not ready \(TTFT 3\/100 samples\)/);
  });
});

describe("slo-headroom-tier-filter", () => {
  const tiers = {
    "a:1": pred({ ttftHeadroom: 100 }),
    "b:1": pred({ ttftHeadroom: -1 }),
    "c:1": pred({ ttftHeadroom: 50, tpotHeadroom: -2 }),
  };
  const f = (eps: number) =>
    new SloHeadroomTierFilter("t", { epsilonExploreNeg: eps, latencyPredictionInfoProducerName: "lp" });

  it("keeps the positive tier (both headrooms ≥ 0), or the negative one with probability epsilonExploreNeg", () => {
    assert.deepEqual(
      f(0)
        .filter(cycleWith(tiers, E), E)
        .map((e) => e.id),
      ["a:1"],
    );
    assert.deepEqual(
      f(1)
        .filter(cycleWith(tiers, E), E)
        .map((e) => e.id),
      ["b:1", "c:1"],
    );
    let explored = 0;
    const filter = f(0.25);
    for (let seed = 1; seed <= 400; seed++)
      if (filter.filter(cycleWith(tiers, E, seed), E).length === 2) explored++;
    assert.ok(explored > 60 && explored < 140, `≈25% of 400 explore the negative tier, got ${explored}`);
  });

  it("an endpoint without a prediction is in the negative tier; no predictions at all keeps everything", () => {
    const partial = cycleWith({ "a:1": pred({ ttftHeadroom: -3 }) }, E);
    assert.deepEqual(
      f(0)
        .filter(partial, E)
        .map((e) => e.id),
      ["a:1", "b:1", "c:1"],
    );
    const none = cycleWith(undefined, E);
    const filter = f(0);
    assert.equal(filter.filter(none, E).length, 3);
    assert.deepEqual(filter.explain(none), {
      tier: "no-predictions",
      fallback: "no latency predictions yet: every endpoint kept",
    });
  });
});

describe("prefix-cache-affinity-filter, ttftSource: latencyPredictor", () => {
  const filter = () =>
    new PrefixCacheAffinityFilter("aff", {
      affinityThreshold: 0.8,
      explorationProbability: 0,
      maxTTFTPenaltyMs: 5000,
      ttftSource: "latencyPredictor",
      peakPrefillThroughput: 15928,
      learnPrefillThroughput: true,
      releaseWhenSlotsFull: false,
      prefixMatchInfoProducerName: "px",
      latencyPredictionInfoProducerName: "lp",
    });
  const t = (ttftMs: number) => pred({ ttftHeadroom: -ttftMs, ttftMs });

  it("sticks to the warm endpoint unless its predicted TTFT is more than maxTTFTPenaltyMs worse", () => {
    const ok = cycleWith({ "a:1": t(200), "b:1": t(300), "c:1": t(4000) }, E);
    assert.deepEqual(
      filter()
        .filter(ok, E)
        .map((e) => e.id),
      ["c:1"],
    );
    const slow = cycleWith({ "a:1": t(200), "b:1": t(300), "c:1": t(6000) }, E);
    assert.equal(filter().filter(slow, E).length, 3);
  });

  it("keeps every endpoint while the model has no predictions (llm-d's missing signal), and says so", () => {
    const f = filter();
    const c = cycleWith(undefined, E);
    assert.equal(f.filter(c, E).length, 3);
    assert.equal((f.explain(c) as { decision: string }).decision, "missing-signal");
  });
});

/** n requests through the scheduler's hooks; TTFT is 50 + 300 ms × the endpoint's KV use, TPOT 10 ms. */
function train(s: Scheduler, eps: EndpointState[], n: number, extra: Partial<RequestFacts> = {}): void {
  let now = 0;
  for (let k = 0; k < n; k++) {
    const req = completion(`t${k}`, `prompt ${k % 7} `.repeat(20), extra);
    const r = s.schedule(req, eps, now);
    if (r.target === null) throw new Error(`no target: ${r.failure?.message}`);
    s.onPicked(req, r, now);
    const ttft = (50 + 300 * (r.target.metrics?.kvCacheUsagePercent ?? 0)) / 1000;
    s.onResponseStarted(req, r.target.id, now + ttft);
    s.onResponseComplete(req, r.target.id, now + ttft + 0.01 * 99, { outputTokens: 100 });
    now += 1;
  }
}

function producerOf(s: Scheduler): PredictedLatencyProducer {
  const p = s.plugins.get("predicted-latency-producer");
  assert.ok(p instanceof PredictedLatencyProducer);
  return p;
}

describe("predicted-latency-producer through the scheduler", () => {
  it("predicts nothing below minSamples and says so on /explain; learns TTFT and TPOT from the hooks", async () => {
    const { scheduler } = await createScheduler(EXAMPLE, { seed: 3 });
    const eps = ["a:1", "b:1", "c:1"].map((id, i) =>
      endpoint(id, { kvCacheUsagePercent: 0.1 + 0.2 * i, runningRequestsSize: 2 }),
    );
    train(scheduler, eps, 99);
    const before = scheduler.schedule(completion("x", "hi"), eps, 200, { explain: true });
    const plugins = before.explanation?.plugins ?? {};
    const lp = plugins["predicted-latency-producer"] as { predictions: unknown; fallback: string };
    assert.equal(lp.predictions, null);
    assert.match(lp.fallback, /TTFT 99\/100/);
    assert.equal((plugins["latency-scorer"] as { mode: string }).mode, "composite-fallback");
    train(scheduler, eps, 60);
    const after = scheduler.schedule(completion("y", "hi", { sloTtftMs: 120, sloTpotMs: 50 }), eps, 300, {
      explain: true,
    });
    const p = after.explanation?.plugins?.["predicted-latency-producer"] as {
      predictions: Record<string, { ttftMs: number; tpotMs: number; valid: boolean }>;
    };
    assert.ok(p.predictions !== null, "predictions once every model has 100 samples");
    const a = p.predictions["a:1"];
    const c = p.predictions["c:1"];
    assert.ok(Math.abs(a.tpotMs - 10) < 1, `TPOT learned ≈ 10 ms, got ${a.tpotMs}`);
    assert.ok(Math.abs(a.ttftMs - 80) < 8, `a (80 ms) learned: ${a.ttftMs}`);
    assert.ok(Math.abs(c.ttftMs - 200) < 20, `c (200 ms) learned: ${c.ttftMs}`);
    assert.deepEqual(
      Object.entries(p.predictions)
        .filter(([, v]) => v.valid)
        .map(([id]) => id),
      ["a:1"],
      "only a is predicted under the 120 ms SLO",
    );
    assert.equal(after.target?.id, "a:1");
    assert.equal(producerOf(scheduler).stats().tpotSamples, 159);
  });
});

describe("latency-slo-admitter", () => {
  async function trained() {
    const { scheduler, config } = await createScheduler(EXAMPLE, { seed: 3 });
    const eps = ["a:1", "b:1"].map((id, i) =>
      endpoint(id, { kvCacheUsagePercent: 0.3 + 0.2 * i, runningRequestsSize: 3 }),
    );
    train(scheduler, eps, 150);
    return { scheduler, eps, batch: config.objectives.batch };
  }

  it("refuses a sheddable request whose SLO no busy, warm endpoint can meet: 500 with llm-d's message", async () => {
    const { scheduler, eps, batch } = await trained();
    assert.equal(batch, -1);
    const r = scheduler.schedule(completion("s", "hi", { priority: batch, sloTtftMs: 20 }), eps, 500, {
      explain: true,
    });
    assert.equal(r.target, null);
    assert.equal(r.failure?.status, 500);
    assert.equal(r.failure?.reason, null, "llm-d sets no dropped-reason header for an admitter's denial");
    assert.ok(r.failure?.message.startsWith(`request cannot be admitted: ${NO_VALID_ENDPOINT}`));
    assert.match(r.failure?.message ?? "", /retry later|relax the SLO/);
    assert.equal(r.explanation?.denied?.admitter, "latency-slo-admitter");
  });

  it("admits the same request when it is not sheddable, has no SLO, the SLO is reachable, or an endpoint is idle or cold", async () => {
    const { scheduler, eps } = await trained();
    const ok = (req: RequestFacts, e = eps) => scheduler.schedule(req, e, 500).target !== null;
    assert.ok(ok(completion("p0", "hi", { priority: 0, sloTtftMs: 20 })), "priority 0");
    assert.ok(ok(completion("noslo", "hi", { priority: -1 })), "no SLO");
    assert.ok(ok(completion("easy", "hi", { priority: -1, sloTtftMs: 5000 })), "an endpoint meets it");
    assert.ok(ok(completion("both", "hi", { priority: -1, sloTtftMs: 5000, sloTpotMs: 40 })), "both met");
    assert.ok(
      !ok(completion("tpot", "hi", { priority: -1, sloTtftMs: 5000, sloTpotMs: 2 })),
      "TPOT 2 ms is not",
    );
    const idle = [eps[0], endpoint("b:1", { kvCacheUsagePercent: 0.5, runningRequestsSize: 0 })];
    assert.ok(ok(completion("idle", "hi", { priority: -1, sloTtftMs: 20 }), idle), "an idle endpoint");
    const cold = [eps[0], endpoint("b:1", { kvCacheUsagePercent: 0.01, runningRequestsSize: 3 })];
    assert.ok(ok(completion("cold", "hi", { priority: -1, sloTtftMs: 20 }), cold), "a cold endpoint");
  });

  it("fails open before the model has predictions", async () => {
    const { scheduler } = await createScheduler(EXAMPLE, { seed: 3 });
    const eps = ["a:1", "b:1"].map((id) =>
      endpoint(id, { kvCacheUsagePercent: 0.4, runningRequestsSize: 3 }),
    );
    const r = scheduler.schedule(completion("s", "hi", { priority: -1, sloTtftMs: 1 }), eps, 0);
    assert.notEqual(r.target, null);
  });
});

describe("SLO headers", () => {
  it("reads llm-d's names and their x-slo-* aliases; the current name wins", () => {
    assert.deepEqual(parseSloHeaders({ "x-llm-d-slo-ttft-ms": "500", "x-slo-tpot-ms": "12.5" }), {
      sloTtftMs: 500,
      sloTpotMs: 12.5,
      notes: [],
    });
    assert.equal(parseSloHeaders({ "x-llm-d-slo-ttft-ms": "300", "x-slo-ttft-ms": "900" }).sloTtftMs, 300);
  });

  it("ignores values that are not a positive number of milliseconds, and says which and why", () => {
    for (const bad of ["abc", "", "-5", "0", "Infinity", "1e999", "12ms"]) {
      const s = parseSloHeaders({ "x-llm-d-slo-ttft-ms": bad });
      assert.equal(s.sloTtftMs, undefined, bad);
      assert.equal(s.notes.length, 1);
      assert.match(s.notes[0], /x-llm-d-slo-ttft-ms: .* ignored \(send a positive number of milliseconds/);
    }
    // A bad current name is not replaced by its alias: the client meant the first.
    assert.equal(parseSloHeaders({ "x-llm-d-slo-tpot-ms": "x", "x-slo-tpot-ms": "40" }).sloTpotMs, undefined);
  });
});

describe("config", () => {
  it("config/examples/predicted-latency.yaml loads with llm-d's names and no warnings", async () => {
    const { config, warnings } = await createScheduler(EXAMPLE);
    assert.deepEqual(warnings, []);
    const byName = Object.fromEntries(config.plugins.map((p) => [p.name, p]));
    assert.equal(byName["predicted-latency-producer"].parameters.streamingMode, true);
    assert.equal(byName["predicted-latency-producer"].parameters.sloBufferFactor, 1);
    assert.equal(byName["predicted-latency-producer"].parameters.contextTTL, "5m");
    assert.equal(
      byName["strict-affinity-filter"].parameters.latencyPredictionInfoProducerName,
      "predicted-latency-producer",
    );
    assert.equal(byName["latency-scorer"].parameters.ttftWeight, 0.8);
    assert.equal(byName["slo-headroom-tier-filter"].parameters.epsilonExploreNeg, 0.01);
    assert.equal(byName["latency-slo-admitter"].kind, "admitter");
  });

  it("a latency plugin without its producer gets one auto-added", async () => {
    const { config } = await createScheduler("plugins:\n- type: latency-scorer\n");
    const auto = config.plugins.find((p) => p.type === "predicted-latency-producer");
    assert.equal(auto?.origin, "auto");
  });

  const rejects = async (yaml: string, ...parts: string[]) => {
    await assert.rejects(createScheduler(`plugins:\n${yaml}`), (e: unknown) => {
      assert.ok(e instanceof ConfigError, String(e));
      for (const p of parts) assert.ok(e.message.includes(p), `${e.message} should mention ${p}`);
      return true;
    });
  };

  it("bad parameters are errors naming them", async () => {
    await rejects(
      "- type: predicted-latency-producer\n  parameters: { samplingMeen: 5 }\n",
      "samplingMeen",
      "samplingMean",
    );
    await rejects(
      "- type: predicted-latency-producer\n  parameters: { sloBufferFactor: 0 }\n",
      "sloBufferFactor",
    );
    await rejects(
      "- type: predicted-latency-producer\n  parameters: { contextTTL: 5 minutes }\n",
      "contextTTL",
      "duration",
    );
    await rejects(
      "- type: slo-headroom-tier-filter\n  parameters: { epsilonExploreNeg: 2 }\n",
      "epsilonExploreNeg",
    );
    await rejects(
      "- type: latency-scorer\n  parameters: { headroomSelectionStrategy: best }\n",
      "headroomSelectionStrategy",
    );
  });
});
