// The approximate prefix index and its producer: matching, learning from picks, LRU eviction, pruning.
import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import type { PrefixMatchInfo } from "../src/scheduler/plugins/data.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import { ApproxPrefixIndex } from "../src/scheduler/plugins/prefix/indexer.ts";
import { ApproxPrefixProducer, approxPrefixParams } from "../src/scheduler/plugins/prefix/producer.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { chat, completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

describe("ApproxPrefixIndex", () => {
  it("walks from block 0, crediting every holder, and stops at the first unheld block", () => {
    const ix = new ApproxPrefixIndex();
    ix.add("a", [1n, 2n, 3n], 100);
    ix.add("b", [1n, 2n], 100);
    ix.add("c", [9n, 3n], 100); // holds block 3 but not the chain start
    const m = ix.match([1n, 2n, 3n, 4n]);
    assert.equal(m.depth, 3);
    assert.deepEqual(Object.fromEntries(m.counts), { a: 3, b: 2, c: 1 });
    assert.equal(ix.match([7n, 1n]).counts.size, 0);
  });

  it("evicts the least recently used blocks beyond capacity, suffix before prefix", () => {
    const ix = new ApproxPrefixIndex();
    ix.add("a", [1n, 2n, 3n], 3);
    ix.add("a", [10n, 11n], 3); // evicts 3 then 2 (block 1 was most recent of the first request)
    assert.equal(ix.blocksOf("a"), 3);
    assert.equal(ix.match([1n]).counts.get("a"), 1);
    assert.equal(ix.match([1n, 2n]).counts.get("a"), 1);
    assert.equal(ix.match([10n, 11n]).counts.get("a"), 2);
    assert.equal(ix.size, 3);
  });

  it("re-adding refreshes recency instead of duplicating", () => {
    const ix = new ApproxPrefixIndex();
    ix.add("a", [1n, 2n], 2);
    ix.add("a", [1n, 2n], 2);
    assert.equal(ix.size, 2);
    assert.equal(ix.distinctBlocks, 2);
  });

  it("prunes endpoints that left the pool and reuses their slots", () => {
    const ix = new ApproxPrefixIndex();
    ix.add("a", [1n, 2n], 10);
    ix.add("b", [1n], 10);
    ix.retain(new Set(["b"]));
    assert.equal(ix.endpointCount, 1);
    assert.deepEqual(Object.fromEntries(ix.match([1n, 2n]).counts), { b: 1 });
    assert.equal(ix.distinctBlocks, 1);
    ix.add("c", [1n, 2n], 10);
    assert.deepEqual(Object.fromEntries(ix.match([1n, 2n]).counts), { b: 1, c: 2 });
  });
});

describe("approx-prefix-cache-producer", () => {
  const producer = (params = {}) => new ApproxPrefixProducer("p", approxPrefixParams.parse(params), h);

  it("clamps the block size to 64 tokens and takes it from metrics under autoTune", () => {
    const p = producer({ blockSizeTokens: 16 });
    assert.equal(p.blockSize([endpoint("a:1")]), 64);
    assert.equal(p.blockSize([endpoint("a:1", { cacheBlockSize: 128 })]), 128);
    assert.equal(
      producer({ autoTune: false, blockSizeTokens: 256 }).blockSize([
        endpoint("a:1", { cacheBlockSize: 16 }),
      ]),
      256,
    );
  });

  it("caps blocks by maxPrefixTokensToMatch, else maxPrefixBlocksToMatch, 0/0 = unlimited", () => {
    assert.equal(producer({ maxPrefixTokensToMatch: 1000 }).maxBlocks(64), 15);
    assert.equal(producer({ maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 7 }).maxBlocks(64), 7);
    assert.equal(
      producer({ maxPrefixTokensToMatch: 0, maxPrefixBlocksToMatch: 0 }).maxBlocks(64),
      Number.POSITIVE_INFINITY,
    );
  });

  it("sizes the LRU from KV blocks under autoTune, in index blocks", () => {
    const p = producer();
    assert.equal(p.capacity(endpoint("a:1", { cacheNumBlocks: 1000, cacheBlockSize: 16 }), 64), 250);
    assert.equal(p.capacity(endpoint("a:1"), 64), 31250);
    assert.equal(
      producer({ autoTune: false, lruCapacityPerServer: 9 }).capacity(
        endpoint("a:1", { cacheNumBlocks: 5 }),
        64,
      ),
      9,
    );
  });

  it("writes match info: 256-byte blocks, match counted on the endpoint that learned them", () => {
    const p = producer();
    const eps = [endpoint("a:1"), endpoint("b:1")];
    const text = "x".repeat(256 * 3 + 10); // 4 blocks
    const c1 = cycleFor(completion("r1", text), eps);
    p.produce(c1, eps);
    const info1 = c1.get(prefixKey("p")) as PrefixMatchInfo;
    assert.equal(info1.totalBlocks, 4);
    assert.equal(info1.blockSizeTokens, 64);
    assert.equal(info1.promptTokens, 195);
    assert.equal(info1.anyMatch, false);
    p.index.add("a:1", [], 10);
    p.preRequest(c1, { target: eps[0], profiles: {} } as never);
    const c2 = cycleFor(completion("r2", `${"x".repeat(256 * 2)}different tail`), eps);
    p.produce(c2, eps);
    const info2 = c2.get(prefixKey("p")) as PrefixMatchInfo;
    assert.equal(info2.totalBlocks, 3);
    assert.equal(info2.matchBlocks("a:1"), 2);
    assert.equal(info2.matchBlocks("b:1"), 0);
    assert.equal(p.stats().hitRatio, 0);
  });

  describe("countOutputTokens: the index ages prefixes by all the engine allocates", () => {
    const eps = [endpoint("a:1"), endpoint("b:1")];
    const doc = "d".repeat(256 * 4); // 4 index blocks
    const matchOnA = (p: ApproxPrefixProducer, id: string) => {
      const c = cycleFor(completion(id, doc), eps);
      p.produce(c, eps);
      return (c.get(prefixKey("p")) as PrefixMatchInfo).matchBlocks("a:1");
    };
    /** A short question (no whole index block) picked for a:1 and answered with `out` tokens. */
    const answer = (p: ApproxPrefixProducer, id: string, out: number) => {
      const c = cycleFor(completion(id, "q?"), eps);
      p.produce(c, eps);
      p.preRequest(c, { requestId: id, target: eps[0], profiles: {} } as never);
      p.onResponseComplete(completion(id, ""), "a:1", 0, { outputTokens: out });
    };
    const pick = (p: ApproxPrefixProducer, id: string) => {
      const c = cycleFor(completion(id, doc), eps);
      p.produce(c, eps);
      p.preRequest(c, { requestId: id, target: eps[0], profiles: {} } as never);
    };
    // An LRU of 10 index blocks (640 tokens): four 200-token answers outgrow it.
    const params = { autoTune: false, lruCapacityPerServer: 10 };

    it("forgets a prefix once answers since have filled the endpoint's KV; llm-d's index keeps it", () => {
      for (const countOutputTokens of [true, false]) {
        const p = producer({ ...params, countOutputTokens });
        assert.equal(p.wantsResponseUsage, countOutputTokens);
        pick(p, "doc");
        p.onResponseComplete(completion("doc", ""), "a:1", 0, { outputTokens: 1 });
        assert.equal(matchOnA(p, "probe0"), 4);
        for (let i = 0; i < 4; i++) answer(p, `q${i}`, 200);
        assert.equal(
          matchOnA(p, "probe1"),
          countOutputTokens ? 0 : 4,
          `countOutputTokens ${countOutputTokens}`,
        );
      }
    });

    it("spreads its synthetic blocks over the index's hash table, so lookups stay short", () => {
      // 20,000 churn blocks live at once. Their hashes once were a counter: consecutive low halves
      // filled one run of slots as long as that, which every real block landing in it probed through.
      const p = producer({ autoTune: false, lruCapacityPerServer: 100_000, countOutputTokens: true });
      for (let i = 0; i < 20; i++) answer(p, `long${i}`, 64_000);
      assert.ok(p.index.blocksOf("a:1") >= 20_000, `${p.index.blocksOf("a:1")} blocks`);
      assert.ok(p.index.longestProbeRun < 200, `longest run ${p.index.longestProbeRun}`);
    });

    it("frees a request's prompt blocks young at its end, however much was allocated while it decoded", () => {
      const p = producer({ ...params, countOutputTokens: true });
      pick(p, "doc");
      for (let i = 0; i < 4; i++) answer(p, `q${i}`, 200);
      p.onResponseComplete(completion("doc", ""), "a:1", 0, { outputTokens: 1 });
      assert.equal(matchOnA(p, "probe"), 4);
      assert.equal(p.heldRequests, 0);
    });
  });

  it("separates models and cache salts", () => {
    const p = producer();
    const eps = [endpoint("a:1")];
    const c1 = cycleFor(completion("r1", "y".repeat(600)), eps);
    p.produce(c1, eps);
    p.preRequest(c1, { target: eps[0], profiles: {} } as never);
    for (const extra of [{ model: "other" }, { cacheSalt: "s" }]) {
      const c = cycleFor(completion("r", "y".repeat(600), extra), eps);
      p.produce(c, eps);
      assert.equal((c.get(prefixKey("p")) as PrefixMatchInfo).matchBlocks("a:1"), 0);
    }
  });
});

describe("prefix routing through the scheduler", () => {
  const config = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
`;
  it("sends requests sharing a prefix back to the endpoint that served it", async () => {
    const { scheduler } = await createScheduler(config, { seed: 3, hasher: h });
    const eps = ["a:1", "b:1", "c:1", "d:1"].map((id) => endpoint(id));
    const system = "You are a helpful assistant. ".repeat(60);
    const first = chat("r0", system, "first question");
    const r0 = scheduler.schedule(first, eps, 0);
    scheduler.onPicked(first, r0, 0);
    for (let i = 1; i <= 10; i++) {
      const req = chat(`r${i}`, system, `question number ${i}`);
      const r = scheduler.schedule(req, eps, i);
      assert.equal(r.target?.id, r0.target?.id);
      scheduler.onPicked(req, r, i);
    }
    const stats = scheduler.stats()["approx-prefix-cache-producer"];
    assert.equal(stats.hitRatio, (10 * 6) / (11 * 7)); // 7 blocks per request, 6 shared
    assert.equal(stats.endpoints, 1);
    scheduler.retainEndpoints(["b:1"]);
    assert.equal(scheduler.stats()["approx-prefix-cache-producer"].indexSize, 0);
  });
});
