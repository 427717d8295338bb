/**
 * P/D in the fleet simulator: a scenario with a prefill and a decode pool runs to completion
 * through the real scheduler (disagg-profile-handler + a decider); a disaggregated request's KV
 * crosses the link (the decoder's external_kv_transfer tokens, bytes = tokens × KV bytes per token);
 * a short prompt under prefix-based-pd-decider stays on the decoder; TCP gives a longer TTFT than
 * RDMA on the same seed; runs are deterministic. And the scenario format's pools and per-run fleets.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import type { PdSummary } from "../src/sim/fleet/format-pd.ts";
import { formatFleetComparison } from "../src/sim/fleet/format-pd.ts";
import { loadScenario, parseScenario, ScenarioError } from "../src/sim/fleet/scenario.ts";
import { gpuCount, type SimRun, simulate, stripWallClock } from "../src/sim/fleet/simulate.ts";

const FILE = resolve("scenarios/test-pd.yaml");

const PD_CONFIG = (nonCached: number) =>
  `{
  apiVersion: llm-d.ai/v1alpha1, kind: EndpointPickerConfig,
  plugins: [
    { type: approx-prefix-cache-producer },
    { type: prefix-cache-scorer }, { type: queue-scorer },
    { type: prefill-filter }, { type: decode-filter }, { type: max-score-picker },
    { type: disagg-profile-handler, parameters: { deciders: { prefill: prefix-based-pd-decider } } },
    { type: prefix-based-pd-decider, parameters: { nonCachedTokens: ${nonCached} } } ],
  schedulingProfiles: [
    { name: prefill, plugins: [ { pluginRef: prefill-filter }, { pluginRef: max-score-picker }, { pluginRef: queue-scorer } ] },
    { name: decode, plugins: [ { pluginRef: decode-filter }, { pluginRef: max-score-picker }, { pluginRef: queue-scorer } ] } ] }`.replace(
    /\s*\n\s*/g,
    " ",
  );

/** 1 prefill + 1 decode Llama-3.1-8B replica; `input` prompt tokens, 20-token answers. */
function scenario(o: { input: number; nonCached?: number; routers?: string; seed?: number }) {
  const routers =
    o.routers ??
    `  - { name: rdma, config: ${PD_CONFIG(o.nonCached ?? 256)}, kvLink: { transport: rdma } }
  - { name: tcp, config: ${PD_CONFIG(o.nonCached ?? 256)}, kvLink: { transport: tcp } }`;
  return parseScenario(
    `
name: test-pd
seed: ${o.seed ?? 5}
fleet:
  kvTokens: 40000
  maxModelLen: 8192
  pools:
    - { role: prefill, replicas: 1, profile: llama-3.1-8b-h100 }
    - { role: decode, replicas: 1, profile: llama-3.1-8b-h100 }
kvLink: { handshakeS: 0.5 }
routers:
${routers}
workload:
  workload: random
  numRequests: 24
  options: { inputLen: { mean: ${o.input}, std: 0, min: ${o.input}, max: ${o.input} }, outputLen: { mean: 20, std: 0, min: 20, max: 20 }, api: completion }
  arrival: { type: poisson, rate: 8 }
slo: ttft=2
`,
    FILE,
  );
}

const pdOf = (r: SimRun) => (r.simulation as { pd: PdSummary }).pd;

describe("P/D fleet simulation", () => {
  it("a long prompt is prefilled on the prefill pool and its KV crosses the link into the decoder", async () => {
    const sc = scenario({ input: 3000 });
    const res = await simulate(sc, { routers: ["rdma"] });
    const run = res.runs[0];
    assert.equal(run.completed, 24);
    assert.equal(run.errors, 0);
    const pd = pdOf(run);
    assert.equal(pd.disaggregated, 24);
    assert.equal(pd.decode_only, 0);
    assert.equal(pd.transfers, 24);
    const external = pd.prompt_tokens_by_source.external_kv_transfer;
    assert.ok(external > 0, "the decoder got prompt tokens over the link");
    assert.equal(pd.transferred_tokens, run.input_tokens, "a decoder holds none of a random prompt");
    assert.equal(pd.bytes, pd.transferred_tokens * kvBytesPerToken(sc.fleet.profile.model));
    // vLLM recomputes each request's last prompt token on the decoder.
    assert.equal(external, pd.transferred_tokens - pd.transfers);
    assert.equal(pd.handshakes, 1, "one (decoder, prefiller) pair");
    // The prefill leg's token is not the client's: every answer has exactly its 20 tokens.
    assert.equal(run.output_tokens, 24 * 20);
  });

  it("a short prompt under prefix-based-pd-decider stays on the decoder: no transfer", async () => {
    const res = await simulate(scenario({ input: 100, nonCached: 256 }), { routers: ["rdma"] });
    const pd = pdOf(res.runs[0]);
    assert.equal(res.runs[0].completed, 24);
    assert.equal(pd.disaggregated, 0);
    assert.equal(pd.decode_only, 24);
    assert.equal(pd.transfers, 0);
    assert.equal(pd.prompt_tokens_by_source.external_kv_transfer ?? 0, 0);
  });

  it("the TCP fallback gives a longer TTFT than RDMA on the same seed", async () => {
    const res = await simulate(scenario({ input: 3000 }));
    const [rdma, tcp] = res.runs;
    assert.ok((tcp.ttft_p50_s as number) > (rdma.ttft_p50_s as number));
    assert.ok((pdOf(tcp).transfer_mean_s as number) > (pdOf(rdma).transfer_mean_s as number));
  });

  it("the fleet comparison names each run's pools, GPUs, goodput under the SLO and the P/D share", async () => {
    const res = await simulate(scenario({ input: 3000 }), { routers: ["rdma"] });
    const text = formatFleetComparison(res);
    assert.match(text, /goodput: share and rate of requests with ttft ≤ 2 s/);
    const row = text.split("\n").find((l) => l.startsWith("rdma")) ?? "";
    assert.match(row, /1 P TP1 \+ 1 D TP1\s+2\s/);
    assert.match(row, /100%\s+[\d.]+ \/ [\d.]+$/);
    assert.equal(res.runs[0].goodput?.slo.ttft, 2);
  });

  it("is deterministic for a seed", async () => {
    const a = stripWallClock(await simulate(scenario({ input: 2000 })));
    const b = stripWallClock(await simulate(scenario({ input: 2000 })));
    assert.deepEqual(a, b);
  });
});

describe("scenario pools", () => {
  it("the shipped P/D scenarios compare fleets of equal GPU count", () => {
    for (const f of ["pd-long-prompt", "pd-short-prompt", "pd-ratio-sweep", "pd-transport"]) {
      const sc = loadScenario(`scenarios/${f}.yaml`);
      const gpus = sc.routers.map((r) => gpuCount(r.pools));
      assert.deepEqual(new Set(gpus), new Set([16]), f);
      assert.ok(
        sc.routers.some((r) => r.pools.some((p) => p.labels["llm-d.ai/role"] === "prefill")),
        `${f} has a P/D run`,
      );
    }
  });

  it("labels each pool's replicas with its role and lets a run bring its own fleet", () => {
    const sc = scenario({
      input: 100,
      routers: `  - { name: agg, config: ../config/examples/load-only.yaml, fleet: { replicas: 2, profile: llama-3.1-8b-h100, kvTokens: 40000, maxModelLen: 8192 } }
  - { name: pd, config: ${PD_CONFIG(16)} }`,
    });
    assert.deepEqual(
      sc.pools.map((p) => p.labels["llm-d.ai/role"]),
      ["prefill", "decode"],
    );
    assert.deepEqual(
      sc.routers[0].pools.map((p) => [p.replicas, p.labels]),
      [[2, {}]],
    );
    assert.equal(sc.routers[1].pools, sc.pools);
    assert.equal(sc.routers[1].kvLink.handshakeS, 0.5);
    assert.equal(sc.routers[1].kvLink.bandwidth, 8e9);
  });

  it("rejects pools beside replicas, and pools serving different models", () => {
    const bad = (fleet: string) =>
      parseScenario(
        `name: x\nseed: 1\nfleet: ${fleet}\nrouters: [{ name: a, config: ../config/examples/load-only.yaml }]\nworkload: { workload: random, numRequests: 2 }\n`,
        FILE,
      );
    assert.throws(
      () => bad("{ replicas: 2, pools: [{ replicas: 1, profile: llama-3.1-8b-h100 }] }"),
      (e: Error) => e instanceof ScenarioError && /fleet\.pools: give pools or replicas/.test(e.message),
    );
    assert.throws(
      () =>
        bad(
          "{ pools: [{ replicas: 1, profile: llama-3.1-8b-h100 }, { replicas: 1, profile: qwen3-32b-tp2-h100 }] }",
        ),
      /every pool must serve one model/,
    );
    assert.throws(() => bad("{ pools: [{ replicas: 1, profile: llama-3.1-8b-h100, role: both }] }"), /role/);
  });
});
