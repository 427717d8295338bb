/**
 * The shared-storage tier in fleet scenarios and in the router: its read bound worked out by hand; a
 * tiered fleet's "all repeats" regime reached from the tiers (resident set in CPU, then storage, each
 * part's share of the hits over its link) instead of "does not fit"; a fleet run where round-robin
 * sends a prompt to a replica that never saw it and storage serves it; the precise index fed by the
 * engines' own events counting a storage copy for every replica; scenario errors.
 */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { Engine } from "../src/engine/engine.ts";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import { SharedStorage } from "../src/engine/storage-tier.ts";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { computeLimits, offloadLimit } from "../src/sim/fleet/limits.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import { parseScenario } from "../src/sim/fleet/scenario.ts";
import { scenarioWorkload, simulate } from "../src/sim/fleet/simulate.ts";
import { engineConfig, tokens } from "./helpers/engine-fixtures.ts";

const FILE = resolve("scenarios/test-tiered-storage.yaml");
const RR =
  "{ apiVersion: llm-d.ai/v1alpha1, kind: EndpointPickerConfig, plugins: [ { type: round-robin-picker } ], schedulingProfiles: [ { name: default, plugins: [ { pluginRef: round-robin-picker } ] } ] }";

/** Two Llama-3.1-8B replicas (12k HBM tokens, 1 GiB = 8,192-token CPU tiers); 8 × 4,000-token documents. */
const SMALL = (fleetExtra: string) => `
name: test-tiered-storage
seed: 5
fleet:
  replicas: 2
  profile: llama-3.1-8b-h100
  kvTokens: 12000
  maxModelLen: 8192
  kvOffloadingSize: 1
  ${fleetExtra}
routers:
  - name: rr
    config: ${RR}
workload:
  workload: shared-prefix
  options: { numGroups: 8, promptsPerGroup: 1, systemPromptLen: 4000, questionLen: 8, outputLen: 1 }
  arrival:
    type: stages
    process: poisson
    barrier: true
    stages:
      - { rate: 2, duration: 4, warmup: true }
      - { rate: 6, duration: 10 }
`;

describe("shared storage in the limits", () => {
  it("prints the storage read bound: the fleet's read bandwidth ÷ KV bytes per token ÷ hit tokens", () => {
    const sc = parseScenario(SMALL("sharedStorage: { readBandwidthGBps: 20 }"), FILE);
    // 20e9 / 131,072 B/token = 152,587.89 tokens/s for the whole fleet; 4,000 hit tokens per request.
    const s = offloadLimit(sc.fleet, 4000, 4016, 10)?.storage;
    assert.ok(s !== undefined);
    assert.ok(Math.abs(s.load_tokens_per_s - 152587.890625) < 1e-6);
    assert.ok(Math.abs(s.requests_per_s - 38.14697265625) < 1e-9);
    assert.ok(Math.abs(s.output_tokens_per_s - 381.4697265625) < 1e-9);
    const none = parseScenario(SMALL(""), FILE);
    assert.equal(
      offloadLimit(none.fleet, 4000, 4016, 10)?.storage,
      undefined,
      "no storage, no storage bound",
    );
  });

  it("reaches the all-repeats regime from the tiers: CPU part, storage part, each over its link", () => {
    const sc = parseScenario(SMALL("sharedStorage: { readBandwidthGBps: 20 }"), FILE);
    const { workload } = scenarioWorkload(sc);
    const l = computeLimits(workload, sc.fleet, new PromptTokenizer());
    const g = l.regimes.repeat;
    const v = g.via_tiers;
    assert.ok(v !== undefined, "32k resident tokens over 2 × 12k HBM: reached from the tiers");
    const resident = g.resident_tokens_per_replica;
    const cpu = 2 ** 30 / 131072; // 8,192 tokens per replica
    const inStorage = resident - cpu; // storage (18,000 GiB) takes the rest
    assert.ok(Math.abs(v.storage_share - inStorage / resident) < 1e-12);
    assert.equal(v.resident_in_hbm_per_replica, 0);
    const hit = (l.offload?.hit_tokens_per_request as number) * 131072;
    const cpuReqs = (2 * 50e9) / (hit * (cpu / resident));
    const stReqs = 20e9 / (hit * (inStorage / resident));
    assert.ok(Math.abs(v.link_requests_per_s - Math.min(cpuReqs, stReqs)) < 1e-9);
    assert.equal(g.output_tokens_per_s, v.output_tokens_per_s);
    assert.ok(v.output_tokens_per_s <= v.link_output_tokens_per_s + 1e-9);
    // Without tiers the same regime cannot be reached (its resident set does not fit HBM).
    const gpu = parseScenario(SMALL("").replace("  kvOffloadingSize: 1\n", ""), FILE);
    const lg = computeLimits(workload, gpu.fleet, new PromptTokenizer());
    assert.equal(lg.regimes.repeat.via_tiers, undefined);
    assert.equal(lg.regimes.repeat.resident_fits, false);
    assert.ok(
      g.output_tokens_per_s > Math.max(...Object.values(lg.regimes).map((x) => x.output_tokens_per_s)),
    );
  });
});

describe("shared storage in a fleet run", () => {
  it("serves a replica the documents the other replica stored, where CPU tiers alone do not", async () => {
    const withStorage = (await simulate(parseScenario(SMALL("sharedStorage: {}"), FILE))).runs[0];
    const cpuOnly = (await simulate(parseScenario(SMALL(""), FILE))).runs[0];
    for (const r of [withStorage, cpuOnly]) assert.equal(r.completed, r.requests, r.router);
    const st = (withStorage.simulation as { shared_storage?: Record<string, number> }).shared_storage;
    assert.ok(st !== undefined, "the run reports its storage");
    assert.ok(st.storage_hit_tokens > 0 && st.read_chunks > 0 && st.written_chunks > 0);
    assert.ok(
      (withStorage.cached_token_rate as number) > (cpuOnly.cached_token_rate as number),
      `cached ${withStorage.cached_token_rate} vs ${cpuOnly.cached_token_rate}`,
    );
    assert.equal((cpuOnly.simulation as { shared_storage?: unknown }).shared_storage, undefined);
  });

  it("rejects sharedStorage without a CPU tier, and unknown fields in it", () => {
    const noCpu = SMALL("sharedStorage: {}").replace("  kvOffloadingSize: 1\n", "");
    assert.throws(() => parseScenario(noCpu, FILE), /kvOffloadingSize: required with sharedStorage/);
    assert.throws(
      () => parseScenario(SMALL("sharedStorage: { readGBps: 3 }"), FILE),
      /fleet\.sharedStorage\.readGBps: unknown field/,
    );
  });
});

describe("shared storage in the precise index, from the engines' own events", () => {
  it("a storage copy written by one replica counts for every replica at the storage weight", async () => {
    const keyer = new BlockKeyer({ hasher: await loadXxh64Hasher(), blockSize: 16 });
    const ix = new PreciseIndex({
      keyer,
      tierWeights: { gpu: 1.0, cpu: 0.8, shared_storage: 0.5 },
      sharedTiers: ["shared_storage"],
    });
    const cfg = engineConfig({ numGpuBlocks: 70, maxModelLen: 1024, maxNumBatchedTokens: 1024 });
    const model = cfg.modelName;
    for (const ep of ["r1", "r2", "r3"]) ix.setEndpointModel(ep, model);
    const storage = new SharedStorage();
    const bpt = kvBytesPerToken(cfg.profile.model);
    const r1 = new Engine({ ...cfg, kvOffload: { cpuBytes: 200 * 16 * bpt } }, { sharedStorage: storage });
    const prompt = tokens(512, 0);
    r1.addRequest({ id: "a", promptTokenIds: prompt, maxTokens: 1, ignoreEos: true }, 0);
    let now = 0;
    const media = new Set<string>();
    const apply = (t: number) => {
      const s = r1.step(t);
      for (const ev of s.kvEvents?.events ?? []) {
        if (ev.type !== "AllBlocksCleared") media.add(ev.medium ?? "GPU");
        ix.applyEvent("r1", ev);
      }
      return s;
    };
    while (r1.hasUnfinishedRequests()) now = Math.max(apply(now).endTime, now + 1e-6);
    apply(now + 10); // the CPU copies and the storage write have ended: their events go out
    assert.ok(media.has("SHARED_STORAGE"), `events carried ${[...media].join(", ")}`);
    assert.equal(ix.sharedEntries("shared_storage"), 32, "one pool-wide copy of a's 32 blocks");
    const keys = keyer.keys(prompt, model);
    const r = ix.longestPrefix(keys, ["r1", "r2", "r3"], 0);
    assert.deepEqual([...r.blocks], [32, 32, 32]);
    assert.ok(Math.abs(r.scores[0] - 32) < 1e-9, "r1 holds it in HBM (1.0)");
    assert.ok(Math.abs(r.scores[1] - 16) < 1e-9, "r2 reaches the storage copy (0.5)");
    assert.ok(Math.abs(r.scores[2] - 16) < 1e-9, "r3, which never sent an event, too");
  });
});
