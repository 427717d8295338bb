// Saturation (utilization-detector) and admission: fresh vs stale metrics, shedding by priority.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Admission, admissionFromConfig, priorityOf } from "../src/flow/admission.ts";
import { parseDuration } from "../src/flow/duration.ts";
import { UtilizationDetector } from "../src/flow/utilization-detector.ts";
import { loadConfig } from "../src/scheduler/config.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";

const now = 100;
const fresh = (q: number, kv: number) =>
  endpoint(`e${q}-${kv}:1`, { waitingQueueSize: q, kvCacheUsagePercent: kv, updateTime: now - 0.05 });

describe("utilization-detector", () => {
  const d = new UtilizationDetector();
  it("scores an endpoint max(queue/5, kv/0.8)", () => {
    assert.equal(d.endpointSaturation(fresh(2, 0.2), now), 0.4);
    assert.equal(d.endpointSaturation(fresh(1, 0.4), now), 0.5);
    assert.equal(d.endpointSaturation(fresh(10, 0), now), 2);
  });
  it("counts stale (> 200 ms) or missing metrics as 1.0", () => {
    const stale = endpoint("s:1", { waitingQueueSize: 0, kvCacheUsagePercent: 0, updateTime: now - 0.201 });
    assert.equal(d.endpointSaturation(stale, now), 1);
    assert.equal(d.endpointSaturation(endpoint("n:1", null), now), 1);
    assert.equal(d.endpointSaturation(endpoint("ok:1", { updateTime: now - 0.19 }), now), 0);
  });
  it("averages over the pool; an empty pool is saturated", () => {
    assert.equal(d.saturation([fresh(0, 0), fresh(10, 0)], now), 1);
    assert.equal(d.saturation([fresh(0, 0.4), fresh(5, 0)], now), 0.75);
    assert.equal(d.saturation([], now), 1);
  });
  it("takes llm-d parameter names and durations", () => {
    const custom = new UtilizationDetector("u", {
      queueDepthThreshold: 10,
      kvCacheUtilThreshold: 0.5,
      metricsStalenessThreshold: "2s",
    });
    assert.equal(custom.staleAfter, 2);
    assert.equal(
      custom.endpointSaturation(
        endpoint("x:1", { waitingQueueSize: 5, kvCacheUsagePercent: 0.4, updateTime: now - 1 }),
        now,
      ),
      0.8,
    );
  });
  it("as a filter drops endpoints above 1·(1 + headroom), keeping all if none would remain", () => {
    const eps = [fresh(0, 0), fresh(10, 0)];
    assert.deepEqual(d.filter(cycleFor(completion("r", "p"), eps, now), eps), [eps[0]]);
    const hot = [fresh(10, 0), fresh(20, 0)];
    assert.deepEqual(d.filter(cycleFor(completion("r", "p"), hot, now), hot), hot);
  });
});

describe("admission", () => {
  const adm = new Admission();
  const sheddable = completion("r", "p", { priority: -1 });
  it("sheds sheddable requests with 429 when pool saturation ≥ 1", () => {
    const r = adm.admit(sheddable, [fresh(5, 0), fresh(5, 0)], now);
    assert.equal(r.admitted, false);
    if (!r.admitted) {
      assert.equal(r.status, 429);
      assert.equal(r.reason, "rejected-saturated");
      assert.equal(r.saturation, 1);
    }
  });
  it("admits sheddable requests below saturation with fresh metrics, not with stale ones", () => {
    assert.equal(adm.admit(sheddable, [fresh(1, 0.1), fresh(2, 0)], now).admitted, true);
    const stale = [endpoint("a:1", { updateTime: now - 1 }), endpoint("b:1", { updateTime: now - 1 })];
    assert.equal(adm.admit(sheddable, stale, now).admitted, false);
  });
  it("always admits non-sheddable requests (priority ≥ 0)", () => {
    assert.equal(adm.admit(completion("r", "p", { priority: 0 }), [], now).admitted, true);
    assert.equal(adm.admit(completion("r", "p", { priority: 5 }), [fresh(50, 1)], now).admitted, true);
  });
  it("maps objective names to priorities; unknown or absent → 0", () => {
    const objectives = new Map([
      ["batch", -1],
      ["chat", 10],
    ]);
    assert.equal(priorityOf(objectives, "batch"), -1);
    assert.equal(priorityOf(objectives, "chat"), 10);
    assert.equal(priorityOf(objectives, "nope"), 0);
    assert.equal(priorityOf(objectives, undefined), 0);
  });
});

describe("admission from config", () => {
  it("uses the configured detector parameters and InferenceObjective priorities", () => {
    const { config } = loadConfig(
      "plugins:\n- type: utilization-detector\n  parameters: { queueDepthThreshold: 100 }\n- type: random-picker\n---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: { name: batch }\nspec: { priority: -5 }\n",
    );
    const { admission, objectives } = admissionFromConfig(config);
    const req = completion("r", "p", { priority: priorityOf(objectives, "batch") });
    assert.equal(req.priority, -5);
    assert.equal(admission.admit(req, [fresh(50, 0)], now).admitted, true); // 50/100 = 0.5
    assert.equal(admission.admit(req, [fresh(100, 0)], now).admitted, false);
  });
});

describe("durations", () => {
  it("parses Go duration strings to seconds", () => {
    assert.equal(parseDuration("200ms"), 0.2);
    assert.equal(parseDuration("1m30s"), 90);
    assert.equal(parseDuration("0"), 0);
    assert.equal(parseDuration("2"), null);
    assert.equal(parseDuration("fast"), null);
  });
});
