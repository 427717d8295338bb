/**
 * LoRA-aware routing's pure parts: vllm:lora_requests_info parsed from hand-made Prometheus text
 * (the latest-timestamp series wins, as llm-d's LoRASpec reads it), and lora-affinity-scorer's four
 * levels (llm-d lora_affinity.go), including its order: free capacity outranks "waiting".
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { extractMetrics } from "../src/datalayer/extract.ts";
import { extractLoraInfo, splitAdapters } from "../src/datalayer/lora-info.ts";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { loadConfig } from "../src/scheduler/config.ts";
import { LoraAffinityScorer, loraAffinity } from "../src/scheduler/plugins/scorers/lora-affinity.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";

const fams = (t: string) => parsePromText(t).families;

const BASE = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.25
`;

describe("vllm:lora_requests_info parsing", () => {
  it("takes the series with the latest timestamp, wherever it sits in the exposition", () => {
    const text = `${BASE}# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old-a",waiting_lora_adapters=""} 1.7959950e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora, chat-lora",waiting_lora_adapters="q-lora"} 1.795995045309403e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.79599504e+09
`;
    assert.deepEqual(extractLoraInfo(fams(text)), {
      running: ["sql-lora", "chat-lora"],
      waiting: ["q-lora"],
      maxLora: 2,
    });
    const m = extractMetrics(fams(text));
    assert.deepEqual(m.lora?.running, ["sql-lora", "chat-lora"]);
    assert.equal(m.waitingQueueSize, 1);
  });

  it("is absent without the family (no --enable-lora), and max_lora that is not an integer counts as 0", () => {
    assert.equal(extractLoraInfo(fams(BASE)), undefined);
    assert.equal(extractMetrics(fams(BASE)).lora, undefined);
    const odd = `${BASE}vllm:lora_requests_info{max_lora="x",running_lora_adapters="a,,a",waiting_lora_adapters=""} 5\n`;
    assert.deepEqual(extractLoraInfo(fams(odd)), { running: ["a"], waiting: [], maxLora: 0 });
  });

  it("splits comma-joined names, trimming and dropping empties and repeats", () => {
    assert.deepEqual(splitAdapters(" a, b ,,a,c"), ["a", "b", "c"]);
    assert.deepEqual(splitAdapters(""), []);
    assert.deepEqual(splitAdapters(undefined), []);
  });
});

describe("lora-affinity-scorer", () => {
  const lora = (active: string[], waiting: string[], max: number) => ({
    activeModels: active,
    waitingModels: waiting,
    maxActiveModels: max,
  });

  it("scores active 1.0, free slot 0.8, waiting 0.6, full 0.0", () => {
    assert.equal(loraAffinity(endpoint("a", lora(["x", "y"], [], 2)).metrics, "x"), 1.0);
    assert.equal(loraAffinity(endpoint("b", lora(["y"], [], 2)).metrics, "x"), 0.8);
    assert.equal(loraAffinity(endpoint("c", lora(["y"], ["x"], 2)).metrics, "x"), 0.6);
    assert.equal(loraAffinity(endpoint("d", lora(["y", "z"], [], 2)).metrics, "x"), 0.0);
  });

  it("prefers free capacity over waiting, as llm-d orders its checks", () => {
    assert.equal(loraAffinity(endpoint("c", lora([], ["x"], 2)).metrics, "x"), 0.8);
  });

  it("scores 0 without metrics or LoRA state (max_lora unknown)", () => {
    assert.equal(loraAffinity(null, "x"), 0);
    assert.equal(loraAffinity(endpoint("e").metrics, "x"), 0);
  });

  it("reads the request's target model, index-aligned with the endpoints", () => {
    const eps = [
      endpoint("full", lora(["other"], [], 1)),
      endpoint("hot", lora(["sql-lora"], [], 1)),
      endpoint("free", lora([], [], 1)),
    ];
    const s = new LoraAffinityScorer("la");
    assert.deepEqual(
      [...s.score(cycleFor(completion("r", "hi", { model: "sql-lora" }), eps), eps)],
      [0, 1, 0.8],
    );
    assert.deepEqual(
      [...s.score(cycleFor(completion("r", "hi", { model: "other" }), eps), eps)],
      [1, 0, 0.8],
    );
  });

  it("loads from an EndpointPickerConfig under llm-d's name, with no parameters", () => {
    const cfg = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: lora-affinity-scorer
    weight: 4
  - pluginRef: max-score-picker
`;
    const { config, warnings } = loadConfig(cfg);
    // The profile is taken as written: the scorer at its weight, the picker unweighted.
    assert.deepEqual(config.schedulingProfiles, [
      {
        name: "default",
        plugins: [{ pluginRef: "lora-affinity-scorer", weight: 4 }, { pluginRef: "max-score-picker" }],
      },
    ]);
    // Declared under llm-d's type name, it is a scorer, and (taking no parameters) gets none filled in.
    assert.deepEqual(
      config.plugins.find((p) => p.name === "lora-affinity-scorer"),
      {
        type: "lora-affinity-scorer",
        name: "lora-affinity-scorer",
        kind: "scorer",
        parameters: {},
        origin: "declared",
      },
    );
    // The only thing to say about it is the GIE-era apiVersion the config above uses.
    assert.deepEqual(warnings, [
      "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1",
    ]);
    assert.throws(
      () =>
        loadConfig(
          cfg.replace(
            "- type: lora-affinity-scorer",
            "- type: lora-affinity-scorer\n  parameters: { threshold: 1 }",
          ),
        ),
      /threshold/,
    );
  });
});
