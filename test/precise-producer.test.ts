/** precise-prefix-cache-producer in the scheduler: config, the prefix-match-info datum it writes from a
 * KV-event-fed index (tier-weighted), what prefix-cache-scorer makes of it, requests without token ids,
 * speculative indexing and pool pruning. */
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  type PreciseMatchInfo,
  PrecisePrefixProducer,
} from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";
import { storeBlocks } from "./helpers/precise-store.ts";

const HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
const CONFIG = `${HEAD}plugins:
- type: precise-prefix-cache-producer
  name: precise
  parameters:
    speculativeIndexing: true
    speculativeTTL: 2s
    kvEventsConfig: { podDiscoveryConfig: { socketPort: 5556, replaySocketPort: 5557 } }
- type: prefix-cache-scorer
`;
const TOKENS = Array.from({ length: 16 * 10 + 5 }, (_, i) => 1000 + i); // 10 full blocks
const eps = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")];

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

async function scheduler(config = CONFIG) {
  const { scheduler } = await createScheduler(config, { seed: 1, hasher: h });
  const p = scheduler.plugins.get("precise");
  assert.ok(p instanceof PrecisePrefixProducer);
  return { scheduler, producer: p };
}

/** The engine stores blocks [0, n) of TOKENS on an endpoint. */
const store = (p: PrecisePrefixProducer, id: string, n: number, medium = "GPU") =>
  storeBlocks(p, id, TOKENS, n, medium);

describe("precise-prefix-cache-producer", () => {
  it("loads with llm-d's parameter names and rejects what kvgate does not do", async () => {
    const { producer } = await scheduler();
    assert.equal(producer.blockSizeTokens, 16);
    assert.deepEqual(producer.kvEvents, { topicFilter: "kv@", socketPort: 5556, replaySocketPort: 5557 });
    const bad = async (params: string, re: RegExp) =>
      assert.rejects(
        createScheduler(`${HEAD}plugins:\n- type: precise-prefix-cache-producer\n  parameters: ${params}\n`, {
          hasher: h,
        }),
        re,
      );
    await bad("{ speculativeTTL: soon }", /duration/);
    await bad("{ tokenizersPoolConfig: {} }", /not supported/);
    await bad("{ indexerConfig: { kvCacheBackendConfigs: [{ name: cpu, weight: 0.8 }] } }", /no "gpu" entry/);
    await bad("{ kvCacheBackendConfigs: [] }", /kvCacheBackendConfigs/);
    await bad("{ surprise: 1 }", /unknown parameter/);
    const { producer: p2 } = await scheduler(
      `${HEAD}plugins:\n- type: precise-prefix-cache-producer\n  name: precise\n  parameters: { blockSizeTokens: 32, tokenProcessorConfig: { blockSizeTokens: 64, hashSeed: "42" } }\n`,
    );
    assert.equal(p2.blockSizeTokens, 64);
  });

  it("writes tier-weighted longest-prefix matches that prefix-cache-scorer turns into the pick", async () => {
    const { scheduler: s, producer } = await scheduler();
    store(producer, "a:1", 4);
    store(producer, "b:1", 8, "CPU");
    const req = completion("r1", "ignored: token ids win", { tokenIds: TOKENS });
    const r = s.schedule(req, eps, 10, { explain: true });
    const info = r.cycle.get(prefixKey("precise")) as PreciseMatchInfo;
    assert.equal(info.totalBlocks, 10);
    assert.equal(info.blockSizeTokens, 16);
    assert.equal(info.promptTokens, TOKENS.length);
    assert.equal(info.matchBlocks("a:1"), 4);
    assert.ok(Math.abs(info.matchBlocks("b:1") - 6.4) < 1e-9, "8 CPU blocks weigh 0.8 each");
    assert.equal(info.heldBlocks("b:1"), 8);
    assert.equal(info.matchBlocks("c:1"), 0);
    assert.deepEqual([...info.matches().keys()].sort(), ["a:1", "b:1"]);
    assert.equal(r.target?.id, "b:1", "score 0.64 beats 0.4");
    const raw = (id: string) =>
      r.explanation?.profiles.default.candidates
        .find((c) => c.id === id)
        ?.scores.find((x) => x.type === "prefix-cache-scorer")?.raw;
    assert.equal(raw("a:1"), 0.4);
    assert.ok(Math.abs((raw("b:1") ?? 0) - 0.64) < 1e-9);
    assert.equal(raw("c:1"), 0);
  });

  it("writes nothing without token ids, so prefix-cache-scorer scores 0", async () => {
    const { scheduler: s, producer } = await scheduler();
    store(producer, "a:1", 4);
    const r = s.schedule(completion("r2", "text only"), eps, 10);
    assert.equal(r.cycle.get(prefixKey("precise")), undefined);
    assert.equal(s.stats().precise?.requestsWithoutTokens, 1);
  });

  it("speculative indexing: the pick holds the prefix until the TTL, so a burst lands together", async () => {
    const { scheduler: s } = await scheduler();
    const req = (id: string) => completion(id, "", { tokenIds: TOKENS });
    const first = s.schedule(req("s1"), eps, 100);
    const picked = first.target!.id;
    s.onPicked(req("s1"), first, 100);
    const second = s.schedule(req("s2"), eps, 101);
    assert.equal(second.target?.id, picked);
    assert.equal((second.cycle.get(prefixKey("precise")) as PreciseMatchInfo).matchBlocks(picked), 10);
    const later = s.schedule(req("s3"), eps, 102.5);
    assert.equal((later.cycle.get(prefixKey("precise")) as PreciseMatchInfo).anyMatch, false);
  });

  it('speculativeScope "cold": only a request no endpoint holds any of is speculated', async () => {
    const cold = CONFIG.replace("speculativeTTL: 2s", "speculativeTTL: 2s\n    speculativeScope: cold");
    const { scheduler: s, producer } = await scheduler(cold);
    // Blocks 0–3 are on a:1: a request for all 10 has a home there, so its pick adds nothing (with
    // scope "all" a:1 would be credited blocks 4–9 before its engine computed them).
    store(producer, "a:1", 4);
    const warm = completion("w", "", { tokenIds: TOKENS });
    const w = s.schedule(warm, eps, 100);
    assert.equal(w.target?.id, "a:1");
    s.onPicked(warm, w, 100);
    const after = s.schedule(completion("w2", "", { tokenIds: TOKENS }), eps, 100.5);
    assert.equal((after.cycle.get(prefixKey("precise")) as PreciseMatchInfo).matchBlocks("a:1"), 4);
    // A prompt no endpoint holds: its pick is speculated, and the next request of it follows.
    const other = Array.from({ length: 16 * 6 }, (_, i) => 5000 + i);
    const first = s.schedule(completion("c1", "", { tokenIds: other }), eps, 101);
    s.onPicked(completion("c1", "", { tokenIds: other }), first, 101);
    const second = s.schedule(completion("c2", "", { tokenIds: other }), eps, 101.5);
    assert.equal(
      (second.cycle.get(prefixKey("precise")) as PreciseMatchInfo).matchBlocks(first.target!.id),
      6,
    );
    assert.equal(second.target?.id, first.target?.id);
  });

  it("drops endpoints that left the pool from the index", async () => {
    const { scheduler: s, producer } = await scheduler();
    store(producer, "a:1", 4);
    store(producer, "b:1", 4);
    s.retainEndpoints(["b:1"]);
    assert.equal(producer.index.endpointEntries("a:1"), 0);
    assert.equal(producer.index.endpointEntries("b:1"), 4);
    const info = new Map<string, number>();
    const cycle = cycleFor(completion("r", "", { tokenIds: TOKENS }), eps, 0);
    producer.produce(cycle, eps);
    for (const e of eps)
      info.set(e.id, (cycle.get(prefixKey("precise")) as PreciseMatchInfo).matchBlocks(e.id));
    assert.deepEqual(Object.fromEntries(info), { "a:1": 0, "b:1": 4, "c:1": 0 });
  });
});
