/** The router's view of tiered KV caches: precise-prefix-cache-producer's tier configuration (llm-d's
 * indexerConfig.kvCacheBackendConfigs, rejected tier names, shared storage, time-saved scoring), and
 * approximate mode: llm-d's tiered-prefix-cache router configs load unchanged and keep two indexes,
 * and autoTune sizes the LRU from GPU plus CPU blocks. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import { extractMetrics } from "../src/datalayer/extract.ts";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  type PreciseMatchInfo,
  PrecisePrefixProducer,
} from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { ApproxPrefixProducer } from "../src/scheduler/plugins/prefix/producer.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import { storeBlocks } from "./helpers/precise-store.ts";

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
const TOKENS = Array.from({ length: 16 * 8 }, (_, i) => 500 + i); // 8 full blocks
const eps = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")];

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

const precise = (params: string) =>
  `${HEAD}plugins:\n- type: precise-prefix-cache-producer\n  name: precise\n  parameters: ${params}\n- type: prefix-cache-scorer\n`;

async function preciseScheduler(params: string) {
  const { scheduler } = await createScheduler(precise(params), { seed: 1, hasher: h });
  const p = scheduler.plugins.get("precise");
  assert.ok(p instanceof PrecisePrefixProducer);
  return { scheduler, producer: p };
}

/** The engine stores blocks [0, n) of TOKENS on an endpoint. */
const store = (p: PrecisePrefixProducer, id: string, n: number, medium: string) =>
  storeBlocks(p, id, TOKENS, n, medium);

describe("precise-prefix-cache-producer tiers", () => {
  it("reads llm-d's indexerConfig.kvCacheBackendConfigs and weighs a CPU copy by it", async () => {
    const { scheduler: s, producer } = await preciseScheduler(
      "{ indexerConfig: { kvBlockIndexConfig: { enableMetrics: true }, kvCacheBackendConfigs: [{ name: GPU, weight: 1.0 }, { name: CPU, weight: 0.5 }] } }",
    );
    assert.deepEqual(producer.tierWeights, { gpu: 1, cpu: 0.5 });
    store(producer, "a:1", 8, "CPU");
    const r = s.schedule(completion("r", "", { tokenIds: TOKENS }), eps, 1);
    const info = r.cycle.get(prefixKey("precise")) as PreciseMatchInfo;
    assert.equal(info.matchBlocks("a:1"), 4);
    assert.equal(info.heldBlocks("a:1"), 8);
  });

  it("keeps the tier weights of a deprecated precise-prefix-cache-scorer and loads llm-d's kvEventsConfig keys", async () => {
    const { scheduler: s } = await createScheduler(
      `${HEAD}plugins:\n- type: precise-prefix-cache-scorer\n  parameters:\n    indexerConfig:\n      kvCacheBackendConfigs: [{ name: gpu, weight: 1 }, { name: cpu, weight: 0.3 }]\n`,
      { hasher: h },
    );
    const p = [...s.plugins.values()].find((x) => x instanceof PrecisePrefixProducer);
    assert.ok(p instanceof PrecisePrefixProducer);
    assert.deepEqual(p.tierWeights, { gpu: 1, cpu: 0.3 });
    const { producer } = await preciseScheduler(
      '{ kvEventsConfig: { topicFilter: "kv@", engineType: vllm, concurrency: 8, discoverPods: true, podDiscoveryConfig: { socketPort: 5556 } } }',
    );
    assert.equal(producer.kvEvents.socketPort, 5556);
  });

  it("rejects a tier name without a weight, a missing gpu tier and duplicates at config load", async () => {
    const bad = (params: string, re: RegExp) =>
      assert.rejects(createScheduler(precise(params), { hasher: h }), re);
    await bad("{ sharedStorageTiers: [shared_storage] }", /does not weigh/);
    await bad("{ kvCacheBackendConfigs: [{ name: cpu, weight: 0.8 }] }", /no "gpu" entry/);
    await bad("{ kvCacheBackendConfigs: [{ name: gpu, weight: 1 }, { name: GPU, weight: 0.5 }] }", /twice/);
    await bad("{ kvCacheBackendConfigs: [{ name: storage }] }", /weight/);
    await bad("{ sharedStorageTiers: [gpu] }", /cannot name gpu/);
    await bad(
      "{ kvCacheBackendConfigs: [{ name: gpu, weight: 1 }, { name: nvme, weight: 0.5 }], timeSavedScoring: {} }",
      /no bandwidth for tier "nvme"/,
    );
    await bad("{ blockSizeTokens: 16, offloadBlockSizeTokens: 24 }", /not a multiple/);
  });

  it("a storage hit counts for every endpoint when the tier is shared", async () => {
    const { scheduler: s, producer } = await preciseScheduler(
      "{ kvCacheBackendConfigs: [{ name: gpu, weight: 1 }, { name: cpu, weight: 0.8 }, { name: shared_storage, weight: 0.6 }], sharedStorageTiers: [shared_storage] }",
    );
    store(producer, "a:1", 8, "SHARED_STORAGE");
    const r = s.schedule(completion("r", "", { tokenIds: TOKENS }), eps, 1);
    const info = r.cycle.get(prefixKey("precise")) as PreciseMatchInfo;
    for (const e of eps) assert.ok(Math.abs(info.matchBlocks(e.id) - 8 * 0.6) < 1e-9, e.id);
  });

  it("time-saved scoring orders a CPU hit between a GPU hit and a miss", async () => {
    const { scheduler: s, producer } = await preciseScheduler("{ timeSavedScoring: {} }");
    // Defaults: 15928 tok/s prefill, 128 KiB/token, CPU at 25 GB/s: load costs 8.35% of recompute.
    const cpu = 1 - (15928 * 131072) / 25e9;
    assert.ok(Math.abs(producer.tierWeights.cpu - cpu) < 1e-12);
    assert.equal(producer.tierWeights.gpu, 1);
    store(producer, "a:1", 8, "GPU");
    store(producer, "b:1", 8, "CPU");
    const r = s.schedule(completion("r", "", { tokenIds: TOKENS }), eps, 1, { explain: true });
    const raw = (id: string) =>
      r.explanation?.profiles.default.candidates
        .find((c) => c.id === id)
        ?.scores.find((x) => x.type === "prefix-cache-scorer")?.raw ?? Number.NaN;
    assert.equal(raw("a:1"), 1);
    assert.ok(Math.abs(raw("b:1") - cpu) < 1e-9);
    assert.equal(raw("c:1"), 0);
    assert.ok(raw("a:1") > raw("b:1") && raw("b:1") > raw("c:1"));
    assert.equal(r.target?.id, "a:1");
    // A tier slower than recompute saves nothing: it scores as a miss, not negative.
    const slow = await preciseScheduler(
      "{ timeSavedScoring: { tierBandwidths: [{ name: cpu, bytesPerSecond: 1e9 }] } }",
    );
    assert.equal(slow.producer.tierWeights.cpu, 0);
  });
});

describe("approximate mode with a CPU tier", () => {
  const fixture = (f: string) => readFileSync(new URL(`fixtures/tiered-guide/${f}`, import.meta.url), "utf8");

  it("llm-d's single-host tiered guide config loads unchanged; the CPU index outlives the GPU one", async () => {
    const { scheduler: s } = await createScheduler(fixture("llm-d-tiered-cpu-single-host.yaml"), {
      seed: 1,
      hasher: h,
    });
    const gpuP = s.plugins.get("gpu-prefix-cache-producer");
    const cpuP = s.plugins.get("cpu-prefix-cache-producer");
    assert.ok(gpuP instanceof ApproxPrefixProducer && cpuP instanceof ApproxPrefixProducer);
    // A tiny HBM (64 blocks of 16 tokens = 16 index blocks of 64) and the guide's 82,000-block CPU index.
    const one = [endpoint("a:1", { cacheBlockSize: 16, cacheNumBlocks: 64 })];
    assert.equal(gpuP.capacity(one[0], 64), 16);
    assert.equal(cpuP.capacity(one[0], 64), 82000);
    const prompt = (i: number) => `${String(i).repeat(4)} `.repeat(420).slice(0, 2048); // 8 blocks of 256 bytes
    for (let i = 1; i <= 3; i++) {
      const req = completion(`w${i}`, prompt(i));
      s.onPicked(req, s.schedule(req, one, i), i);
    }
    const r = s.schedule(completion("again", prompt(1)), one, 10, { explain: true });
    const raw = (name: string) =>
      r.explanation?.profiles.default.candidates[0].scores.find((x) => x.name === name)?.raw;
    assert.equal(raw("gpu-prefix-cache-scorer"), 0, "the GPU index evicted the first prompt");
    assert.equal(raw("cpu-prefix-cache-scorer"), 1, "the CPU index still holds it");
  });

  it("llm-d's CPU guide config loads unchanged; its unnamed GPU scorer reads a default producer, not the CPU one", async () => {
    const { scheduler: s } = await createScheduler(fixture("llm-d-tiered-cpu.yaml"), { seed: 1, hasher: h });
    const cpuP = s.plugins.get("cpuPrefixProducer");
    const dflt = s.plugins.get("approx-prefix-cache-producer");
    assert.ok(cpuP instanceof ApproxPrefixProducer && dflt instanceof ApproxPrefixProducer);
    assert.equal(cpuP.params.lruCapacityPerServer, 41000);
    assert.equal(dflt.params.autoTune, true);
  });

  it("autoTune sizes the LRU from GPU plus CPU blocks (cache_config_info num_cpu_blocks)", async () => {
    const text = (cpu: string) =>
      [
        "vllm:num_requests_waiting 0",
        "vllm:num_requests_running 0",
        "vllm:kv_cache_usage_perc 0",
        `vllm:cache_config_info{block_size="16",engine="0",num_cpu_blocks="${cpu}",num_gpu_blocks="1000"} 1.0`,
        "",
      ].join("\n");
    const m = extractMetrics(parsePromText(text("3000"), { lenient: true }).families);
    assert.equal(m.cacheNumCpuBlocks, 3000);
    assert.equal(
      extractMetrics(parsePromText(text("None"), { lenient: true }).families).cacheNumCpuBlocks,
      undefined,
    );
    const { scheduler: s } = await createScheduler(
      `${HEAD}plugins:\n- type: approx-prefix-cache-producer\n`,
      {
        hasher: h,
      },
    );
    const p = s.plugins.get("approx-prefix-cache-producer");
    assert.ok(p instanceof ApproxPrefixProducer);
    const ep = (cpu?: number) =>
      endpoint("a:1", {
        cacheBlockSize: 16,
        cacheNumBlocks: 1000,
        ...(cpu ? { cacheNumCpuBlocks: cpu } : {}),
      });
    assert.equal(p.capacity(ep(), 64), 250, "GPU only: 1000 × 16 / 64");
    assert.equal(p.capacity(ep(3000), 64), 1000, "GPU + CPU: 4000 × 16 / 64");
  });
});
