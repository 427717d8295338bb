/** Engine model: block accounting, prefix hits, chunked prefill, preemption, step times, KV events. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { EngineInputError } from "../src/engine/engine.ts";
import { Rng } from "../src/engine/output-tokens.ts";
import { kvBytesPerToken, stepTime, weightBytesStreamed } from "../src/engine/profile.ts";
import type { BlockStored, KVEvent } from "../src/kv/events.ts";
import { hashBlockTokens, noneHash } from "../src/kv/vllm-block-hash.ts";
import { Engine, engineConfig, loadProfileFile, runToIdle, tokens } from "./helpers/engine-fixtures.ts";

function allEvents(results: { kvEvents: { events: KVEvent[] } | null }[]): KVEvent[] {
  return results.flatMap((r) => r.kvEvents?.events ?? []);
}

describe("vLLM block hash (sha256_cbor)", () => {
  it("matches vLLM's hash_block_tokens for PYTHONHASHSEED=0, block size 4, tokens 1..8", () => {
    const root = noneHash("0");
    assert.equal(
      Buffer.from(root).toString("hex"),
      "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
    );
    const b0 = hashBlockTokens(root, [1, 2, 3, 4, 5, 6, 7, 8], 0, 4, null);
    const b1 = hashBlockTokens(b0.digest, [1, 2, 3, 4, 5, 6, 7, 8], 4, 8, null);
    assert.equal(b0.value, 2164874634404590027n);
    assert.equal(b1.value, 17270480062156288726n);
  });
});

describe("prefix caching", () => {
  it("a repeated prompt hits all its full blocks, at most num_tokens − 1 tokens", () => {
    for (const len of [16, 17, 100, 160, 161]) {
      const e = new Engine(engineConfig());
      e.addRequest({ id: "a", promptTokenIds: tokens(len), maxTokens: 1, ignoreEos: true }, 0);
      const r1 = runToIdle(e);
      const first = r1.flatMap((s) => s.outputs).find((o) => o.record)?.record;
      assert.equal(first?.cachedTokens, 0);
      e.addRequest({ id: "b", promptTokenIds: tokens(len), maxTokens: 1, ignoreEos: true }, 1);
      const r2 = runToIdle(e, 1);
      const second = r2.flatMap((s) => s.outputs).find((o) => o.record)?.record;
      assert.equal(second?.cachedTokens, Math.floor((len - 1) / 16) * 16, `prompt of ${len}`);
      const st = e.stats();
      assert.equal(st.prefixCacheQueries, 2 * len);
      assert.equal(st.prefixCacheHits, Math.floor((len - 1) / 16) * 16);
    }
  });

  it("a different cache_salt hits nothing, the same salt hits", () => {
    const e = new Engine(engineConfig());
    const p = tokens(320);
    e.addRequest({ id: "a", promptTokenIds: p, maxTokens: 1, ignoreEos: true, cacheSalt: "alice" }, 0);
    runToIdle(e);
    e.addRequest({ id: "b", promptTokenIds: p, maxTokens: 1, ignoreEos: true, cacheSalt: "bob" }, 1);
    const rb = runToIdle(e, 1)
      .flatMap((s) => s.outputs)
      .find((o) => o.record)?.record;
    assert.equal(rb?.cachedTokens, 0);
    e.addRequest({ id: "c", promptTokenIds: p, maxTokens: 1, ignoreEos: true }, 2);
    const rc = runToIdle(e, 2)
      .flatMap((s) => s.outputs)
      .find((o) => o.record)?.record;
    assert.equal(rc?.cachedTokens, 0, "unsalted differs from salted");
    e.addRequest({ id: "d", promptTokenIds: p, maxTokens: 1, ignoreEos: true, cacheSalt: "alice" }, 3);
    const rd = runToIdle(e, 3)
      .flatMap((s) => s.outputs)
      .find((o) => o.record)?.record;
    assert.equal(rd?.cachedTokens, 304);
  });

  it("a shared prefix hits only the common full blocks", () => {
    const e = new Engine(engineConfig());
    const sys = tokens(100, 0);
    e.addRequest(
      { id: "a", promptTokenIds: [...sys, ...tokens(50, 5000)], maxTokens: 1, ignoreEos: true },
      0,
    );
    runToIdle(e);
    e.addRequest(
      { id: "b", promptTokenIds: [...sys, ...tokens(50, 9000)], maxTokens: 1, ignoreEos: true },
      1,
    );
    const rb = runToIdle(e, 1)
      .flatMap((s) => s.outputs)
      .find((o) => o.record)?.record;
    assert.equal(rb?.cachedTokens, 96); // 6 full blocks of the 100-token shared prefix
  });
});

describe("block accounting under randomized workloads", () => {
  it("never leaks or double-frees a block; usage within [0,1]; free + used = total", () => {
    for (let seed = 1; seed <= 12; seed++) {
      const rng = new Rng(seed * 7919);
      const numGpuBlocks = 40 + Math.floor(rng.next() * 200);
      const e = new Engine(
        engineConfig({
          numGpuBlocks,
          maxModelLen: (numGpuBlocks - 1) * 16,
          maxNumSeqs: 2 + Math.floor(rng.next() * 30),
          maxNumBatchedTokens: 64 + Math.floor(rng.next() * 1024),
          enablePrefixCaching: rng.next() < 0.85,
          seed,
        }),
      );
      const maxLen = Math.min(600, (numGpuBlocks - 2) * 16);
      let now = 0;
      let nextId = 0;
      const live = new Set<string>();
      let finished = 0;
      let added = 0;
      for (let iter = 0; iter < 400; iter++) {
        if (rng.next() < 0.35) {
          const id = `r${nextId++}`;
          const shared = Math.floor(rng.next() * 4);
          const promptLen = 1 + Math.floor(rng.next() * (maxLen / 2));
          const maxTokens = 1 + Math.floor(rng.next() * Math.min(64, maxLen - promptLen));
          e.addRequest(
            {
              id,
              promptTokenIds: [
                ...tokens(Math.floor(promptLen / 2), shared * 10000),
                ...tokens(Math.ceil(promptLen / 2), nextId * 1000 + 50000),
              ],
              maxTokens,
              ignoreEos: rng.next() < 0.7,
              cacheSalt: rng.next() < 0.1 ? "s" : undefined,
            },
            now,
          );
          live.add(id);
          added++;
        }
        if (rng.next() < 0.03 && live.size > 0) {
          const id = [...live][Math.floor(rng.next() * live.size)];
          assert.ok(e.abort(id, now));
          live.delete(id);
          finished++;
        }
        if (e.hasUnfinishedRequests()) {
          const r = e.step(now);
          for (const o of r.outputs) {
            if (!o.finishReason) continue;
            live.delete(o.requestId);
            finished++;
          }
          now = r.endTime;
        }
        e.checkInvariants();
        const st = e.stats();
        assert.ok(st.kvCacheUsage >= 0 && st.kvCacheUsage <= 1, `usage ${st.kvCacheUsage}`);
        assert.equal(Math.round(st.kvCacheUsage * (numGpuBlocks - 1)) + st.numFreeBlocks, numGpuBlocks - 1);
      }
      const rest = runToIdle(e, now, 200000, true);
      finished += rest.flatMap((s) => s.outputs).filter((o) => o.finishReason).length;
      assert.equal(finished, added, `seed ${seed}: every request finishes exactly once`);
      const st = e.stats();
      assert.equal(st.numFreeBlocks, numGpuBlocks - 1, "all blocks return to the free queue");
      assert.equal(st.kvCacheUsage, 0);
      assert.equal(st.requestSuccess.stop + st.requestSuccess.length + st.requestSuccess.abort, added);
    }
  });
});

describe("scheduling", () => {
  it("chunks a long prefill within the token budget and stamps TTFT at the step that completes it", () => {
    const e = new Engine(engineConfig({ maxNumBatchedTokens: 1024 }));
    e.addRequest({ id: "long", promptTokenIds: tokens(3000), maxTokens: 3, ignoreEos: true }, 0);
    const steps = runToIdle(e);
    assert.deepEqual(
      steps.map((s) => s.numPrefillTokens),
      [1024, 1024, 952, 0, 0],
    );
    const rec = steps[4].outputs[0].record;
    assert.ok(rec);
    assert.equal(rec.firstTokenTime, steps[2].endTime);
    assert.equal(rec.outputTokenIds.length, 3);
    assert.equal(rec.finishReason, "length");
    assert.deepEqual(rec.tokenTimes, [steps[2].endTime, steps[3].endTime, steps[4].endTime]);
  });

  it("respects max_num_seqs and the budget across running and waiting requests", () => {
    const e = new Engine(engineConfig({ maxNumSeqs: 3, maxNumBatchedTokens: 100 }));
    for (let i = 0; i < 5; i++)
      e.addRequest({ id: `r${i}`, promptTokenIds: tokens(60, i * 1000), maxTokens: 2, ignoreEos: true }, 0);
    const s1 = e.step(0);
    // r0 takes 60, r1 the remaining 40 (chunked); r2 gets no budget.
    assert.equal(s1.numScheduledRequests, 2);
    assert.equal(s1.numPrefillTokens, 100);
    assert.equal(e.stats().numRequestsRunning, 2);
    const s2 = e.step(s1.endTime);
    // r0 decodes its last token (1), r1 finishes its prefill (20), r2 is admitted with its 60 (3 running
    // at admission time, the max_num_seqs bound); r3 and r4 wait. r0 then finishes.
    assert.equal(s2.numPrefillTokens, 80);
    assert.equal(s2.numDecodeTokens, 1);
    assert.deepEqual(
      s2.outputs.map((o) => [o.requestId, o.finishReason]),
      [
        ["r0", "length"],
        ["r1", null],
        ["r2", null],
      ],
    );
    assert.equal(e.stats().numRequestsRunning, 2);
    assert.equal(e.stats().numRequestsWaiting, 2);
  });

  it("preempts the newest running request under KV pressure and recovers", () => {
    // 41 blocks (40 usable); four 160-token prompts need 40 blocks, decode then needs more.
    const e = new Engine(engineConfig({ numGpuBlocks: 41, maxModelLen: 640, maxNumBatchedTokens: 4096 }));
    for (let i = 0; i < 4; i++)
      e.addRequest({ id: `r${i}`, promptTokenIds: tokens(160, i * 1000), maxTokens: 48, ignoreEos: true }, 0);
    const steps = runToIdle(e, 0, 100000, true);
    const records = steps.flatMap((s) => s.outputs).flatMap((o) => (o.record ? [o.record] : []));
    assert.equal(records.length, 4);
    for (const r of records) assert.equal(r.outputTokenIds.length, 48);
    const st = e.stats();
    assert.ok(st.numPreemptions > 0, "KV pressure causes preemption");
    assert.equal(
      st.numPreemptions,
      records.reduce((a, r) => a + r.numPreemptions, 0),
    );
    const firstPreemptStep = steps.findIndex((s) => s.numPreemptedThisStep > 0);
    assert.ok(firstPreemptStep >= 0);
    assert.ok(records.find((r) => r.id === "r3")?.numPreemptions, "the newest request is the first victim");
    assert.equal(records.find((r) => r.id === "r0")?.numPreemptions, 0, "the oldest is never preempted here");
  });

  it("rejects prompts over max_model_len and empty prompts", () => {
    const e = new Engine(engineConfig({ maxModelLen: 100 }));
    assert.throws(
      () => e.addRequest({ id: "x", promptTokenIds: tokens(90), maxTokens: 20, ignoreEos: true }, 0),
      EngineInputError,
    );
    assert.throws(
      () => e.addRequest({ id: "y", promptTokenIds: [], maxTokens: 1, ignoreEos: true }, 0),
      EngineInputError,
    );
    assert.throws(
      () => e.addRequest({ id: "z", promptTokenIds: [1], maxTokens: 0, ignoreEos: true }, 0),
      EngineInputError,
    );
    assert.equal(e.hasUnfinishedRequests(), false);
  });

  it("gives the same outputs for the same seed and exact lengths with ignore_eos", () => {
    const run = (seed: number) => {
      const e = new Engine(engineConfig({ seed }));
      e.addRequest({ id: "q", promptTokenIds: tokens(50), maxTokens: 30, ignoreEos: false }, 0);
      e.addRequest({ id: "p", promptTokenIds: tokens(50), maxTokens: 30, ignoreEos: true }, 0);
      return runToIdle(e)
        .flatMap((s) => s.outputs)
        .flatMap((o) => (o.record ? [o.record] : []));
    };
    const a = run(5);
    const b = run(5);
    assert.deepEqual(
      a.map((r) => r.outputTokenIds),
      b.map((r) => r.outputTokenIds),
    );
    assert.equal(a.find((r) => r.id === "p")?.outputTokenIds.length, 30);
    const q = a.find((r) => r.id === "q");
    assert.ok(q && q.outputTokenIds.length <= 30);
    assert.equal(q.finishReason, q.outputTokenIds.length < 30 ? "stop" : "length");
  });

  it("abort frees the request's blocks at once", () => {
    const e = new Engine(engineConfig());
    e.addRequest({ id: "a", promptTokenIds: tokens(500), maxTokens: 100, ignoreEos: true }, 0);
    e.step(0);
    assert.ok(e.stats().kvCacheUsage > 0);
    const rec = e.abort("a", 0.1);
    assert.equal(rec?.finishReason, "abort");
    assert.equal(e.stats().kvCacheUsage, 0);
    assert.equal(e.stats().numRequestsRunning, 0);
    assert.equal(e.abort("a", 0.2), null);
    e.checkInvariants();
  });
});

describe("step time", () => {
  const p = loadProfileFile("llama-3.1-8b-h100");
  it("matches hand-computed decode and prefill times for Llama-3.1-8B on H100", () => {
    // Hand computation (bytes and FLOPs from the profile's constants):
    // weights: (6.98e9 + 128256·4096)·2 bytes / (0.85 · 3.35e12) = 15.0107e9 / 2.8475e12
    const weights = ((6.98e9 + 128256 * 4096) * 2) / (0.85 * 3.35e12);
    assert.ok(Math.abs(weights - 0.0052715) < 1e-6);
    assert.equal(kvBytesPerToken(p.model), 131072);
    assert.equal(weightBytesStreamed(p.model), (6.98e9 + 128256 * 4096) * 2);
    // One decode at 1024 context: 0.6 ms + 4.42 µs + weights + 1024·131072/(0.6·3.35e12)
    const t1 = stepTime(p, { prefills: [], decodeContexts: [1024] });
    const expected1 = 0.0006 + 4.42e-6 + weights + (1024 * 131072) / (0.6 * 3.35e12);
    assert.ok(Math.abs(t1.total - expected1) < 1e-12);
    assert.ok(
      Math.abs(t1.total - 0.00594) < 0.0001,
      `B=1 decode ≈ 5.9 ms (profiles/llama-3.1-8b-h100.yaml), got ${t1.total}`,
    );
    // 64 decodes at 4096 context ≈ 23 ms, as profiles/llama-3.1-8b-h100.yaml says.
    const t64 = stepTime(p, { prefills: [], decodeContexts: new Array(64).fill(4096) });
    assert.ok(Math.abs(t64.total - 0.0232) < 0.0005, `B=64/4k ≈ 23 ms, got ${t64.total}`);
    // A fresh 2048-token prefill: GEMMs 2·6.98e9·2048/(0.62·989.5e12) + attention 4·32·32·128·2048·1024/(0.45·989.5e12)
    const tp = stepTime(p, { prefills: [{ tokens: 2048, context: 0 }], decodeContexts: [] });
    const gemm = (2 * 6.98e9 * 2048) / (0.62 * 989.5e12);
    const attn = (4 * 32 * 32 * 128 * 2048 * 1024) / (0.45 * 989.5e12);
    assert.ok(Math.abs(tp.prefillGemm - gemm) < 1e-12);
    assert.ok(Math.abs(tp.prefillAttention - attn) < 1e-12);
    assert.ok(Math.abs(tp.total - (0.0006 + 4.42e-6 + weights + gemm + attn)) < 1e-12);
    const tokPerS = 2048 / tp.total;
    assert.ok(tokPerS > 30000 && tokPerS < 45000, `prefill ≈ 36–42k tok/s, got ${tokPerS}`);
    // Attention cost grows with context: the same chunk after 6000 cached tokens costs more.
    const later = stepTime(p, { prefills: [{ tokens: 2048, context: 6000 }], decodeContexts: [] });
    assert.ok(later.prefillAttention > tp.prefillAttention * 3);
    assert.equal(stepTime(p, { prefills: [], decodeContexts: [] }).total, 0);
  });

  it("the engine's step durations follow the model", () => {
    const e = new Engine(engineConfig({ profile: p, maxNumBatchedTokens: 8192 }));
    e.addRequest({ id: "a", promptTokenIds: tokens(2048), maxTokens: 2, ignoreEos: true }, 0);
    const s = e.step(10);
    assert.equal(s.startTime, 10);
    const expected = stepTime(p, { prefills: [{ tokens: 2048, context: 0 }], decodeContexts: [] }).total;
    assert.ok(Math.abs(s.endTime - 10 - expected) < 1e-9);
    const d = e.step(s.endTime);
    const expectedDecode = stepTime(p, { prefills: [], decodeContexts: [2049] }).total;
    assert.ok(Math.abs(d.endTime - s.endTime - expectedDecode) < 1e-9);
  });
});

describe("KV events", () => {
  it("stores prompt blocks with a parent chain, removes on eviction, clears on reset", () => {
    const e = new Engine(engineConfig({ numGpuBlocks: 11, maxModelLen: 160, maxNumBatchedTokens: 4096 }));
    const p = tokens(64);
    e.addRequest({ id: "a", promptTokenIds: p, maxTokens: 1, ignoreEos: true }, 0);
    const ev = allEvents(runToIdle(e));
    const stored = ev.filter((x): x is BlockStored => x.type === "BlockStored");
    assert.equal(stored.length, 1, "one run of new full blocks → one BlockStored");
    const s = stored[0];
    assert.equal(s.blockHashes.length, 4);
    assert.equal(s.parentBlockHash, null);
    assert.deepEqual(s.tokenIds, p);
    assert.equal(s.blockSize, 16);
    assert.equal(s.medium, "GPU");
    // Hashes equal an independent computation of vLLM's chain.
    let parent = noneHash("0");
    for (let i = 0; i < 4; i++) {
      const h = hashBlockTokens(parent, p, i * 16, (i + 1) * 16, null);
      assert.equal(s.blockHashes[i], h.value);
      parent = h.digest;
    }
    // A prompt that needs every block evicts all four cached ones (LRU from the free-queue head).
    e.addRequest({ id: "b", promptTokenIds: tokens(150, 7000), maxTokens: 1, ignoreEos: true }, 1);
    const ev2 = allEvents(runToIdle(e, 1));
    const removed = ev2
      .filter((x) => x.type === "BlockRemoved")
      .flatMap((x) => (x.type === "BlockRemoved" ? x.blockHashes : []));
    assert.deepEqual(new Set(removed), new Set(s.blockHashes));
    // Reset clears everything once nothing is running.
    assert.equal(e.resetPrefixCache(2), true);
    e.addRequest({ id: "c", promptTokenIds: tokens(20), maxTokens: 1, ignoreEos: true }, 3);
    const ev3 = allEvents(runToIdle(e, 3));
    assert.equal(ev3[0].type, "AllBlocksCleared");
  });

  it("announces decode blocks as generated tokens fill them, chained on the prompt", () => {
    const e = new Engine(engineConfig());
    e.addRequest({ id: "a", promptTokenIds: tokens(20), maxTokens: 40, ignoreEos: true }, 0);
    const ev = allEvents(runToIdle(e)).filter((x): x is BlockStored => x.type === "BlockStored");
    // 20 + 40 = 60 tokens; the last token is never computed, so 59 computed → 3 full blocks.
    const hashes = ev.flatMap((x) => x.blockHashes);
    assert.equal(hashes.length, 3);
    for (let i = 1; i < ev.length; i++) assert.equal(ev[i].parentBlockHash, ev[i - 1].blockHashes.at(-1));
  });
});
