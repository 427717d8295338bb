// The scheduler end to end: failures (503/429), failover order, explanations, the in-flight
// lifecycle through the hooks, P/D profiles.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import type { InflightLoadProducer } from "../src/scheduler/plugins/inflight/producer.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { chat, completion, endpoint } from "../src/scheduler/testing.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
const loadOnly = readFileSync("config/examples/load-only.yaml", "utf8");
const eps = [
  endpoint("a:1", { waitingQueueSize: 4, kvCacheUsagePercent: 0.5 }),
  endpoint("b:1", { waitingQueueSize: 0, kvCacheUsagePercent: 0.5 }),
  endpoint("c:1", { waitingQueueSize: 2, kvCacheUsagePercent: 0.1 }, { zone: "z" }),
];

describe("schedule", () => {
  it("no candidates → 503 rejected-no-endpoints", async () => {
    const { scheduler } = await createScheduler(loadOnly, { hasher: h });
    const r = scheduler.schedule(completion("r", "x"), [], 0);
    assert.equal(r.target, null);
    assert.deepEqual(r.failure && { status: r.failure.status, reason: r.failure.reason }, {
      status: 503,
      reason: "rejected-no-endpoints",
    });
  });

  it("filters removing every candidate → 429 rejected-saturated naming the filter", async () => {
    const { scheduler } = await createScheduler(
      `${HEAD}plugins:\n- type: label-selector-filter\n  name: gpu\n  parameters: { matchLabels: { gpu: b200 } }\n- type: queue-scorer\n`,
      { hasher: h },
    );
    const r = scheduler.schedule(completion("r", "x"), eps, 0, { explain: true });
    assert.equal(r.failure?.status, 429);
    assert.equal(r.failure?.reason, "rejected-saturated");
    assert.match(r.failure?.message ?? "", /"gpu"/);
    assert.deepEqual(
      r.explanation?.profiles.default.candidates.map((c) => c.removedBy),
      ["gpu", "gpu", "gpu"],
    );
  });

  it("picks the best total and lists the rest as fallbacks by score", async () => {
    const { scheduler } = await createScheduler(loadOnly, { hasher: h });
    // queue (min-max): a 0, b 1, c 0.5; kv: a 0.5, b 0.5, c 0.9 → totals a 0.5, b 1.5, c 1.4
    const r = scheduler.schedule(completion("r", "x"), eps, 0);
    assert.equal(r.target?.id, "b:1");
    assert.deepEqual(
      r.profiles.default.fallbacks.map((e) => e.id),
      ["c:1", "a:1"],
    );
    assert.equal(r.failure, null);
  });

  it("explains per candidate raw and weighted scores, removals, the pick and the profiles run", async () => {
    const { scheduler } = await createScheduler(
      `${HEAD}plugins:\n- type: label-selector-filter\n  name: not-z\n  parameters: { matchExpressions: [{ key: zone, operator: DoesNotExist }] }\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: not-z\n  - pluginRef: queue-scorer\n    weight: 2\n  - pluginRef: kv-cache-utilization-scorer\n`,
      { hasher: h },
    );
    const r = scheduler.schedule(completion("r7", "x"), eps, 0, { explain: true });
    const x = r.explanation;
    assert.ok(x);
    assert.deepEqual(x.profilesRun, ["default"]);
    assert.equal(x.requestId, "r7");
    const p = x.profiles.default;
    assert.deepEqual(p.picked, ["b:1"]);
    assert.equal(p.picker, "max-score-picker");
    assert.deepEqual(p.filters, ["not-z"]);
    const [ca, cb, cc] = p.candidates;
    assert.deepEqual(cc, { id: "c:1", total: null, scores: [], removedBy: "not-z" });
    assert.deepEqual(ca.scores, [
      { name: "queue-scorer", type: "queue-scorer", raw: 0, weight: 2, weighted: 0 },
      {
        name: "kv-cache-utilization-scorer",
        type: "kv-cache-utilization-scorer",
        raw: 0.5,
        weight: 1,
        weighted: 0.5,
      },
    ]);
    assert.equal(ca.total, 0.5);
    assert.equal(cb.total, 2.5);
    assert.equal(scheduler.schedule(completion("r8", "x"), eps, 0).explanation, undefined);
  });

  it("an explanation shows the next pick without changing the scheduler's random sequence", async () => {
    const config = `${HEAD}plugins:\n- type: random-picker\n`;
    const pool = Array.from({ length: 50 }, (_, i) => endpoint(`e${i}:1`));
    const pick = (s: { schedule: typeof scheduler.schedule }, explain: boolean, k: number) =>
      s.schedule(completion(`r${k}`, "x"), pool, 0, { explain }).target?.id;
    const { scheduler } = await createScheduler(config, { hasher: h, seed: 9 });
    const { scheduler: twin } = await createScheduler(config, { hasher: h, seed: 9 });
    const picks = new Set<string | undefined>();
    for (let k = 0; k < 20; k++) {
      const shown = pick(scheduler, true, k);
      assert.equal(pick(scheduler, true, k), shown, "explaining twice shows the same pick");
      const real = pick(scheduler, false, k);
      assert.equal(real, shown, "the real pick is the one explained");
      assert.equal(pick(twin, false, k), real, "same sequence as a scheduler never asked to explain");
      picks.add(real);
    }
    assert.ok(picks.size > 5, "the picks are random, not constant");
  });
});

describe("in-flight lifecycle", () => {
  it("counts uncached prompt tokens at the pick, releases them at the first chunk and the request at the end", async () => {
    const { scheduler } = await createScheduler(
      `${HEAD}plugins:\n- type: token-load-scorer\n- type: prefix-cache-scorer\n`,
      { hasher: h },
    );
    const inflight = scheduler.plugins.get("inflight-load-producer") as InflightLoadProducer;
    const req = completion("r1", "x".repeat(1000)); // 250 pseudo-tokens, 4 blocks of 64
    const r = scheduler.schedule(req, eps, 0);
    const id = r.target?.id as string;
    scheduler.onPicked(req, r, 0);
    // nothing cached yet: (4 blocks − 0)·64 indexed + max(0, 250 − 256) tail = 256
    assert.deepEqual(inflight.load(id), { requests: 1, tokens: 256 });
    scheduler.onResponseStarted(req, id, 1);
    assert.deepEqual(inflight.load(id), { requests: 1, tokens: 0 });
    scheduler.onResponseComplete(req, id, 2);
    assert.deepEqual(inflight.load(id), { requests: 0, tokens: 0 });
    assert.equal(inflight.stats().trackedRequests, 0);

    const again = completion("r2", "x".repeat(1000));
    const r2 = scheduler.schedule(again, eps, 3);
    assert.equal(r2.target?.id, id, "the cached endpoint wins");
    scheduler.onPicked(again, r2, 3);
    assert.deepEqual(inflight.load(id), { requests: 1, tokens: 0 }, "fully cached: no uncached tokens");
  });

  it("moves the load to the endpoint that actually served after a failover", async () => {
    const { scheduler } = await createScheduler(readFileSync("config/examples/least-request.yaml", "utf8"), {
      hasher: h,
    });
    const inflight = scheduler.plugins.get("inflight-load-producer") as InflightLoadProducer;
    const req = completion("r1", "y".repeat(40));
    const r = scheduler.schedule(req, eps, 0);
    scheduler.onPicked(req, r, 0);
    const other = eps.find((e) => e.id !== r.target?.id)?.id as string;
    scheduler.onResponseStarted(req, other, 1);
    assert.equal(inflight.load(r.target?.id as string).requests, 0);
    assert.equal(inflight.load(other).requests, 1);
    scheduler.onResponseComplete(req, other, 2);
    assert.equal(inflight.stats().inflightRequests, 0);
  });

  it("least-request spreads concurrent requests", async () => {
    const { scheduler } = await createScheduler(readFileSync("config/examples/least-request.yaml", "utf8"), {
      hasher: h,
      seed: 5,
    });
    const picked = [0, 1, 2].map((k) => {
      const req = completion(`r${k}`, "z");
      const r = scheduler.schedule(req, eps, 0);
      scheduler.onPicked(req, r, 0);
      return r.target?.id;
    });
    assert.equal(new Set(picked).size, 3);
  });
});

describe("P/D disaggregation", () => {
  const pd = [
    endpoint("p1:1", {}, { "llm-d.ai/role": "prefill" }),
    endpoint("d1:1", {}, { "llm-d.ai/role": "decode" }),
    endpoint("d2:1", { waitingQueueSize: 3 }, { "llm-d.ai/role": "decode" }),
  ];
  it("runs decode (primary) then prefill while the decode target lacks ≥ 16 tokens; decode only once cached", async () => {
    const { scheduler } = await createScheduler(readFileSync("config/examples/pd.yaml", "utf8"), {
      hasher: h,
    });
    const req = chat("r1", "S".repeat(2000), "question");
    const r = scheduler.schedule(req, pd, 0, { explain: true });
    assert.equal(r.primaryProfile, "decode");
    assert.equal(r.target?.id, "d1:1");
    assert.equal(r.profiles.prefill?.target?.id, "p1:1");
    assert.deepEqual(r.explanation?.profilesRun, ["decode", "prefill"]);
    scheduler.onPicked(req, r, 0);
    const again = scheduler.schedule(chat("r1b", "S".repeat(2000), "question"), pd, 1);
    assert.equal(again.target?.id, "d1:1");
    assert.equal(again.profiles.prefill, undefined, "prompt cached on the decode target: no prefill stage");
  });
});
