/**
 * The flowControl section and the flow-control policy plugins (src/flow/flow-config.ts): they take
 * effect only with the flowControl feature gate (without it: a warning, legacy admission), llm-d's
 * quantities, durations and defaults, policy refs by plugin name or type, and a ConfigError that
 * says what to do for each bad value.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { parseQuantity } from "../src/flow/flow-config.ts";
import { loadConfig } from "../src/scheduler/config.ts";
import { ConfigError } from "../src/scheduler/errors.ts";

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
const GATED = `${HEAD}featureGates: [flowControl]\n`;
const PICKER = "- type: max-score-picker\n";

function load(text: string) {
  return loadConfig(text);
}

function bad(text: string, re: RegExp): void {
  assert.throws(
    () => load(text),
    (e: unknown) => e instanceof ConfigError && re.test(e.message),
  );
}

describe("flowControl takes effect only with the feature gate", () => {
  it("without the gate the section and policies warn and flow control is off", () => {
    const { config, warnings } = load(
      `${HEAD}plugins:\n${PICKER}- type: round-robin-fairness-policy\nflowControl:\n  maxRequests: "1k"\n`,
    );
    assert.equal(config.flowControl, null);
    assert.ok(
      warnings.some((w) => /"flowControl" has no effect without the feature gate/.test(w)),
      warnings.join("\n"),
    );
    assert.ok(warnings.some((w) => /round-robin-fairness-policy.*featureGates: \[flowControl\]/.test(w)));
  });

  it("a config without flow control has none, and no new warnings", () => {
    const { config, warnings } = load(`${HEAD}plugins:\n${PICKER}`);
    assert.equal(config.flowControl, null);
    assert.deepEqual(warnings, []);
  });

  it("the gate alone: llm-d's defaults", () => {
    const fc = load(`${GATED}plugins:\n${PICKER}`).config.flowControl;
    assert.deepEqual(fc, {
      maxRequests: 0,
      maxBytes: 0,
      defaultRequestTTL: 60,
      noEndpointRequestTTL: 60,
      bands: [],
      defaultBand: { maxRequests: 0, maxBytes: 0, fairness: { kind: "global-strict" }, ordering: "fcfs" },
      defaultNegativeBand: null,
      usageLimit: { kind: "static", threshold: 1 },
      flowGcAfter: 300,
    });
  });
});

describe("values", () => {
  it("Kubernetes quantities", () => {
    assert.equal(parseQuantity("500"), 500);
    assert.equal(parseQuantity("1k"), 1000);
    assert.equal(parseQuantity("1.5k"), 1500);
    assert.equal(parseQuantity("10Gi"), 10 * 2 ** 30);
    assert.equal(parseQuantity("500M"), 5e8);
    assert.equal(parseQuantity(42), 42);
    assert.equal(parseQuantity("ten"), null);
    assert.equal(parseQuantity("-1"), null);
    assert.equal(parseQuantity("1 k"), null);
  });

  it("durations, templates, named policy instances with parameters, usage limit", () => {
    const { config } = load(
      `${GATED}plugins:\n${PICKER}- type: vtc-fairness-policy\n  name: heavy-output\n  parameters: { outputTokenWeight: 4 }\n- type: priority-holdback-policy\n  parameters: { minCeiling: 0.5 }\n` +
        `flowControl:\n  defaultRequestTTL: "1m30s"\n  noEndpointRequestTTL: "5m"\n  usageLimitPolicyPluginRef: priority-holdback-policy\n` +
        `  defaultPriorityBand: { maxRequests: "300", fairnessPolicyRef: heavy-output }\n` +
        `  defaultNegativePriorityBand: { maxRequests: "5" }\n` +
        `  priorityBands:\n  - { priority: 7, orderingPolicyRef: edf-ordering-policy }\n`,
    );
    const fc = config.flowControl;
    assert.equal(fc?.defaultRequestTTL, 90);
    assert.equal(fc?.noEndpointRequestTTL, 300);
    assert.deepEqual(fc?.usageLimit, {
      kind: "priority-holdback",
      domain: "rank",
      minCeiling: 0.5,
      maxCeiling: 1,
    });
    assert.deepEqual(fc?.defaultBand.fairness, { kind: "vtc", promptTokenWeight: 1, outputTokenWeight: 4 });
    // The negative template inherits what it does not set from the default band.
    assert.deepEqual(fc?.defaultNegativeBand, { ...fc?.defaultBand, maxRequests: 5 });
    // An explicit band does not inherit the template's policies: llm-d's defaults apply.
    assert.deepEqual(fc?.bands, [
      { priority: 7, maxRequests: 0, maxBytes: 0, fairness: { kind: "global-strict" }, ordering: "edf" },
    ]);
  });
});

describe("bad values are ConfigErrors that say what to do", () => {
  const P = `${GATED}plugins:\n${PICKER}`;
  it("unknown keys", () => {
    bad(
      `${P}flowControl: { maxRequest: 5 }\n`,
      /flowControl: unknown key "maxRequest"; allowed: maxBytes, maxRequests/,
    );
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { priority: 1, fairness: x }\n`,
      /priorityBands\[0\]: unknown key "fairness"/,
    );
  });
  it("a bad quantity or duration", () => {
    bad(
      `${P}flowControl: { maxBytes: "lots" }\n`,
      /flowControl.maxBytes: expected a count or size such as "500", "1k" or "10Gi"/,
    );
    bad(
      `${P}flowControl: { defaultRequestTTL: 60 }\n`,
      /defaultRequestTTL: expected a duration such as "60s"/,
    );
  });
  it("bands: priority required, an integer, once", () => {
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { maxRequests: "5" }\n`,
      /priorityBands\[0\]: "priority" is required/,
    );
    bad(`${P}flowControl:\n  priorityBands:\n  - { priority: 1.5 }\n`, /priority: expected an integer/);
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { priority: 1 }\n  - { priority: 1 }\n`,
      /priority 1 is configured twice; merge the two bands/,
    );
  });
  it("policy refs: the right role, a known name (with a suggestion)", () => {
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { priority: 1, fairnessPolicyRef: fcfs-ordering-policy }\n`,
      /fairnessPolicyRef: "fcfs-ordering-policy" is an ordering policy; give a fairness policy/,
    );
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { priority: 1, fairnessPolicyRef: round-robin-fairnes-policy }\n`,
      /names no declared plugin and no policy type; declare it under plugins.*round-robin-fairness-policy/,
    );
    bad(
      `${P}flowControl:\n  priorityBands:\n  - { priority: 1, orderingPolicyRef: max-score-picker }\n`,
      /is a max-score-picker, not a flow-control ordering policy/,
    );
  });
  it("a usage-limit policy kvgate does not implement, and one missing its required parameter", () => {
    bad(
      `${P}- type: soft-reflective-ceiling-policy\nflowControl: { usageLimitPolicyPluginRef: soft-reflective-ceiling-policy }\n`,
      /not implemented in kvgate; use static-usage-limit-policy or priority-holdback-policy/,
    );
    bad(`${P}- type: priority-holdback-policy\n`, /priority-holdback-policy.*minCeiling/);
    bad(
      `${P}- type: vtc-fairness-policy\n  parameters: { outputTokenWeight: -1 }\n`,
      /vtc-fairness-policy.*outputTokenWeight/,
    );
  });
  it("the saturation detector ref must name the configured detector", () => {
    bad(
      `${P}flowControl: { saturationDetector: { pluginRef: concurrency-detector } }\n`,
      /is not the configured saturation detector \("utilization-detector"\)/,
    );
    bad(
      `${P}saturationDetector: { pluginRef: nope }\n`,
      /saturationDetector.pluginRef "nope" is not the configured/,
    );
    assert.equal(
      load(`${P}saturationDetector: { pluginRef: utilization-detector }\n`).config.saturationDetector,
      "utilization-detector",
    );
  });
  it("concurrency-detector needs the gate (it counts what flow control sends); hybrid is not implemented", () => {
    bad(
      `${HEAD}plugins:\n${PICKER}- type: concurrency-detector\n`,
      /counts requests in flight through flow control; add featureGates: \[flowControl\], or use utilization-detector/,
    );
    bad(
      `${P}- type: concurrency-detector\n  parameters: { concurrencyMode: hybrid }\n`,
      /hybrid \(per-endpoint\) is not implemented in kvgate; use requests or tokens/,
    );
    const { config } = load(`${P}- type: concurrency-detector\n  parameters: { maxConcurrency: 8 }\n`);
    assert.equal(config.saturationDetector, "concurrency-detector");
  });
  it("enableEviction is accepted with a warning (not implemented)", () => {
    const { warnings } = load(`${P}flowControl: { enableEviction: true }\n`);
    assert.ok(warnings.some((w) => /enableEviction.*not implemented/.test(w)));
  });
});
