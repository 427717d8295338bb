// locality-filter: local first, spill to the nearest other locality only while saturated, hysteresis.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { type InFlightInfo, inflightKey } from "../src/scheduler/plugins/data.ts";
import {
  LocalityFilter,
  localityFilterSpec,
  REGION_LABEL,
  ZONE_LABEL,
} from "../src/scheduler/plugins/filters/locality.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState } from "../src/scheduler/types.ts";

const at = (id: string, region: string, zone: string, waiting = 0) =>
  endpoint(id, { waitingQueueSize: waiting }, { [REGION_LABEL]: region, [ZONE_LABEL]: zone });
const ids = (eps: readonly EndpointState[]) => eps.map((e) => e.id).sort();
const EAST = { [REGION_LABEL]: "us-east", [ZONE_LABEL]: "us-east-1a" };

/** A locality-filter (`params`) before the in-flight producer, a queue scorer and a max-score picker. */
const withInflight = (params: string) => `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: locality-filter
  parameters: { ${params} }
- type: inflight-load-producer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: locality-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
`;

function run(f: LocalityFilter, eps: EndpointState[], locality?: Record<string, string>) {
  const req = completion("r", "hello", locality ? { locality } : {});
  return ids(f.filter(cycleFor(req, eps, 0), eps));
}

describe("locality-filter", () => {
  it("keeps the origin's zone while it is not saturated; a missing label matches nothing", () => {
    const eps = [
      at("a:1", "us-east", "us-east-1a"),
      at("b:1", "us-east", "us-east-1b"),
      at("c:1", "us-west", "w"),
    ];
    assert.deepEqual(run(new LocalityFilter("f", { origin: EAST }), eps), ["a:1"]);
    // Origin with a region only: the zone label cannot match, so the whole region is the local group.
    assert.deepEqual(run(new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" } }), eps), [
      "a:1",
      "b:1",
    ]);
    // The request's own locality (set by the simulator's regional gateways) overrides the origin.
    assert.deepEqual(run(new LocalityFilter("f", { origin: EAST }), eps, { [REGION_LABEL]: "us-west" }), [
      "c:1",
    ]);
  });

  it("spills to the same region's other zone before another region; saturated local endpoints step aside", () => {
    const f = new LocalityFilter("f", { origin: EAST });
    // a's queue 5 = saturation 1.0 → b (same region) joins, a (saturated) steps aside; a+b average
    // 0.5 < 1 → west stays out.
    assert.deepEqual(
      run(f, [
        at("a:1", "us-east", "us-east-1a", 5),
        at("b:1", "us-east", "us-east-1b"),
        at("c:1", "us-west", "w"),
      ]),
      ["b:1"],
    );
    assert.equal(f.spilling(EAST), 1);
    // a has headroom again but the zone has not recovered (0.9 ≥ 0.8): a is a candidate beside b.
    assert.deepEqual(
      run(f, [
        at("a:1", "us-east", "us-east-1a", 4.5),
        at("b:1", "us-east", "us-east-1b"),
        at("c:1", "us-west", "w"),
      ]),
      ["a:1", "b:1"],
    );
    // The whole region saturated: west joins, and the region's saturated endpoints step aside.
    const all = [
      at("a:1", "us-east", "us-east-1a", 9),
      at("b:1", "us-east", "us-east-1b", 3),
      at("c:1", "us-west", "w"),
    ];
    assert.deepEqual(run(f, all), ["b:1", "c:1"]);
    assert.equal(f.spilling(EAST), 2);
  });

  it("orders other regions by rttMs and spills to the nearest first", () => {
    const f = new LocalityFilter("f", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      rttMs: { "us-east/eu-west": 80, "us-central/us-east": 30 },
    });
    const eps = [at("e:1", "us-east", "z", 9), at("w:1", "eu-west", "z"), at("c:1", "us-central", "z")];
    assert.deepEqual(run(f, eps), ["c:1"]);
  });

  it("keeps spilling until saturation falls below recoverThreshold (no flapping at the threshold)", () => {
    const f = new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    const fleet = (q: number) => [at("e:1", "us-east", "z", q), at("w:1", "us-west", "z")];
    assert.deepEqual(run(f, fleet(4)), ["e:1"]); // 0.8 < 1.0
    assert.deepEqual(run(f, fleet(5)), ["w:1"]); // 1.0: spill, and the saturated e steps aside
    // Back to 0.9 and 0.8: still ≥ recoverThreshold 0.8, so still spilling (without hysteresis: local).
    assert.deepEqual(run(f, fleet(4.5)), ["e:1", "w:1"]);
    assert.deepEqual(run(f, fleet(4)), ["e:1", "w:1"]);
    assert.deepEqual(run(f, fleet(3.5)), ["e:1"]); // 0.7 < 0.8: recovered
    assert.equal(f.spilling({ [REGION_LABEL]: "us-east" }), 0);
  });

  it("spill: false is local only, even when the local endpoints are saturated", () => {
    const f = new LocalityFilter("f", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      spill: false,
    });
    assert.deepEqual(run(f, [at("e:1", "us-east", "z", 50), at("w:1", "us-west", "z")]), ["e:1"]);
    // With no endpoint in the origin's region, the nearest group that has endpoints serves.
    assert.deepEqual(run(f, [at("w:1", "us-west", "z"), at("x:1", "eu", "z")]), ["x:1"]);
  });

  it("never returns an empty set; keeps an origin below spillThreshold local; drops only local endpoints at stepAsideThreshold (property)", () => {
    const regions = ["r0", "r1", "r2"];
    fc.assert(
      fc.property(
        fc.array(fc.record({ region: fc.constantFrom(...regions), q: fc.integer({ min: 0, max: 12 }) }), {
          minLength: 1,
          maxLength: 12,
        }),
        fc.constantFrom(...regions),
        fc.constantFrom(0.2, 0.5, 1),
        fc.constantFrom(undefined, 1),
        (specs, origin, spillThreshold, stepAsideThreshold) => {
          const eps = specs.map((s, i) => at(`e${i}:1`, s.region, "z", s.q));
          const f = new LocalityFilter("f", {
            origin: { [REGION_LABEL]: origin },
            labels: [REGION_LABEL],
            spillThreshold,
            recoverThreshold: spillThreshold / 2,
            ...(stepAsideThreshold === undefined ? {} : { stepAsideThreshold }),
          });
          const out = run(f, eps);
          assert.ok(out.length > 0);
          const local = specs.flatMap((s, i) =>
            s.region === origin ? [{ id: `e${i}:1`, sat: s.q / 5 }] : [],
          );
          // Nothing to spill to (every endpoint local) or no local endpoint: the nearest group serves whole.
          if (local.length === 0 || local.length === eps.length) return;
          const mean = (r: string) => {
            const sats = specs.filter((s) => s.region === r).map((s) => s.q / 5);
            return sats.length === 0 ? Number.NaN : sats.reduce((x, y) => x + y, 0) / sats.length;
          };
          const localIds = local.map((l) => l.id).sort();
          // Other regions with endpoints and headroom (not saturated): the only places worth spilling to.
          const roomy = regions.filter((r) => r !== origin && mean(r) < 1);
          if (mean(origin) < spillThreshold) assert.deepEqual(out, localIds, "below the threshold: local");
          else if (roomy.length === 0) assert.deepEqual(out, localIds, "nowhere with headroom: stay home");
          else {
            // A local endpoint steps aside at stepAsideThreshold (default: the spill threshold).
            const aside = stepAsideThreshold ?? spillThreshold;
            for (const l of local)
              assert.equal(out.includes(l.id), l.sat < aside, `${l.id} at saturation ${l.sat}`);
            for (const id of out) {
              const r = specs[Number(id.slice(1, -2))].region;
              assert.ok(r === origin || roomy.includes(r), `${id} in ${r}, which is saturated`);
            }
          }
        },
      ),
      { seed: 17, numRuns: 300 },
    );
  });

  it("loads from EndpointPickerConfig and beats the queue scorer's preference; bad hysteresis is a config error", async () => {
    const yaml = (params: string) => `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: locality-filter
  parameters: ${params}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: locality-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
`;
    const { scheduler } = await createScheduler(yaml(`{ origin: { ${REGION_LABEL}: us-east } }`), {
      seed: 1,
    });
    const east = at("e:1", "us-east", "z", 3);
    const west = at("w:1", "us-west", "z", 0);
    assert.equal(scheduler.schedule(completion("r", "hi"), [east, west], 0).target?.id, "e:1");
    const busy = at("e:1", "us-east", "z", 6); // saturated: the emptier remote replica wins
    assert.equal(scheduler.schedule(completion("r2", "hi"), [busy, west], 0).target?.id, "w:1");
    await assert.rejects(
      createScheduler(yaml("{ spillThreshold: 0.5, recoverThreshold: 0.9 }")),
      /recoverThreshold must not exceed spillThreshold/,
    );
    assert.equal(localityFilterSpec.kvgateOnly, true);
  });

  it("passes over a region as saturated as its own: two busy regions do not trade their traffic", () => {
    const f = new LocalityFilter("f", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      rttMs: { "us-east/us-west": 30, "us-east/eu": 80 },
    });
    const busy = [at("e:1", "us-east", "z", 6), at("w:1", "us-west", "z", 6), at("c:1", "eu", "z", 0)];
    // west, the nearest, is as saturated as east: the next region with headroom (eu) joins instead.
    assert.deepEqual(run(f, busy), ["c:1"]);
    const g = new LocalityFilter("g", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    const allBusy = [at("e:1", "us-east", "z", 6), at("w:1", "us-west", "z", 7)];
    assert.deepEqual(run(g, allBusy), ["e:1"]);
    assert.equal(g.spilling({ [REGION_LABEL]: "us-east" }), 0);
  });

  it("with inflightTokensThreshold, the gateway's own in-flight prompt tokens count before a scrape shows them", () => {
    const f = new LocalityFilter("f", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      inflightTokensThreshold: 1000,
      inFlightLoadProducerName: "i",
    });
    assert.deepEqual(
      f.consumes().required.map((k) => k.name),
      ["inflight-load/i"],
    );
    // Scraped metrics say both regions idle; the gateway has 1,500 tokens in flight on e:1 (1.5).
    const eps = [at("e:1", "us-east", "z"), at("w:1", "us-west", "z")];
    const cyc = (tokens: Record<string, number>) => {
      const x = cycleFor(completion("r", "hi"), eps, 0);
      const info: InFlightInfo = {
        requests: () => 0,
        tokens: (id) => tokens[id] ?? 0,
        uncachedRequestTokens: () => 0,
      };
      x.set(inflightKey("i"), info);
      return x;
    };
    assert.deepEqual(ids(f.filter(cyc({ "e:1": 1500 }), eps)), ["w:1"]);
    // Without the threshold the same view keeps the request home.
    const g = new LocalityFilter("g", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    assert.deepEqual(ids(g.filter(cyc({ "e:1": 1500 }), eps)), ["e:1"]);
    assert.deepEqual(g.consumes().required, []);
  });

  it("reads the in-flight counts by candidate position exactly as it reads them by id", () => {
    const regions = ["us-east", "us-west", "eu"];
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            region: fc.constantFrom(...regions),
            waiting: fc.nat(8),
            requests: fc.nat(6),
            tokens: fc.nat(3000),
          }),
          { minLength: 1, maxLength: 12 },
        ),
        fc.integer({ min: 0, max: 4 }),
        (specs, drop) => {
          const eps = specs.map((x, i) => at(`e${i}:1`, x.region, "z", x.waiting));
          const params = {
            origin: { [REGION_LABEL]: "us-east" },
            labels: [REGION_LABEL],
            spillThreshold: 0.3,
            recoverThreshold: 0.2,
            inflightTokensThreshold: 1000,
            maxNumSeqs: 4,
            inFlightLoadProducerName: "i",
          };
          const requests = new Map(eps.map((e, i) => [e.id, specs[i].requests]));
          const tokens = new Map(eps.map((e, i) => [e.id, specs[i].tokens]));
          const view = (aligned: boolean): InFlightInfo => ({
            requests: (id) => requests.get(id) ?? 0,
            tokens: (id) => tokens.get(id) ?? 0,
            uncachedRequestTokens: () => 0,
            ...(aligned
              ? {
                  byPosition: () => ({
                    requests: Float64Array.from(eps, (e) => requests.get(e.id) ?? 0),
                    tokens: Float64Array.from(eps, (e) => tokens.get(e.id) ?? 0),
                    context: new Float64Array(eps.length),
                  }),
                }
              : {}),
          });
          // Two requests each (the second inside the remeasure window), the candidate list itself
          // and, when drop > 0, a sub-list (positions then come from the full list's index).
          const out = (aligned: boolean) => {
            const f = new LocalityFilter("f", params);
            const lists = [eps, drop > 0 ? eps.slice(0, Math.max(1, eps.length - drop)) : eps];
            return lists.flatMap((list, k) => {
              const x = cycleFor(completion(`r${k}`, "hi"), eps, k * 0.01);
              x.set(inflightKey("i"), view(aligned));
              return [ids(f.filter(x, list))];
            });
          };
          assert.deepEqual(out(true), out(false));
        },
      ),
      { numRuns: 300, seed: 11 },
    );
  });

  it("re-measures at most every remeasureMs on an unchanged pool, and at once when the pool changes", () => {
    const f = new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    const eps = [at("a:1", "us-east", "z"), at("c:1", "us-west", "w")];
    const at_ = (now: number) => ids(f.filter(cycleFor(completion("r", "hi"), eps, now), eps));
    assert.deepEqual(at_(0), ["a:1"]);
    // a scrape saturates a: within 50 ms the last measurement stands, after it west joins.
    (eps[0].metrics as { waitingQueueSize: number }).waitingQueueSize = 9;
    assert.deepEqual(at_(0.03), ["a:1"]);
    assert.deepEqual(at_(0.06), ["c:1"]);
    // A different endpoint list is regrouped and re-measured at once.
    const more = [...eps, at("b:1", "us-east", "z")];
    assert.deepEqual(ids(f.filter(cycleFor(completion("r", "hi"), more, 0.07), more)), ["b:1", "c:1"]);
    // remeasureMs 0: every request.
    const g = new LocalityFilter("g", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      remeasureMs: 0,
    });
    const e2 = [at("a:1", "us-east", "z"), at("c:1", "us-west", "w")];
    assert.deepEqual(ids(g.filter(cycleFor(completion("r", "hi"), e2, 1), e2)), ["a:1"]);
    (e2[0].metrics as { waitingQueueSize: number }).waitingQueueSize = 9;
    assert.deepEqual(ids(g.filter(cycleFor(completion("r", "hi"), e2, 1), e2)), ["c:1"]);
  });

  it("with maxNumSeqs, a replica whose batch the gateway has filled is left out at once, and spills its region", () => {
    const f = new LocalityFilter("f", {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      spillThreshold: 0.2,
      recoverThreshold: 0.1,
      maxNumSeqs: 4,
      inFlightLoadProducerName: "i",
    });
    assert.deepEqual(
      f.consumes().required.map((k) => k.name),
      ["inflight-load/i"],
    );
    // Scrapes say every replica is idle; only the gateway knows how many requests it sent.
    const eps = [at("a:1", "us-east", "z"), at("b:1", "us-east", "z"), at("c:1", "us-west", "z")];
    const run_ = (requests: Record<string, number>, now: number) => {
      const x = cycleFor(completion("r", "hi"), eps, now);
      const info: InFlightInfo = {
        requests: (id) => requests[id] ?? 0,
        tokens: () => 0,
        uncachedRequestTokens: () => 0,
      };
      x.set(inflightKey("i"), info);
      return ids(f.filter(x, eps));
    };
    // a one short of full: both local replicas, no spill.
    assert.deepEqual(run_({ "a:1": 3 }, 0), ["a:1", "b:1"]);
    // a fills within the remeasure window: the cached list still says "home", but a is dropped now.
    assert.deepEqual(run_({ "a:1": 4 }, 0.01), ["b:1"]);
    // Re-measured: a full (1.0) and b idle average 0.5 ≥ 0.2, so the region spills; a steps aside.
    assert.deepEqual(run_({ "a:1": 4 }, 0.1), ["b:1", "c:1"]);
    // Every candidate full: the list is kept whole rather than emptied.
    assert.deepEqual(run_({ "a:1": 4, "b:1": 4, "c:1": 4 }, 0.2), ["a:1", "b:1"]);
    // Local only, or a pool in one region: a full replica is still not sent more while another has room.
    for (const only of [{ spill: false }, { origin: { [REGION_LABEL]: "eu" } }]) {
      const h = new LocalityFilter("h", {
        labels: [REGION_LABEL],
        maxNumSeqs: 4,
        inFlightLoadProducerName: "i",
        ...only,
      });
      const local = only.spill === false ? eps : eps.slice(0, 2);
      const x = cycleFor(
        completion("r", "hi", only.spill === false ? { locality: { [REGION_LABEL]: "us-east" } } : {}),
        local,
        0,
      );
      x.set(inflightKey("i"), {
        requests: (id) => (id === "a:1" ? 4 : 0),
        tokens: () => 0,
        uncachedRequestTokens: () => 0,
      });
      assert.deepEqual(ids(h.filter(x, local)), ["b:1"]);
    }
    // The same counts without maxNumSeqs change nothing: the scrapes say idle.
    const g = new LocalityFilter("g", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    assert.deepEqual(ids(g.filter(cycleFor(completion("r", "hi"), eps, 0), eps)), ["a:1", "b:1"]);
  });

  it("spills only into the joining region's endpoints with headroom, never behind a full remote batch", () => {
    const f = new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    // East saturated (queue 5 = 1.0); west has one saturated replica (w:1) and one idle (x:1).
    const eps = [at("e:1", "us-east", "z", 5), at("w:1", "us-west", "z", 5), at("x:1", "us-west", "z", 0)];
    assert.deepEqual(run(f, eps), ["x:1"]);
    assert.equal(f.spilling({ [REGION_LABEL]: "us-east" }), 1);
  });

  it("with stepAsideThreshold 1, spilling at a low threshold keeps a busy but unsaturated local replica (and its prefix groups)", () => {
    const params = {
      origin: { [REGION_LABEL]: "us-east" },
      labels: [REGION_LABEL],
      spillThreshold: 0.2,
      recoverThreshold: 0.1,
    };
    // Queues 3 and 5 (0.6 and 1.0, mean 0.8 ≥ 0.2): the region spills. a is busy but below 1.0 and
    // holds its prompts' cache: it stays beside the remote replica; only the saturated b steps aside.
    const eps = [at("a:1", "us-east", "z", 3), at("b:1", "us-east", "z", 5), at("w:1", "us-west", "z")];
    const f = new LocalityFilter("f", { ...params, stepAsideThreshold: 1 });
    assert.deepEqual(run(f, eps), ["a:1", "w:1"]);
    assert.equal(f.spilling({ [REGION_LABEL]: "us-east" }), 1);
    // By default both step aside at the spill threshold: only the remote replica is left.
    assert.deepEqual(run(new LocalityFilter("g", params), eps), ["w:1"]);
  });

  it("with maxNumSeqs in a config, the scheduler stops sending to a replica once its own picks fill the batch", async () => {
    const { scheduler } = await createScheduler(
      withInflight(`origin: { ${REGION_LABEL}: us-east }, labels: [${REGION_LABEL}], maxNumSeqs: 2`),
      { seed: 1 },
    );
    // a looks idle to every scrape, b has a queue of 2 (below the region's spill line): the queue
    // scorer prefers a until the gateway's own two requests fill a's batch.
    const eps = [at("a:1", "us-east", "z", 0), at("b:1", "us-east", "z", 2), at("c:1", "us-west", "z", 0)];
    const picks: string[] = [];
    for (let k = 0; k < 3; k++) {
      const req = completion(`r${k}`, "hi");
      const res = scheduler.schedule(req, eps, k * 0.001);
      picks.push(res.target?.id ?? "");
      scheduler.onPicked(req, res, k * 0.001);
    }
    assert.deepEqual(picks, ["a:1", "a:1", "b:1"]);
  });

  it("with refresh() driven, requests read the measurement taken between requests and read no endpoint", () => {
    const f = new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    assert.equal(f.refreshIntervalS, 0.05);
    const eps = [at("a:1", "us-east", "z"), at("c:1", "us-west", "w")];
    // Count every read of an endpoint's metrics (the measure reads nothing else of an endpoint).
    let reads = 0;
    for (const e of eps) {
      const m = e.metrics;
      Object.defineProperty(e, "metrics", {
        get: () => {
          reads++;
          return m;
        },
      });
    }
    const req = (now: number) => ids(f.filter(cycleFor(completion("r", "hi"), eps, now), eps));
    assert.deepEqual(req(0), ["a:1"]); // the first request from an origin measures for itself
    f.refresh(0.01);
    (eps[0].metrics as { waitingQueueSize: number }).waitingQueueSize = 9; // a scrape saturates a
    reads = 0;
    // 60 ms after the request's own measurement, 50 ms after the timer's: read, not re-measured.
    assert.deepEqual(req(0.06), ["a:1"]);
    assert.equal(reads, 0, "a request between refreshes reads no endpoint");
    f.refresh(0.06);
    assert.ok(reads >= 2, "refresh() measured both endpoints");
    reads = 0;
    assert.deepEqual(req(0.07), ["c:1"]);
    assert.equal(reads, 0);
    // The timer stalls (no refresh for 4 periods): the next request measures for itself again.
    (eps[0].metrics as { waitingQueueSize: number }).waitingQueueSize = 0;
    assert.deepEqual(req(0.2), ["c:1"]);
    assert.deepEqual(req(0.27), ["a:1"]);
    assert.ok(reads >= 2);
  });

  it("refresh() sees a relabelled endpoint and drops the stale grouping; spill: false asks for no refresh", () => {
    const f = new LocalityFilter("f", { origin: { [REGION_LABEL]: "us-east" }, labels: [REGION_LABEL] });
    const eps = [at("a:1", "us-east", "z"), at("b:1", "us-west", "z"), at("c:1", "us-west", "z")];
    const req = (now: number) => ids(f.filter(cycleFor(completion("r", "hi"), eps, now), eps));
    assert.deepEqual(req(0), ["a:1"]);
    f.refresh(0.01);
    // b moves to us-east (the datastore gives it a new labels object).
    eps[1].labels = { [REGION_LABEL]: "us-east", [ZONE_LABEL]: "z" };
    assert.deepEqual(req(0.02), ["a:1"]); // within the period, the request path does not re-read labels
    f.refresh(0.05);
    assert.deepEqual(req(0.06), ["a:1", "b:1"]);
    assert.equal(
      new LocalityFilter("g", { labels: [REGION_LABEL], spill: false }).refreshIntervalS,
      null,
      "local only measures nothing",
    );
    assert.equal(new LocalityFilter("h", { labels: [REGION_LABEL], remeasureMs: 0 }).refreshIntervalS, null);
  });

  it("Scheduler.refresh() measures with the in-flight producer's counts, so the next request spills at once", async () => {
    const picks = async (refresh: boolean) => {
      const { scheduler } = await createScheduler(
        withInflight(
          `origin: { ${REGION_LABEL}: us-east }, labels: [${REGION_LABEL}], maxNumSeqs: 2, spillThreshold: 0.2, recoverThreshold: 0.1`,
        ),
        { seed: 1 },
      );
      assert.equal(scheduler.refreshIntervalS, 0.05);
      const eps = [at("a:1", "us-east", "z"), at("c:1", "us-west", "z")];
      const out: string[] = [];
      for (let k = 0; k < 3; k++) {
        // Between the second and the third request the timer fires: a's batch is full (2 of 2).
        if (k === 2 && refresh) scheduler.refresh(0.002);
        const req = completion(`r${k}`, "hi");
        const res = scheduler.schedule(req, eps, k * 0.001);
        out.push(res.target?.id ?? "");
        scheduler.onPicked(req, res, k * 0.001);
      }
      return out;
    };
    // Without the timer, the cached "home" list holds a alone and a full list is kept whole.
    assert.deepEqual(await picks(false), ["a:1", "a:1", "a:1"]);
    // With it, a full a (saturation 1.0) spills the region and steps aside: the third goes west.
    assert.deepEqual(await picks(true), ["a:1", "a:1", "c:1"]);
    const { scheduler: plain } = await createScheduler(
      `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
`,
      { seed: 1 },
    );
    assert.equal(plain.refreshIntervalS, null, "no plugin measures between requests");
  });
});
