/**
 * The fleet simulator's event loop: event order, its invariants on a small loaded fleet (every
 * request resolved exactly once, monotonic clock, hooks called once each, records well formed),
 * metric staleness (the router sees the last scrape, never fresher), and determinism (same seed,
 * byte-identical results).
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { aggregate } from "../src/bench/metrics.ts";
import { parseResultsFile } from "../src/bench/results.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import { admissionFromConfig } from "../src/flow/admission.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import type { EndpointMetrics } from "../src/scheduler/types.ts";
import { EventQueue, Priority } from "../src/sim/fleet/event-queue.ts";
import { type FleetRunOptions, runFleet } from "../src/sim/fleet/fleet.ts";
import { parseScenario, type Scenario } from "../src/sim/fleet/scenario.ts";
import { simulate, stripWallClock } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-loop.yaml");

/** 4 replicas of Llama-3.1-8B with a small KV cache (preemptions), 200 shared-prefix requests. */
function scenario(extra = "", seed = 7): Scenario {
  return parseScenario(
    `
name: loop
seed: ${seed}
fleet: { replicas: 4, profile: llama-3.1-8b-h100, kvTokens: 12000, maxModelLen: 4096, maxNumSeqs: 32 }
routers:
  - { name: approximate, config: ../config/examples/estimated.yaml }
  - { name: load, config: ../config/examples/load-only.yaml }
workload:
  workload: shared-prefix
  numRequests: 200
  options: { numGroups: 10, promptsPerGroup: 4, systemPromptLen: 800, questionLen: { mean: 200, std: 80 }, outputLen: { mean: 150, std: 60 } }
  arrival: { type: poisson, rate: 150 }
${extra}`,
    FILE,
  );
}

async function run(sc: Scenario, router = 0, over: Partial<FleetRunOptions> = {}) {
  const created = await createScheduler(sc.routers[router].configText, { seed: sc.seed });
  const workload = generateWorkload(sc.workload);
  const base: FleetRunOptions = {
    fleet: sc.fleet,
    workload,
    scheduler: created.scheduler,
    admission: admissionFromConfig(created.config).admission,
    seed: sc.seed,
    scrapeInterval: sc.scrapeInterval,
    gatewayDelay: sc.gatewayDelay,
    routerTokenizer: sc.routerTokenizer,
  };
  return { workload, scheduler: created.scheduler, opts: { ...base, ...over } };
}

describe("event queue", () => {
  it("orders by time, then priority, then insertion", () => {
    const q = new EventQueue();
    q.push(1, Priority.ARRIVAL, "arrival");
    q.push(1, Priority.STEP_END, "step-end", 0);
    q.push(0.5, Priority.STEP_START, "step-start", 1);
    q.push(1, Priority.STEP_END, "step-end", 2);
    q.push(1, Priority.SCRAPE, "scrape");
    const got: string[] = [];
    for (let e = q.pop(); e; e = q.pop()) got.push(`${e.time}:${e.kind}:${e.replica}`);
    assert.deepEqual(got, [
      "0.5:step-start:1",
      "1:step-end:0",
      "1:step-end:2",
      "1:scrape:-1",
      "1:arrival:-1",
    ]);
  });
});

describe("fleet loop invariants", () => {
  it("resolves every request once, keeps the clock monotonic and calls each hook once", async () => {
    const sc = scenario();
    const { workload, scheduler, opts } = await run(sc);
    const picked = new Map<string, number>();
    const started = new Map<string, number>();
    const completed = new Map<string, number>();
    const bump = (m: Map<string, number>, id: string) => m.set(id, (m.get(id) ?? 0) + 1);
    const onPicked = scheduler.onPicked.bind(scheduler);
    const onStarted = scheduler.onResponseStarted.bind(scheduler);
    const onComplete = scheduler.onResponseComplete.bind(scheduler);
    scheduler.onPicked = (req, res, now) => {
      bump(picked, req.requestId);
      onPicked(req, res, now);
    };
    scheduler.onResponseStarted = (req, id, now) => {
      bump(started, req.requestId);
      onStarted(req, id, now);
    };
    scheduler.onResponseComplete = (req, id, now) => {
      bump(completed, req.requestId);
      onComplete(req, id, now);
    };
    let last = -1;
    const res = runFleet({
      ...opts,
      observer: {
        onEvent: (e) => {
          assert.ok(e.time >= last, `clock went back: ${e.time} < ${last}`);
          last = e.time;
        },
      },
    });
    assert.equal(res.records.length, workload.requests.length);
    assert.equal(res.counters.completed + res.counters.dropped, workload.requests.length);
    assert.ok(res.fleet.preemptions !== null && res.fleet.preemptions > 0, "the small KV cache preempts");
    for (const [i, r] of res.records.entries()) {
      const spec = workload.requests[i];
      assert.equal(r.id, spec.id);
      assert.ok(r.end >= r.start);
      if (r.error) continue;
      assert.equal(picked.get(r.id), 1, `${r.id} picked once`);
      assert.equal(started.get(r.id), 1, `${r.id} started once`);
      assert.equal(completed.get(r.id), 1, `${r.id} completed once`);
      assert.equal(r.completionTokens, spec.maxTokens, "ignore_eos: exactly max_tokens");
      assert.equal(r.chunkTimes.length, r.completionTokens, "one chunk per step per request");
      for (let k = 1; k < r.chunkTimes.length; k++) assert.ok(r.chunkTimes[k] > r.chunkTimes[k - 1]);
      assert.ok(r.chunkTimes[0] > r.start, "first token after arrival");
      assert.equal(r.chunkTimes[r.chunkTimes.length - 1], r.end);
      assert.ok(r.cachedTokens !== undefined && r.cachedTokens < r.promptTokens);
    }
    assert.equal(res.endTime, last);
  });

  it("counts engine rejections as dropped exactly once and still releases the scheduler's load", async () => {
    // maxModelLen 1100: prompts of 800 + ~200 tokens plus their output sometimes exceed it.
    const sc = scenario().fleet;
    const { scheduler, opts } = await run(scenario());
    const completed = new Map<string, number>();
    const onComplete = scheduler.onResponseComplete.bind(scheduler);
    scheduler.onResponseComplete = (req, id, now) => {
      completed.set(req.requestId, (completed.get(req.requestId) ?? 0) + 1);
      onComplete(req, id, now);
    };
    const res = runFleet({ ...opts, fleet: { ...sc, maxModelLen: 1100 } });
    const dropped = res.records.filter((r) => r.error);
    assert.ok(dropped.length > 0 && dropped.length < res.records.length, "some, not all, rejected");
    assert.equal(res.counters.dropped, dropped.length);
    for (const r of dropped) {
      assert.equal(r.error?.kind, "http_400");
      assert.equal(r.chunkTimes.length, 0);
      assert.equal(completed.get(r.id), 1);
    }
  });
});

describe("between-request measurements", () => {
  it("calls Scheduler.refresh() every refreshIntervalS of virtual time, after the scrape at the same instant, and never without a refresher", async () => {
    const sc = scenario("");
    const locality = `{ plugins: [ { type: locality-filter, parameters: { remeasureMs: 30 } }, { type: queue-scorer }, { type: max-score-picker } ] }`;
    const created = await createScheduler(locality, { seed: 1 });
    const { opts } = await run(sc);
    const s = created.scheduler;
    assert.equal(s.refreshIntervalS, 0.03);
    const calls: number[] = [];
    const real = s.refresh.bind(s);
    s.refresh = (now) => {
      calls.push(now);
      real(now);
    };
    let lastScrape = -1;
    let scrapeFirst = true;
    let shared = 0;
    const res = runFleet({
      ...opts,
      scheduler: s,
      admission: admissionFromConfig(created.config).admission,
      observer: {
        onEvent: (e) => {
          if (e.kind === "scrape") lastScrape = e.time;
          if (e.kind === "refresh" && e.time === Math.round(e.time / sc.scrapeInterval) * sc.scrapeInterval) {
            shared++;
            scrapeFirst &&= lastScrape === e.time;
          }
        },
      },
    });
    const end = Math.max(...res.records.map((r) => r.end));
    assert.ok(calls.length >= Math.floor(end / 0.03), `${calls.length} refreshes in ${end} s`);
    for (const [k, t] of calls.entries()) assert.ok(Math.abs(t - k * 0.03) < 1e-9, `refresh ${k} at ${t}`);
    assert.ok(
      shared > 0 && scrapeFirst,
      `a refresh at a scrape's instant reads that scrape (${shared} shared)`,
    );
    // A config without a refresher: no refresh events at all.
    const plain = await run(sc);
    let refreshes = 0;
    runFleet({ ...plain.opts, observer: { onEvent: (e) => void (e.kind === "refresh" && refreshes++) } });
    assert.equal(plain.scheduler.refreshIntervalS, null);
    assert.equal(refreshes, 0);
  });
});

describe("closed-loop warm-up", () => {
  it("marks each user's first request warm-up, and the measured figures leave those out", async () => {
    const sc = scenario();
    const workload = generateWorkload({
      ...sc.workload,
      numRequests: 40,
      arrival: { type: "closed", users: 10, warmup: 1 },
    });
    const { opts } = await run(sc, 0, { workload });
    const res = runFleet(opts);
    const warm = res.records.filter((r) => r.warmup);
    const first = new Set(workload.requests.filter((r) => !r.after).map((r) => r.id));
    assert.deepEqual(warm.map((r) => r.id).sort(), [...first].sort());
    assert.equal(aggregate(res.records).requests, 30);
  });
});

describe("metric staleness", () => {
  it("the scheduler sees each endpoint's metrics as of the last scrape, never fresher", async () => {
    const sc = scenario("scrapeIntervalMs: 250\ngatewayDelayMs: 3");
    const { opts } = await run(sc, 1);
    const scrapes: Array<Map<number, EndpointMetrics>> = [];
    let checked = 0;
    let stale = 0;
    runFleet({
      ...opts,
      observer: {
        onScrape: (now, i, m) => {
          scrapes[i] ??= new Map();
          scrapes[i].set(now, m);
        },
        onSchedule: (now, _req, candidates) => {
          for (const [i, c] of candidates.entries()) {
            const m = c.metrics;
            assert.ok(m !== null, "scraped at t=0 before any arrival");
            const latest = Math.max(...[...scrapes[i].keys()].filter((t) => t <= now));
            assert.equal(m.updateTime, latest, "metrics are from the latest scrape");
            assert.equal(m, scrapes[i].get(latest), "exactly what that scrape read");
            assert.ok(now - m.updateTime < 0.25 + 1e-9);
            if (now > m.updateTime) stale++;
            checked++;
          }
        },
      },
    });
    assert.ok(checked > 0 && stale > 0);
  });

  it("with a scrape interval longer than the run, the router only ever sees the t=0 scrape", async () => {
    const { opts } = await run(scenario(), 1, { scrapeInterval: 1e6 });
    runFleet({
      ...opts,
      observer: {
        onSchedule: (_now, _req, candidates) => {
          for (const c of candidates) {
            assert.equal(c.metrics?.updateTime, 0);
            assert.equal(c.metrics?.waitingQueueSize, 0);
          }
        },
      },
    });
  });
});

describe("determinism", () => {
  it("the same seed gives byte-identical results; another seed does not", async () => {
    const first = await simulate(scenario());
    parseResultsFile(JSON.stringify(first)); // readable by the bench's results tooling
    assert.equal(first.simulated, true);
    assert.equal(first.time_unit, "simulated_seconds");
    assert.deepEqual(
      first.runs.map((r) => r.router),
      ["approximate", "load"],
    );
    const a = JSON.stringify(stripWallClock(first));
    const b = JSON.stringify(stripWallClock(await simulate(scenario())));
    assert.equal(a, b);
    const c = JSON.stringify(stripWallClock(await simulate(scenario("", 8))));
    assert.notEqual(a, c);
  });

  it("the engines' block hash (fast64 or vLLM's sha256_cbor) does not change any result", async () => {
    const fast = await simulate(scenario());
    const sha = await simulate(scenario("blockHash: sha256_cbor"));
    assert.equal((sha.scenario.fleet as { block_hash: string }).block_hash, "sha256_cbor");
    assert.equal(JSON.stringify(sha.runs), JSON.stringify(fast.runs));
  });
});
