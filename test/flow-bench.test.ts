/**
 * bench:flow's pure helpers: the config variants it compares are valid llm-d configs with the
 * intended fairness and concurrency limit, and its quantiles, summaries and "critical first" count
 * are right on hand-worked samples.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import {
  flowConfigVariant,
  overtook,
  quantile,
  seededPrompt,
  summarize,
  type Timed,
} from "../src/bench/flow-bench-stats.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { loadConfig } from "../src/scheduler/config.ts";

const EXAMPLE = readFileSync("config/examples/flow-control.yaml", "utf8");

describe("flowConfigVariant", () => {
  it("changes only the standard band's fairness and the detector's maxConcurrency", () => {
    for (const [name, kind] of [
      ["vtc", "vtc"],
      ["round-robin", "round-robin"],
      ["global-strict", "global-strict"],
    ] as const) {
      const { config, warnings } = loadConfig(flowConfigVariant(EXAMPLE, name, 7));
      assert.deepEqual(warnings, [], name);
      const bands = config.flowControl?.bands ?? [];
      assert.deepEqual(
        bands.map((b) => [b.priority, b.fairness.kind]),
        [
          [100, "round-robin"],
          [0, kind],
          [-10, "vtc"],
        ],
        name,
      );
      const det = config.plugins.find((p) => p.type === "concurrency-detector");
      assert.equal(det?.parameters.maxConcurrency, 7, name);
    }
  });

  it("vtc keeps the example's prefill reserve and holdback; vtc-no-reserve drops only the reserve", () => {
    const vtcOf = (name: "vtc" | "vtc-no-reserve" | "vtc-no-holdback") =>
      loadConfig(flowConfigVariant(EXAMPLE, name, 5, 0.4)).config.flowControl?.bands.find(
        (b) => b.priority === 0,
      )?.fairness;
    assert.deepEqual(vtcOf("vtc"), {
      kind: "vtc",
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      holdback: 0.4,
      prefillReserve: 1,
      longPrefillTokens: 1024,
    });
    assert.deepEqual(vtcOf("vtc-no-reserve"), {
      kind: "vtc",
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      holdback: 0.4,
    });
    assert.deepEqual(vtcOf("vtc-no-holdback"), {
      kind: "vtc",
      promptTokenWeight: 1,
      outputTokenWeight: 2,
      prefillReserve: 1,
      longPrefillTokens: 1024,
    });
  });

  it("off: no flow control, no warnings, the objectives kept", () => {
    const text = flowConfigVariant(EXAMPLE, "off", 5);
    const { config, warnings } = loadConfig(text);
    assert.equal(config.flowControl, null);
    assert.deepEqual(warnings, []);
    assert.equal((text.match(/kind: InferenceObjective/g) ?? []).length, 3);
  });
});

describe("bench arithmetic", () => {
  it("seededPrompt is n simulator tokens, the same for a seed and different across seeds", () => {
    const tok = createSimTokenizer();
    assert.equal(tok.encode(seededPrompt(300, 4), false).length, 300);
    assert.equal(seededPrompt(50, 4), seededPrompt(50, 4));
    assert.notEqual(seededPrompt(50, 4), seededPrompt(50, 5));
  });

  it("quantile is nearest-rank", () => {
    const xs = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6];
    assert.equal(quantile(xs, 0.5), 5);
    assert.equal(quantile(xs, 0.9), 9);
    assert.equal(quantile(xs, 1), 10);
    assert.equal(quantile([], 0.5), null);
  });

  const r = (
    cls: string,
    sentAt: number,
    first: number | null,
    done: number,
    status = 200,
    reason: string | null = null,
  ): Timed => ({
    cls,
    sentAt,
    status,
    reason,
    firstTokenAt: first,
    doneAt: done,
    outputTokens: status === 200 ? 10 : 0,
  });

  it("summarize counts served and rejections by status and reason, timing only the served", () => {
    const s = summarize([
      r("x", 0, 1, 2),
      r("x", 0, 3, 5),
      r("x", 1, null, 1, 429, "rejected-saturated"),
      r("x", 1, null, 1, 429, "rejected-saturated"),
      r("x", 1, null, 9, 503, "rejected-ttl-expired"),
    ]);
    assert.equal(s.served, 2);
    assert.deepEqual(s.rejected, { "429 rejected-saturated": 2, "503 rejected-ttl-expired": 1 });
    assert.equal(s.ttftP50, 1);
    assert.equal(s.ttftP90, 3);
    assert.equal(s.latencyP90, 5);
    assert.equal(s.makespan, 5);
    assert.equal(s.outputTokensPerS, 4);
  });

  it("overtook counts other classes' first tokens before the last critical one", () => {
    const rs = [
      r("critical", 0, 2, 3),
      r("critical", 0, 4, 5),
      r("sheddable", 0, 1, 6),
      r("standard", 0, 3, 6),
      r("standard", 0, 5, 7),
      r("sheddable", 0, null, 0, 429, "rejected-saturated"),
    ];
    assert.equal(overtook(rs, "critical"), 2);
    assert.equal(
      overtook(
        rs.filter((x) => x.cls !== "critical"),
        "critical",
      ),
      0,
    );
  });
});
