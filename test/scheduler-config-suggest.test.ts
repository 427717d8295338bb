// Config errors for unknown plugin types, parameters and pluginRefs name the closest known names
// (edit distance), legacy names included.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { loadConfig } from "../src/scheduler/config.ts";
import { ConfigError } from "../src/scheduler/errors.ts";
import { closestNames, editDistance } from "../src/scheduler/suggest.ts";

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n";

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

describe("closest-name suggestions", () => {
  it("edit distance", () => {
    assert.equal(editDistance("kitten", "sitting"), 3);
    assert.equal(editDistance("", "abc"), 3);
    assert.equal(editDistance("flaw", "lawn"), editDistance("lawn", "flaw"));
    assert.deepEqual(closestNames("quee-scorer", ["random-picker", "queue-scorer", "queue"]), [
      "queue-scorer",
    ]);
    assert.deepEqual(closestNames("zzz-unrelated", ["queue-scorer", "random-picker"]), []);
  });

  it("an unknown plugin type names the closest types, legacy ones included", () => {
    rejects(`${HEAD}- type: kv-cache-utilisation-scorer\n`, 'Did you mean "kv-cache-utilization-scorer"?');
    rejects(`${HEAD}- type: by-lable\n`, '"by-label"');
    rejects(`${HEAD}- type: metrics-data-sorce\n`, '"metrics-data-source"');
    assert.throws(
      () => loadConfig(`${HEAD}- type: completely-different\n`),
      (e: unknown) => e instanceof ConfigError && !e.message.includes("Did you mean"),
    );
  });

  it("an unknown parameter names the closest parameters, nested and legacy ones included", () => {
    rejects(`${HEAD}- type: no-hit-lru-scorer\n  parameters: { lruSise: 3 }\n`, 'Did you mean "lruSize"?');
    rejects(`${HEAD}- type: prefix-cache-scorer\n  parameters: { hashBlokSize: 3 }\n`, '"hashBlockSize"');
    rejects(
      `${HEAD}- type: precise-prefix-cache-producer\n  parameters: { kvEventsConfig: { topicFiltr: kv } }\n`,
      '"kvEventsConfig.topicFiltr"',
      '"topicFilter"',
    );
  });

  it("a dangling pluginRef names the closest declared plugin", () =>
    rejects(
      `${HEAD}- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorr\n`,
      'Did you mean "queue-scorer"?',
    ));
});
