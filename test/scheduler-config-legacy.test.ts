// Configs written for earlier GIE and llm-d-inference-scheduler releases load: each fixture in
// test/fixtures/legacy-configs/ (copied from that release's docs, charts or e2e tests) maps to
// today's plugins with one warning per rewrite, and old character sizes become honest token sizes.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import { loadConfig } from "../src/scheduler/config.ts";
import type { EffectiveConfig, EffectivePlugin } from "../src/scheduler/defaults.ts";
import { ConfigError } from "../src/scheduler/errors.ts";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import type { ApproxPrefixProducer } from "../src/scheduler/plugins/prefix/producer.ts";
import { createScheduler, Scheduler } from "../src/scheduler/scheduler.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";

const DIR = "test/fixtures/legacy-configs";
const LEGACY_API = "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated";

function load(file: string): { config: EffectiveConfig; warnings: string[]; text: string } {
  const text = readFileSync(`${DIR}/${file}`, "utf8");
  const { config, warnings } = loadConfig(text);
  new Scheduler(config, { hasher: { h64: () => 0n }, seed: 1 });
  return { config, warnings, text };
}

function plugin(c: EffectiveConfig, name: string): EffectivePlugin {
  const p = c.plugins.find((x) => x.name === name);
  assert.ok(p, `no plugin "${name}" in ${c.plugins.map((x) => x.name).join(", ")}`);
  return p;
}

/** The one warning containing every fragment (there must be exactly one). */
function warning(warnings: string[], ...fragments: string[]): string {
  const hits = warnings.filter((w) => fragments.every((f) => w.includes(f)));
  assert.equal(
    hits.length,
    1,
    `want one warning with ${JSON.stringify(fragments)} in:\n${warnings.join("\n")}`,
  );
  assert.ok(!hits[0].includes("\n"), "a warning is one line");
  return hits[0];
}

function rejects(text: string, ...fragments: string[]): void {
  assert.throws(
    () => loadConfig(text),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError, `expected ConfigError, got ${e}`);
      for (const f of fragments)
        assert.ok(e.message.includes(f), `message ${JSON.stringify(e.message)} lacks ${JSON.stringify(f)}`);
      return true;
    },
  );
}

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n";

describe("GIE release shapes", () => {
  it("v0.5 chart plugins-v2: kv-cache-scorer renamed, prefix index moved to a producer", () => {
    const { config, warnings } = load("gie-v0.5-chart-plugins-v2.yaml");
    assert.equal(warnings.length, 3);
    assert.ok(warnings[0].startsWith(LEGACY_API));
    warning(warnings, '"kv-cache-scorer"', "loaded as kv-cache-utilization-scorer", "GIE PR #1238");
    assert.equal(plugin(config, "kv-cache-scorer").type, "kv-cache-utilization-scorer");
    warning(
      warnings,
      "hashBlockSize: 64 characters → blockSizeTokens: 16",
      "type: approx-prefix-cache-producer",
    );
    // 256 blocks of 64 characters = 16384 characters = 4096 tokens; 31250 × 16 tokens in 64-token blocks.
    assert.deepEqual(plugin(config, "approx-prefix-cache-producer").parameters, {
      autoTune: false,
      blockSizeTokens: 16,
      maxPrefixBlocksToMatch: 2048,
      maxPrefixTokensToMatch: 4096,
      lruCapacityPerServer: 7813,
      countOutputTokens: false,
    });
    assert.equal(
      plugin(config, "prefix-cache-scorer").parameters.prefixMatchInfoProducerName,
      "approx-prefix-cache-producer",
    );
    assert.deepEqual(config.schedulingProfiles[0].plugins, [
      { pluginRef: "queue-scorer", weight: 1 },
      { pluginRef: "kv-cache-scorer", weight: 1 },
      { pluginRef: "prefix-cache-scorer", weight: 1 },
      { pluginRef: "max-score-picker" },
    ]);
  });

  it("v1.0 config-text: a 5-character block becomes kvgate's 64-token floor, capacity kept in tokens", () => {
    const { config, warnings } = load("gie-v1.0-config-text.yaml");
    warning(warnings, "hashBlockSize: 5 characters → blockSizeTokens: 2", "at least 64 tokens");
    const prod = plugin(config, "approx-prefix-cache-producer");
    assert.deepEqual(
      [
        prod.parameters.blockSizeTokens,
        prod.parameters.maxPrefixTokensToMatch,
        prod.parameters.lruCapacityPerServer,
      ],
      [2, 320, 611],
    );
    const s = new Scheduler(config, { hasher: { h64: () => 0n }, seed: 1 });
    const built = s.plugins.get("approx-prefix-cache-producer") as ApproxPrefixProducer;
    assert.equal(
      built.blockSize([endpoint("a:1", { cacheBlockSize: 16 })]),
      64,
      "autoTune off: metric ignored",
    );
    assert.equal(built.maxBlocks(64), 5, "320 tokens of prefix in 64-token blocks");
    assert.deepEqual(config.schedulingProfiles[0].plugins[0], {
      pluginRef: "prefix-cache-scorer",
      weight: 50,
    });
  });

  it("v1.0 chart default loads with only the apiVersion warning", () => {
    const { config, warnings } = load("gie-v1.0-chart-default.yaml");
    assert.equal(warnings.length, 1);
    assert.ok(warnings[0].startsWith(LEGACY_API));
    assert.equal(plugin(config, "approx-prefix-cache-producer").origin, "auto");
  });
});

describe("llm-d-inference-scheduler release shapes", () => {
  let h: Hasher;
  before(async () => {
    h = await createXxHasher();
  });

  it("v0.3 e2e P/D: pd-profile-handler threshold (characters) becomes a prefix-based-pd-decider", async () => {
    const { config, warnings, text } = load("llm-d-inference-scheduler-v0.3-e2e-pd.yaml");
    warning(warnings, '"pd-profile-handler"', "threshold: 10 characters", "nonCachedTokens: 3");
    warning(warnings, "prefill-header-handler", "no effect");
    assert.equal(config.profileHandler, "pd-profile-handler");
    assert.deepEqual(plugin(config, "pd-profile-handler").parameters, {
      stageOrder: "decode-first",
      profiles: { decode: "decode", prefill: "prefill", encode: "encode" },
      deciders: { prefill: "prefix-based-pd-decider" },
    });
    assert.equal(plugin(config, "prefix-based-pd-decider").parameters.nonCachedTokens, 3);
    // Old rule: prefill when ≥ 10 uncached characters. A 2-character prompt stays on decode; a
    // 400-character one gets a prefill stage.
    const { scheduler } = await createScheduler(text, { hasher: h });
    const pd = [
      endpoint("p1:1", {}, { "llm-d.ai/role": "prefill" }),
      endpoint("d1:1", {}, { "llm-d.ai/role": "decode" }),
    ];
    const short = scheduler.schedule(completion("s", "hi"), pd, 0);
    assert.equal(short.target?.id, "d1:1");
    assert.equal(short.profiles.prefill, undefined);
    const long = scheduler.schedule(completion("l", "x".repeat(400)), pd, 0);
    assert.equal(long.target?.id, "d1:1");
    assert.equal(long.profiles.prefill?.target?.id, "p1:1");
  });

  it("v0.3 disaggregation doc: by-label filters, threshold 0 always runs prefill, primaryPort warned", async () => {
    const { config, warnings, text } = load("llm-d-inference-scheduler-v0.3-disaggregation.yaml");
    warning(warnings, '"prefill-pods" (type by-label)', "label-selector-filter");
    assert.deepEqual(plugin(config, "decode-pods").parameters.matchExpressions, [
      { key: "role", operator: "In", values: ["decode"] },
    ]);
    const w = warning(warnings, '"pd-profile-handler"', "always-disagg-pd-decider");
    assert.ok(w.includes("primaryPort: 8000 ignored") && w.includes("hashBlockSize ignored"), w);
    assert.equal(plugin(config, "always-disagg-pd-decider").type, "always-disagg-pd-decider");
    const { scheduler } = await createScheduler(text, { hasher: h });
    const pd = [endpoint("p1:1", {}, { role: "prefill" }), endpoint("d1:1", {}, { role: "decode" })];
    const r = scheduler.schedule(completion("s", "hi"), pd, 0);
    assert.equal(r.target?.id, "d1:1");
    assert.equal(r.profiles.prefill?.target?.id, "p1:1", "threshold 0: prefill even for a short prompt");
  });

  it("v0.3 e2e precise config: scorer split into precise-prefix-cache-producer + prefix-cache-scorer", () => {
    const { config, warnings } = load("llm-d-inference-scheduler-v0.3-e2e-kv.yaml");
    const w = warning(
      warnings,
      '"precise-prefix-cache-scorer"',
      'precise-prefix-cache-producer "precise-prefix-cache-producer"',
    );
    for (const f of [
      "zmqEndpoint ignored",
      "indexerConfig ignored",
      "indexerConfig.tokenProcessorConfig → tokenProcessorConfig",
    ])
      assert.ok(w.includes(f), `${w} lacks ${f}`);
    const scorer = plugin(config, "precise-prefix-cache-scorer");
    assert.equal(scorer.type, "prefix-cache-scorer");
    assert.equal(scorer.parameters.prefixMatchInfoProducerName, "precise-prefix-cache-producer");
    const prod = plugin(config, "precise-prefix-cache-producer");
    assert.deepEqual(prod.parameters.tokenProcessorConfig, { blockSizeTokens: 16, hashSeed: "42" });
    assert.deepEqual(config.schedulingProfiles[0].plugins.at(-1), {
      pluginRef: "precise-prefix-cache-scorer",
      weight: 10,
    });
  });

  it("architecture doc: the token processor nested in indexerConfig is lifted", () => {
    const { config } = load("llm-d-inference-scheduler-architecture-precise.yaml");
    assert.deepEqual(plugin(config, "precise-prefix-cache-producer").parameters.tokenProcessorConfig, {
      blockSizeTokens: 5,
    });
  });

  it("decider-era disaggregation doc: blockSize in characters, the declared decider kept", () => {
    const { config, warnings } = load("llm-d-inference-scheduler-pd-deciders.yaml");
    warning(warnings, "GIE after PR #1888", "blockSize: 5 characters → blockSizeTokens: 2");
    warning(warnings, '"pd-profile-handler"', "primaryPort: 8000 ignored");
    warning(warnings, 'unknown gate "prepareDataPlugins"');
    assert.equal(plugin(config, "approx-prefix-cache-producer").parameters.autoTune, false);
    assert.deepEqual(plugin(config, "pd-profile-handler").parameters.deciders, {
      prefill: "prefix-based-pd-decider",
    });
    assert.equal(plugin(config, "prefix-based-pd-decider").parameters.nonCachedTokens, 8);
    assert.equal(config.plugins.filter((p) => p.kind === "decider").length, 1, "no extra decider");
  });

  it("v0.3 types that kept their names load as they were written", () => {
    // llm-d-inference-scheduler v0.3 pkg/plugins/register.go and docs/architecture.md.
    const { config, warnings } = loadConfig(
      `${HEAD}- type: decode-filter\n- type: load-aware-scorer\n  parameters: { threshold: 128 }\n- type: session-affinity-scorer\n- type: active-request-scorer\n  parameters: { requestTimeout: "2m" }\n- type: kv-cache-utilization-scorer\n- type: queue-scorer\n- type: random-picker\n  parameters: { maxNumOfEndpoints: 1 }\n`,
    );
    assert.deepEqual(warnings, [
      'plugin "active-request-scorer" (type active-request-scorer): parameter "requestTimeout" is deprecated; use nothing (in-flight tracking is done by inflight-load-producer)',
    ]);
    assert.equal(plugin(config, "load-aware-scorer").parameters.threshold, 128);
  });

  it("pd-epp-config before the producer split: block counts of 16-token blocks become tokens", () => {
    const { config, warnings } = load("llm-d-inference-scheduler-pd-epp-config.yaml");
    warning(warnings, "before the approx-prefix-cache-producer split", "maxPrefixTokensToMatch: 4096");
    const p = plugin(config, "approx-prefix-cache-producer").parameters;
    assert.deepEqual(
      [p.autoTune, p.blockSizeTokens, p.maxPrefixTokensToMatch, p.lruCapacityPerServer],
      [true, 16, 4096, 7813],
    );
    assert.equal(config.profileHandler, "disagg-profile-handler");
  });
});

describe("single legacy rewrites", () => {
  it("pd-profile-handler's later parameters map onto disagg-profile-handler", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: prefill-filter\n- type: decode-filter\n- type: always-disagg-pd-decider\n  name: always\n- type: pd-profile-handler\n  parameters: { decodeProfile: d, prefillProfile: p, deciderPluginName: always, primaryPort: 0 }\nschedulingProfiles:\n- { name: p, plugins: [{ pluginRef: prefill-filter }] }\n- { name: d, plugins: [{ pluginRef: decode-filter }] }\n`,
    );
    warning(warnings, "loaded as disagg-profile-handler");
    assert.ok(!warnings.some((w) => w.includes("primaryPort")), "primaryPort 0 is today's behaviour");
    assert.deepEqual(plugin(config, "pd-profile-handler").parameters, {
      stageOrder: "decode-first",
      profiles: { decode: "d", prefill: "p", encode: "encode" },
      deciders: { prefill: "always" },
    });
  });

  it("disagg-profile-handler's flat parameters move under profiles / deciders", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: prefill-filter\n- type: decode-filter\n- type: always-disagg-pd-decider\n- type: disagg-profile-handler\n  parameters: { decodeProfile: dec, deciderPluginName: always-disagg-pd-decider }\nschedulingProfiles:\n- { name: prefill, plugins: [{ pluginRef: prefill-filter }] }\n- { name: dec, plugins: [{ pluginRef: decode-filter }] }\n`,
    );
    warning(warnings, "flat parameters are deprecated", "deciderPluginName → deciders.prefill");
    assert.deepEqual(plugin(config, "disagg-profile-handler").parameters, {
      stageOrder: "decode-first",
      profiles: { decode: "dec", prefill: "prefill", encode: "encode" },
      deciders: { prefill: "always-disagg-pd-decider" },
    });
  });

  it("prefixPluginName pointing at a split scorer becomes prefixMatchInfoProducerName", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: precise-prefix-cache-scorer\n  name: cache\n- type: prefix-cache-scorer\n  name: approx\n  parameters: { blockSizeTokens: 64 }\n- type: no-hit-lru-scorer\n  parameters: { prefixPluginType: precise-prefix-cache-scorer, prefixPluginName: cache, lruSize: 8 }\n- type: prefix-disaggregation-decider\n  parameters: { nonCachedTokens: 4, prefixPluginName: approx }\n`,
    );
    warning(warnings, '"prefix-disaggregation-decider"', "loaded as prefix-based-pd-decider");
    assert.equal(
      plugin(config, "no-hit-lru-scorer").parameters.prefixMatchInfoProducerName,
      "precise-prefix-cache-producer",
    );
    assert.equal(plugin(config, "no-hit-lru-scorer").parameters.lruSize, 8);
    const decider = plugin(config, "prefix-disaggregation-decider");
    assert.equal(decider.type, "prefix-based-pd-decider");
    assert.equal(decider.parameters.prefixMatchInfoProducerName, "approx-prefix-cache-producer");
  });

  it("precise-prefix-cache-scorer next to a declared precise producer binds to it, as llm-d-router does", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: precise-prefix-cache-producer\n  name: kv\n- type: precise-prefix-cache-scorer\n  parameters: { tokenProcessorConfig: { blockSize: 64 } }\n`,
    );
    warning(warnings, 'on the declared precise-prefix-cache-producer "kv"', "its own parameters are ignored");
    assert.equal(plugin(config, "precise-prefix-cache-scorer").parameters.prefixMatchInfoProducerName, "kv");
    assert.equal(config.plugins.filter((p) => p.type === "precise-prefix-cache-producer").length, 1);
  });

  it("precise-prefix-cache-scorer's speculativeTTL in nanoseconds becomes a duration", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: precise-prefix-cache-scorer\n  parameters: { speculativeIndexing: true, speculativeTTL: 2000000000 }\n`,
    );
    warning(warnings, 'speculativeTTL: 2000000000 (nanoseconds) → "2000ms"');
    const p = plugin(config, "precise-prefix-cache-producer").parameters;
    assert.deepEqual([p.speculativeIndexing, p.speculativeTTL], [true, "2000ms"]);
  });

  it("two legacy prefix scorers get a producer each (GIE PR #1888's gpu/cpu example)", () => {
    const { config } = loadConfig(
      `${HEAD}- type: prefix-cache-scorer\n  name: gpu\n  parameters: { autoTune: true }\n- type: prefix-cache-scorer\n  name: cpu\n  parameters: { autoTune: false, lruCapacityPerServer: 41000 }\n`,
    );
    assert.equal(plugin(config, "gpu").parameters.prefixMatchInfoProducerName, "gpu-producer");
    assert.equal(plugin(config, "cpu").parameters.prefixMatchInfoProducerName, "cpu-producer");
    assert.equal(plugin(config, "cpu-producer").parameters.lruCapacityPerServer, 10250);
  });

  it("approx-prefix-cache-producer's blockSize is characters, not tokens", () => {
    const a = loadConfig(`${HEAD}- type: approx-prefix-cache-producer\n  parameters: { blockSize: 256 }\n`);
    warning(a.warnings, '"blockSize" (characters)', "blockSizeTokens: 64");
    assert.equal(plugin(a.config, "approx-prefix-cache-producer").parameters.blockSizeTokens, 64);
    assert.equal(plugin(a.config, "approx-prefix-cache-producer").parameters.blockSize, undefined);
    const b = loadConfig(
      `${HEAD}- type: approx-prefix-cache-producer\n  parameters: { blockSize: 256, blockSizeTokens: 32 }\n`,
    );
    warning(b.warnings, '"blockSize" is deprecated and ignored');
    assert.equal(plugin(b.config, "approx-prefix-cache-producer").parameters.blockSizeTokens, 32);
  });

  it("pre-v0.3 short names load through the same rewrites", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}- type: prefix-cache\n  parameters: { hashBlockSize: 64 }\n- type: max-score\n`,
    );
    warning(warnings, '"prefix-cache"', "loaded as prefix-cache-scorer");
    assert.equal(plugin(config, "prefix-cache").type, "prefix-cache-scorer");
    assert.equal(plugin(config, "approx-prefix-cache-producer").parameters.blockSizeTokens, 16);
    assert.equal(plugin(config, "max-score").type, "max-score-picker");
  });

  it("what cannot be honoured is an error that says what to do", () => {
    rejects(
      `${HEAD}- type: by-label\n  parameters: { label: role, validValues: [decode], allowsNoLabel: true }\n`,
      "allowsNoLabel",
      "cannot be written as a label selector",
    );
    rejects(`${HEAD}- type: by-label\n  parameters: { label: role }\n`, '"validValues" is empty');
    rejects(`${HEAD}- type: low-queue-filter\n`, "no longer supported", "queue-scorer");
    rejects(
      `${HEAD}- type: approx-prefix-cache-producer\n- type: prefix-cache-scorer\n  parameters: { hashBlockSize: 64 }\n`,
      "hashBlockSize",
      "move them to that plugin",
    );
    rejects(`${HEAD}- type: prefix-cache-scorer\n  parameters: { hashBlockSize: -3 }\n`, "positive integer");
    rejects(`${HEAD}- type: pd-profile-handler\n  parameters: { treshold: 3 }\n`, '"treshold"', "threshold");
  });
});
