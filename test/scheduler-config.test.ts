// EndpointPickerConfig loading: every reference config and example loads; each kind of bad config
// is a ConfigError naming the culprit; defaulting produces the documented effective config.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { parseAllDocuments } from "yaml";
import { loadConfig } from "../src/scheduler/config.ts";
import { printConfig } from "../src/scheduler/defaults.ts";
import { ConfigError } from "../src/scheduler/errors.ts";
import { Scheduler } from "../src/scheduler/scheduler.ts";

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";

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

/** The profile names the file itself declares (the EndpointPickerConfig document, not the
 * InferenceObjective ones beside it); with none declared the loader builds one named "default". */
function declaredProfileNames(text: string): string[] {
  const docs = parseAllDocuments(text).map((d) => d.toJS() as Record<string, unknown> | null);
  const epc = docs.filter((d) => d !== null && d.kind !== "InferenceObjective");
  assert.equal(epc.length, 1, "one EndpointPickerConfig document");
  const profiles = epc[0]?.schedulingProfiles as { name: string }[] | undefined;
  return profiles === undefined ? ["default"] : profiles.map((p) => p.name);
}

// Each reference fixture's warnings, read off the file: what it leaves out or declares that kvgate
// accepts without acting on.
const FIXTURE_WARNINGS: Record<string, string[]> = {
  // declares llm-d's data-layer plugins, which kvgate configures outside EndpointPickerConfig
  "chart-default.yaml": [
    `plugin "metrics-data-source" (type metrics-data-source) is accepted but has no effect: kvgate's data layer (metrics scraping) is configured outside EndpointPickerConfig`,
    `plugin "core-metrics-extractor" (type core-metrics-extractor) is accepted but has no effect: kvgate's data layer (metrics scraping) is configured outside EndpointPickerConfig`,
  ],
  // no apiVersion/kind (a chart values excerpt)
  "flow-control.yaml": ["apiVersion and kind missing; assuming llm-d.ai/v1alpha1 EndpointPickerConfig"],
  // GIE v1's legacy apiVersion
  "gie-v1-chart-default.yaml": [
    "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1",
  ],
  // no apiVersion/kind (a chart values excerpt)
  "optimized-baseline.yaml": ["apiVersion and kind missing; assuming llm-d.ai/v1alpha1 EndpointPickerConfig"],
  // a requestHandler section and a request parser, both llm-d's gateway-side concerns
  "payload-agnostic.yaml": [
    `section "requestHandler" is accepted but not implemented by kvgate; it has no effect`,
    `plugin "passthrough-parser" (type passthrough-parser) is accepted but has no effect: kvgate's gateway parses requests itself`,
  ],
  "pd-epp-config.yaml": [],
};

describe("shipped and reference configs load", () => {
  for (const dir of ["config/examples", "test/fixtures/epp"]) {
    const files = readdirSync(dir).filter((f) => f.endsWith(".yaml") && !f.startsWith("endpoints-"));
    if (dir === "test/fixtures/epp")
      it("every reference fixture has its expected warnings listed", () =>
        assert.deepEqual(files.toSorted(), Object.keys(FIXTURE_WARNINGS).toSorted()));
    for (const file of files) {
      it(`${dir}/${file}`, () => {
        const text = readFileSync(`${dir}/${file}`, "utf8");
        const { config, warnings } = loadConfig(text);
        new Scheduler(config, { hasher: { h64: () => 0n }, seed: 1 });
        // Shipped examples use today's shapes only, so they load silently.
        assert.deepEqual(warnings, dir === "config/examples" ? [] : FIXTURE_WARNINGS[file]);
        assert.deepEqual(
          config.schedulingProfiles.map((p) => p.name),
          declaredProfileNames(text),
        );
      });
    }
  }

  it("the P/D config runs decode (primary) and prefill profiles under disagg-profile-handler", () => {
    const { config } = loadConfig(readFileSync("test/fixtures/epp/pd-epp-config.yaml", "utf8"));
    assert.equal(config.profileHandler, "disagg-profile-handler");
    assert.deepEqual(
      config.schedulingProfiles.map((p) => p.name),
      ["prefill", "decode"],
    );
  });

  it("the optimized baseline gets max-score-picker and warns about the missing apiVersion", () => {
    const { config, warnings } = loadConfig(
      readFileSync("test/fixtures/epp/optimized-baseline.yaml", "utf8"),
    );
    assert.deepEqual(config.schedulingProfiles[0].plugins, [
      { pluginRef: "prefix-cache-affinity-filter" },
      { pluginRef: "token-load-scorer", weight: 1 },
      { pluginRef: "max-score-picker" },
    ]);
    assert.ok(warnings.some((w) => w.includes("apiVersion")));
    const filter = config.plugins.find((p) => p.type === "prefix-cache-affinity-filter");
    assert.deepEqual(filter?.parameters, {
      affinityThreshold: 0.8,
      explorationProbability: 0,
      maxTTFTPenaltyMs: 18000,
      ttftSource: "prefillThroughput",
      peakPrefillThroughput: 15928,
      learnPrefillThroughput: true,
      // kvgate's addition, off unless asked for: llm-d's optimized baseline keeps llm-d's gate.
      releaseWhenSlotsFull: false,
      prefixMatchInfoProducerName: "approx-prefix-cache-producer",
      inFlightLoadProducerName: "inflight-load-producer",
    });
  });

  it("chart data-layer plugins load with warnings; llm-d's flow-control example takes effect", () => {
    const { warnings } = loadConfig(readFileSync("test/fixtures/epp/chart-default.yaml", "utf8"));
    assert.ok(warnings.some((w) => w.includes("metrics-data-source")));
    const flow = loadConfig(readFileSync("test/fixtures/epp/flow-control.yaml", "utf8"));
    assert.ok(
      !flow.warnings.some((w) => /flowControl|fairness-policy|ordering-policy/.test(w)),
      flow.warnings.join("\n"),
    );
    const fc = flow.config.flowControl;
    assert.equal(fc?.maxRequests, 1000);
    assert.equal(fc?.maxBytes, 10 * 2 ** 30);
    assert.deepEqual(
      fc?.bands.map((b) => [b.priority, b.maxRequests, b.fairness.kind, b.ordering]),
      [
        [100, 500, "round-robin", "fcfs"],
        [0, 200, "round-robin", "fcfs"],
        [-10, 50, "round-robin", "fcfs"],
      ],
    );
    assert.equal(flow.config.saturationDetector, "concurrency-detector");
    assert.equal(
      flow.config.plugins.find((p) => p.name === "concurrency-detector")?.parameters.maxConcurrency,
      15,
    );
  });

  it("the legacy apiVersion loads with a deprecation warning", () => {
    const { warnings } = loadConfig(readFileSync("test/fixtures/epp/gie-v1-chart-default.yaml", "utf8"));
    assert.ok(warnings.some((w) => w.includes("deprecated")));
  });
});

describe("defaulting (effective config)", () => {
  it("no profiles → a default profile of all filters, scorers and the picker; weight 1; producers added", () => {
    const { config } = loadConfig(
      `${HEAD}plugins:\n- type: decode-filter\n- type: queue-scorer\n- type: prefix-cache-scorer\n- type: random-picker\n`,
    );
    assert.deepEqual(config.schedulingProfiles, [
      {
        name: "default",
        plugins: [
          { pluginRef: "decode-filter" },
          { pluginRef: "queue-scorer", weight: 1 },
          { pluginRef: "prefix-cache-scorer", weight: 1 },
          { pluginRef: "random-picker" },
        ],
      },
    ]);
    const auto = config.plugins.filter((p) => p.origin === "auto").map((p) => p.type);
    assert.deepEqual(auto, [
      "approx-prefix-cache-producer",
      "single-profile-handler",
      "utilization-detector",
    ]);
    assert.equal(
      config.plugins.find((p) => p.type === "prefix-cache-scorer")?.parameters.prefixMatchInfoProducerName,
      "approx-prefix-cache-producer",
    );
  });

  it("token-load and active-request scorers share one auto-added inflight-load-producer", () => {
    const { config } = loadConfig(
      `${HEAD}plugins:\n- type: token-load-scorer\n- type: active-request-scorer\n`,
    );
    assert.equal(config.plugins.filter((p) => p.type === "inflight-load-producer").length, 1);
  });

  it("a named producer is found without naming it in the consumer", () => {
    const { config } = loadConfig(
      `${HEAD}plugins:\n- type: approx-prefix-cache-producer\n  name: px\n- type: prefix-cache-scorer\n`,
    );
    assert.equal(
      config.plugins.find((p) => p.type === "prefix-cache-scorer")?.parameters.prefixMatchInfoProducerName,
      "px",
    );
    assert.equal(config.plugins.length, 5); // px, scorer, picker, handler, detector
  });

  it("the printed effective config loads back to the same config", () => {
    const first = loadConfig(readFileSync("config/examples/default.yaml", "utf8")).config;
    const printed = printConfig(first)
      .replace(/^ {4}kind: .*\n/gm, "")
      .replace(/^ {4}origin: .*\n/gm, "")
      .replace(/^(profileHandler|saturationDetector|objectives|featureGates): .*\n/gm, "");
    const again = loadConfig(printed).config;
    assert.deepEqual(
      again.plugins.map((p) => [p.name, p.parameters]),
      first.plugins.map((p) => [p.name, p.parameters]),
    );
    assert.deepEqual(again.schedulingProfiles, first.schedulingProfiles);
  });

  it("reads InferenceObjective documents into objective priorities", () => {
    const { config } = loadConfig(
      `${HEAD}plugins:\n- type: random-picker\n---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: { name: batch }\nspec: { priority: -1 }\n---\napiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: { name: chat }\nspec: { priority: 10, poolRef: { name: pool } }\n`,
    );
    assert.deepEqual(config.objectives, { batch: -1, chat: 10 });
  });

  it("parses feature gates including name=false", () => {
    const { config, warnings } = loadConfig(
      `${HEAD}featureGates: [flowControl, haPopulateNonLeaderDatastore=false]\nplugins:\n- type: random-picker\n`,
    );
    assert.deepEqual(config.featureGates, { flowControl: true, haPopulateNonLeaderDatastore: false });
    assert.ok(!warnings.some((w) => w.includes("flowControl")), warnings.join("\n"));
    // The gate alone turns flow control on with llm-d's defaults.
    assert.equal(config.flowControl?.defaultRequestTTL, 60);
    assert.deepEqual(config.flowControl?.defaultBand.fairness, { kind: "global-strict" });
  });
});

describe("bad configs are ConfigErrors naming the culprit", () => {
  const P = `${HEAD}plugins:\n`;
  it("unknown top-level key", () =>
    rejects(`${P}- type: random-picker\nschedulingProfile: []\n`, '"schedulingProfile"'));
  it("wrong kind / apiVersion", () => {
    rejects("apiVersion: llm-d.ai/v1alpha1\nkind: Other\nplugins: []\n", "kind");
    rejects("apiVersion: v2\nkind: EndpointPickerConfig\nplugins: []\n", "apiVersion", '"v2"');
  });
  it("no plugins", () => rejects(HEAD, "no plugins"));
  it("unknown plugin type", () =>
    rejects(`${P}- type: quee-scorer\n`, '"quee-scorer"', "unknown plugin type"));
  it("known but unimplemented type", () =>
    rejects(`${P}- type: context-length-aware\n`, "context-length-aware", "not implemented"));
  it("unknown parameter", () =>
    rejects(
      `${P}- type: queue-scorer\n  name: q\n  parameters: { threshold: 3 }\n`,
      'plugin "q"',
      "queue-scorer",
      '"threshold"',
    ));
  it("wrong parameter type", () =>
    rejects(
      `${P}- type: token-load-scorer\n  parameters: { queueThresholdTokens: "many" }\n`,
      "token-load-scorer",
      "queueThresholdTokens",
      "number",
    ));
  it("out-of-range parameter", () =>
    rejects(
      `${P}- type: prefix-cache-affinity-filter\n  parameters: { affinityThreshold: 1.5 }\n`,
      "affinityThreshold",
    ));
  it("unsupported llm-d parameter", () =>
    rejects(
      `${P}- type: prefix-cache-affinity-filter\n  parameters: { prefillCalibrationFile: /x }\n`,
      "prefillCalibrationFile",
      "not supported",
    ));
  it("unknown parameter value", () =>
    rejects(
      `${P}- type: prefix-cache-affinity-filter\n  parameters: { ttftSource: oracle }\n`,
      "ttftSource",
      "latencyPredictor",
    ));
  it("duplicate plugin names", () =>
    rejects(`${P}- type: queue-scorer\n- type: queue-scorer\n`, '"queue-scorer"', "twice"));
  it("pluginRef to a missing plugin", () =>
    rejects(
      `${P}- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: kv-scorer\n`,
      'profile "p"',
      '"kv-scorer"',
    ));
  it("scorer without a usable weight", () => {
    rejects(
      `${P}- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 0\n`,
      "queue-scorer",
      "weight",
    );
    rejects(
      `${P}- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -2\n`,
      "weight",
    );
    rejects(
      `${P}- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n    weight: heavy\n`,
      "weight",
      "number",
    );
  });
  it("weight on a filter", () =>
    rejects(
      `${P}- type: decode-filter\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: decode-filter\n    weight: 2\n`,
      "decode-filter",
      "only to scorers",
    ));
  it("two pickers in a profile", () =>
    rejects(
      `${P}- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: random-picker\n  - pluginRef: max-score-picker\n`,
      'profile "p"',
      "two pickers",
    ));
  it("two pickers and no profiles", () =>
    rejects(`${P}- type: random-picker\n- type: max-score-picker\n`, "several pickers"));
  it("ambiguous producer", () =>
    rejects(
      `${P}- type: approx-prefix-cache-producer\n  name: p1\n- type: approx-prefix-cache-producer\n  name: p2\n- type: prefix-cache-scorer\n`,
      "prefix-cache-scorer",
      "prefixMatchInfoProducerName",
    ));
  it("producer name that is not a producer", () =>
    rejects(
      `${P}- type: queue-scorer\n- type: prefix-cache-scorer\n  parameters: { prefixMatchInfoProducerName: queue-scorer }\n`,
      '"queue-scorer"',
      "prefix-match-info",
    ));
  it("single-profile-handler with two profiles", () =>
    rejects(
      `${P}- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: [{ pluginRef: queue-scorer }]\n- name: b\n  plugins: [{ pluginRef: queue-scorer }]\n`,
      "single-profile-handler",
      "a, b",
    ));
  it("disagg handler naming a missing profile or decider", () => {
    rejects(
      `${P}- type: queue-scorer\n- type: disagg-profile-handler\n`,
      "disagg-profile-handler",
      'decode profile "decode"',
    );
    rejects(
      `${P}- type: queue-scorer\n- type: disagg-profile-handler\n  parameters: { deciders: { prefill: nope } }\nschedulingProfiles:\n- name: decode\n  plugins: [{ pluginRef: queue-scorer }]\n- name: prefill\n  plugins: [{ pluginRef: queue-scorer }]\n`,
      "deciders.prefill",
      '"nope"',
    );
  });
  it("a profile handler inside a profile", () =>
    rejects(
      `${P}- type: single-profile-handler\nschedulingProfiles:\n- name: p\n  plugins: [{ pluginRef: single-profile-handler }]\n`,
      "profile-handler",
    ));
  it("invalid YAML and bad feature gates", () => {
    rejects("plugins: [\n", "invalid YAML", "; fix the YAML at the line shown");
    rejects(`${HEAD}featureGates: flowControl\nplugins:\n- type: random-picker\n`, "featureGates");
  });
  it("bad InferenceObjective", () =>
    rejects(
      `${P}- type: random-picker\n---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: { name: x }\nspec: { priority: high }\n`,
      '"x"',
      "priority",
    ));
});

it("a config with no EndpointPickerConfig document says how to add one", () => {
  for (const text of [
    "",
    `apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: { name: x }\nspec: { priority: 1 }\n`,
  ])
    rejects(
      text,
      "config: no EndpointPickerConfig document found; add one with apiVersion: llm-d.ai/v1alpha1 and kind: EndpointPickerConfig (config/examples/default.yaml is one)",
    );
});

it("an alias to an unset anchor is a ConfigError naming the YAML problem, not a ReferenceError", () => {
  assert.throws(
    () => loadConfig("apiVersion: *x\nkind: EndpointPickerConfig\n"),
    (e: Error) => e instanceof ConfigError && /invalid YAML: Unresolved alias.*quote a value/.test(e.message),
  );
});
