// disagg-profile-handler: stage orders, the decision and its reason (outcome, /explain), the
// required-prefill failure instead of a silent decode-only, and the aggregated fallback profile.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { chat, endpoint } from "../src/scheduler/testing.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

const pdYaml = readFileSync("config/examples/pd.yaml", "utf8");
const P = endpoint("p1:1", {}, { "llm-d.ai/role": "prefill" });
const D1 = endpoint("d1:1", {}, { "llm-d.ai/role": "decode" });
const D2 = endpoint("d2:1", { waitingQueueSize: 3 }, { "llm-d.ai/role": "decode" });
const long = (id: string) => chat(id, "S".repeat(2000), "question");

/** The P/D example with the handler's parameters replaced. */
function withHandler(params: string, extraProfiles = ""): string {
  const cfg = pdYaml.replace(
    /- type: disagg-profile-handler\n {2}parameters:\n {4}deciders:\n {6}prefill: prefix-based-pd-decider\n/,
    `- type: disagg-profile-handler\n  parameters: ${params}\n`,
  );
  assert.notEqual(cfg, pdYaml, "the example's handler block moved; update this test");
  return cfg + extraProfiles;
}

describe("disagg-profile-handler decisions", () => {
  it("decode-first: approved → prefill-decode with the prefill target; cached → decode-only, reason named", async () => {
    const { scheduler } = await createScheduler(pdYaml, { hasher: h });
    const req = long("r1");
    const r = scheduler.schedule(req, [P, D1, D2], 0, { explain: true });
    assert.equal(r.outcome?.decision, "prefill-decode");
    assert.equal(r.outcome?.prefillTarget?.id, "p1:1");
    assert.deepEqual(r.explanation?.decision, {
      decision: "prefill-decode",
      reason: 'decider "prefix-based-pd-decider" approved',
      prefillTarget: "p1:1",
    });
    scheduler.onPicked(req, r, 0);
    const again = scheduler.schedule(long("r2"), [P, D1, D2], 1, { explain: true });
    assert.equal(again.outcome?.decision, "decode-only");
    assert.match(again.outcome?.reason ?? "", /decider "prefix-based-pd-decider" declined for d1:1/);
    assert.equal(again.explanation?.decision?.prefillTarget, null);
  });

  it("no decider configured → decode-only, and the prefill profile never runs", async () => {
    const { scheduler } = await createScheduler(withHandler("{}"), { hasher: h });
    const r = scheduler.schedule(long("r"), [P, D1], 0, { explain: true });
    assert.equal(r.target?.id, "d1:1");
    assert.deepEqual(r.explanation?.profilesRun, ["decode"]);
    assert.deepEqual(r.outcome && [r.outcome.decision, r.outcome.reason], [
      "decode-only",
      "no prefill decider configured",
    ]);
  });

  it("a required prefill with no prefill endpoint is marked prefillUnavailable, never a silent decode-only", async () => {
    const { scheduler } = await createScheduler(pdYaml, { hasher: h });
    const r = scheduler.schedule(long("r"), [D1, D2], 0, { explain: true });
    assert.equal(r.failure, null, "the gateway's prefill-failure policy decides, not the scheduler");
    assert.equal(r.target?.id, "d1:1");
    assert.equal(r.outcome?.decision, "decode-only");
    assert.equal(r.outcome?.prefillUnavailable, true);
    assert.equal(r.outcome?.prefillTarget, null);
    assert.match(r.outcome?.reason ?? "", /profile "prefill" found no endpoint.*profiles\.fallback/);
    const declined = scheduler.schedule(chat("s", "hi", "q"), [P, D1], 0);
    assert.equal(declined.outcome?.prefillUnavailable, undefined, "a declined prefill is not a missing one");
  });

  it("profiles.fallback serves that request on the aggregated profile, recorded as aggregated-fallback", async () => {
    const agg =
      "- name: aggregated\n  plugins:\n  - pluginRef: max-score-picker\n  - pluginRef: queue-scorer\n";
    const { scheduler } = await createScheduler(
      withHandler(
        "{ deciders: { prefill: prefix-based-pd-decider }, profiles: { fallback: aggregated } }",
        agg,
      ),
      { hasher: h },
    );
    const r = scheduler.schedule(long("r"), [D1, D2], 0, { explain: true });
    assert.equal(r.failure, null);
    assert.equal(r.primaryProfile, "aggregated");
    assert.equal(r.target?.id, "d1:1", "the aggregated profile's queue scorer prefers the idle d1");
    assert.deepEqual(r.explanation?.profilesRun, ["decode", "prefill", "aggregated"]);
    assert.equal(r.outcome?.decision, "aggregated-fallback");
    assert.match(r.outcome?.reason ?? "", /profile "prefill" found no endpoint/);
  });

  it("prefill-first runs prefill, then decode (primary), for every request", async () => {
    const { scheduler } = await createScheduler(withHandler("{ stageOrder: Prefill_First }"), { hasher: h });
    const r = scheduler.schedule(chat("r", "hi", "q"), [P, D1, D2], 0, { explain: true });
    assert.deepEqual(r.explanation?.profilesRun, ["prefill", "decode"]);
    assert.equal(r.primaryProfile, "decode");
    assert.equal(r.target?.id, "d1:1");
    assert.equal(r.outcome?.decision, "prefill-decode");
    assert.equal(r.outcome?.prefillTarget?.id, "p1:1");
  });

  it("rejects a prefill decider with prefill-first, an unknown stage order, and a fallback that is the decode profile", async () => {
    await assert.rejects(
      createScheduler(
        withHandler("{ stageOrder: prefill-first, deciders: { prefill: prefix-based-pd-decider } }"),
        {
          hasher: h,
        },
      ),
      /prefill decider is not supported with stageOrder prefill-first/,
    );
    await assert.rejects(
      createScheduler(withHandler("{ stageOrder: sideways }"), { hasher: h }),
      /stageOrder "sideways": use decode-first or prefill-first/,
    );
    await assert.rejects(
      createScheduler(withHandler("{ profiles: { fallback: decode } }"), { hasher: h }),
      /profiles.fallback must differ from profiles.decode/,
    );
  });
});

describe("llm-d's P/D guide configs load unchanged and disaggregate", () => {
  const guide = (f: string) => readFileSync(`test/fixtures/pd-guide/${f}`, "utf8");
  const fleet = [
    endpoint("p1:8000", { waitingQueueSize: 2 }, { "llm-d.ai/role": "prefill" }),
    endpoint("p2:8000", {}, { "llm-d.ai/role": "prefill" }),
    endpoint("d1:8000", {}, { "llm-d.ai/role": "decode" }),
  ];

  it("today's guide (always-disagg-pd-decider, affinity filter, token-load / active-request scorers)", async () => {
    const { scheduler, warnings } = await createScheduler(guide("llm-d-pd-guide-current.yaml"), {
      hasher: h,
    });
    assert.deepEqual(warnings, []);
    const r = scheduler.schedule(chat("r", "hello", "q"), fleet, 0, { explain: true });
    assert.equal(r.target?.id, "d1:8000");
    assert.equal(r.outcome?.decision, "prefill-decode");
    assert.ok(["p1:8000", "p2:8000"].includes(r.outcome?.prefillTarget?.id ?? ""));
    assert.deepEqual(r.explanation?.profilesRun, ["decode", "prefill"]);
  });

  it("the v0.5 guide (pd-profile-handler threshold 0, prefill-header-handler) loads with deprecation warnings", async () => {
    const { scheduler, warnings } = await createScheduler(guide("llm-d-pd-guide-v0.5.yaml"), { hasher: h });
    assert.ok(warnings.some((w) => /pd-profile-handler/.test(w) && /always-disagg-pd-decider/.test(w)));
    assert.ok(warnings.some((w) => /prefill-header-handler/.test(w)));
    const r = scheduler.schedule(chat("r", "hello", "q"), fleet, 0);
    assert.equal(r.target?.id, "d1:8000");
    assert.equal(r.outcome?.decision, "prefill-decode");
    assert.equal(r.outcome?.prefillTarget?.id, "p2:8000", "queue-scorer: the idle prefill pod");
  });
});
