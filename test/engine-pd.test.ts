/**
 * The engine as a P/D producer and consumer (vLLM NixlConnector semantics): held blocks and their
 * leases on the producer; deferred admission, KV-transfer completion, failure policies and prompt
 * accounting by source on the consumer; and block accounting under random mixes of both.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { KvLeases } from "../src/engine/kv-lease.ts";
import type { EngineConfig, RequestRecord, StepResult } from "../src/engine/types.ts";
import type { BlockStored } from "../src/kv/events.ts";
import { Engine, engineConfig, runToIdle, tokens } from "./helpers/engine-fixtures.ts";

const small = (over: Partial<EngineConfig> = {}) =>
  engineConfig({ numGpuBlocks: 200, maxModelLen: 2048, ...over });

function finished(results: StepResult[], id: string): RequestRecord {
  const rec = results.flatMap((s) => s.outputs).find((o) => o.requestId === id && o.record)?.record;
  assert.ok(rec, `request ${id} finished`);
  return rec;
}

/** Steps until nothing is scheduled (requests may still wait for remote KV); returns the steps. */
function stepWhileBusy(e: Engine, now: number): StepResult[] {
  const out: StepResult[] = [];
  for (let i = 0; i < 10000; i++) {
    const r = e.step(now);
    e.checkInvariants();
    out.push(r);
    if (r.numScheduledRequests === 0) return out;
    now = r.endTime;
  }
  throw new Error("engine did not settle");
}

const near = (a: number | undefined | null, b: number, what: string) =>
  assert.ok(a !== undefined && a !== null && Math.abs(a - b) < 1e-9, `${what}: ${a} ≠ ${b}`);

const usedBlocks = (e: Engine) => e.config.numGpuBlocks - 1 - e.stats().numFreeBlocks;

describe("P/D producer: remoteDecode", () => {
  it("a length-capped prefill keeps its blocks, reports them per KV group, and frees them on release", () => {
    const e = new Engine(small());
    e.addRequest(
      { id: "p", promptTokenIds: tokens(100), maxTokens: 1, ignoreEos: true, remoteDecode: true },
      0,
    );
    const rec = finished(runToIdle(e, 0, 1000, true), "p");
    assert.equal(rec.finishReason, "length");
    assert.equal(rec.remoteBlockIds?.length, 1, "one KV-cache group");
    assert.equal(rec.remoteBlockIds?.[0]?.length, 7, "ceil(100 / 16) blocks");
    assert.equal(new Set(rec.remoteBlockIds?.[0]).size, 7);
    assert.equal(rec.remoteNumTokens, 100);
    assert.deepEqual(e.heldRequestIds(), ["p"]);
    assert.deepEqual(e.heldKv("p")?.blocks, rec.remoteBlockIds?.[0]);
    assert.equal(usedBlocks(e), 7, "held blocks stay in use");
    assert.equal(e.stats().numHeldRequests, 1);
    assert.equal(e.hasUnfinishedRequests(), false, "nothing to step while blocks are only held");
    e.checkInvariants();
    assert.equal(e.releaseHeld("p", 1), true);
    assert.equal(e.releaseHeld("p", 1), false, "released once");
    assert.equal(usedBlocks(e), 0);
    assert.equal(e.stats().kvCacheUsage, 0);
    e.checkInvariants();
  });

  it("a prefill that stops on EOS frees its blocks and carries no remote block ids", () => {
    let stopped = 0;
    for (let seed = 1; seed <= 40; seed++) {
      const e = new Engine(small());
      e.addRequest(
        { id: "p", promptTokenIds: tokens(40), maxTokens: 200, ignoreEos: false, remoteDecode: true, seed },
        0,
      );
      const rec = finished(runToIdle(e, 0, 10000, true), "p");
      if (rec.finishReason !== "stop") continue;
      stopped++;
      assert.equal(rec.remoteBlockIds, undefined);
      assert.equal(rec.remoteNumTokens, undefined);
      assert.deepEqual(e.heldRequestIds(), []);
      assert.equal(usedBlocks(e), 0);
    }
    assert.ok(stopped > 0, "some seeds end on EOS before max_tokens");
  });

  it("an aborted remoteDecode request holds nothing", () => {
    const e = new Engine(small({ maxNumBatchedTokens: 256 }));
    e.addRequest(
      { id: "p", promptTokenIds: tokens(500), maxTokens: 1, ignoreEos: true, remoteDecode: true },
      0,
    );
    e.step(0);
    assert.ok(usedBlocks(e) > 0);
    assert.equal(e.abort("p", 0.01)?.finishReason, "abort");
    assert.deepEqual(e.heldRequestIds(), []);
    assert.equal(usedBlocks(e), 0);
  });

  it("a lease runs out unless heartbeats renew it; expiry frees the blocks and is counted", () => {
    const e = new Engine(small());
    e.addRequest(
      { id: "p", promptTokenIds: tokens(64), maxTokens: 1, ignoreEos: true, remoteDecode: true },
      0,
    );
    const rec = finished(runToIdle(e, 0, 1000, true), "p");
    const t = rec.finishTime ?? 0;
    near(e.leases.expiresAt("p"), t + 30, "30 s default lease from the finish");
    near(e.leases.nextExpiry(), t + 30, "next expiry");
    assert.deepEqual(e.expireLeases(t + 29.9), []);
    assert.equal(e.leases.renew("p", t + 25), true);
    near(e.leases.expiresAt("p"), t + 45, "max(old, now + 20)");
    assert.equal(e.leases.renew("p", t + 26), true);
    near(e.leases.expiresAt("p"), t + 46, "renewed again");
    assert.deepEqual(e.expireLeases(t + 45.9), []);
    assert.equal(usedBlocks(e), 4);
    assert.deepEqual(e.expireLeases(t + 46.01), ["p"]);
    assert.equal(usedBlocks(e), 0);
    assert.equal(e.stats().numKvExpiredReqs, 1);
    assert.equal(e.releaseHeld("p", t + 47), false, "a late read finds nothing");
    assert.equal(e.leases.renew("p", t + 47), false);
    e.checkInvariants();
  });
});

describe("KvLeases", () => {
  it("follows vLLM's integer arithmetic for whole seconds and scales fractions", () => {
    const l = new KvLeases();
    assert.deepEqual([l.duration, l.heartbeatInterval, l.extension], [30, 5, 20]);
    const s = new KvLeases(7);
    assert.deepEqual([s.heartbeatInterval, s.extension], [1, 4]);
    const f = new KvLeases(0.6);
    assert.ok(Math.abs(f.heartbeatInterval - 0.1) < 1e-12 && Math.abs(f.extension - 0.4) < 1e-12);
    assert.throws(() => new KvLeases(0), /kv_lease_duration/);
  });

  it("a renewal never shortens a lease", () => {
    fc.assert(
      fc.property(fc.array(fc.double({ min: 0, max: 100, noNaN: true }), { maxLength: 20 }), (times) => {
        const l = new KvLeases(30);
        l.grant("a", 0);
        let last = l.expiresAt("a") ?? 0;
        for (const t of times) {
          l.renew("a", t);
          const now = l.expiresAt("a") ?? 0;
          assert.ok(now >= last && now >= t + 20);
          last = now;
        }
      }),
    );
  });
});

describe("P/D consumer: remotePrefill", () => {
  it("allocates the prompt's blocks, waits deferred, then decodes with the transferred tokens computed", () => {
    const e = new Engine(small());
    e.addRequest(
      { id: "d", promptTokenIds: tokens(100), maxTokens: 3, ignoreEos: true, remotePrefill: true },
      0,
    );
    const first = e.step(0);
    assert.deepEqual(first.remoteKvNeeded, [{ requestId: "d", tokens: 100, blocks: 7, localHitTokens: 0 }]);
    assert.equal(first.numScheduledRequests, 0);
    assert.equal(first.kvEvents, null, "blocks are not hashed before the KV arrives");
    let st = e.stats();
    assert.deepEqual(
      [st.numRequestsRunning, st.numRequestsWaiting, st.numRequestsWaitingDeferred],
      [0, 1, 1],
    );
    assert.equal(usedBlocks(e), 7, "KV usage rises before any transfer");
    assert.equal(e.hasUnfinishedRequests(), true);
    assert.deepEqual(e.waitingForRemoteKv(), ["d"]);
    const idle = e.step(0.5);
    assert.equal(idle.numScheduledRequests, 0);
    assert.equal(idle.remoteKvNeeded, undefined, "a parked request is reported once");
    e.checkInvariants();

    assert.deepEqual(e.completeRemoteKv("d", 1, true), { outcome: "loaded", record: null });
    assert.deepEqual(e.completeRemoteKv("d", 1, true).outcome, "unknown", "completes once");
    const steps = runToIdle(e, 1, 1000, true);
    assert.equal(steps[0]?.numPrefillTokens, 1, "only the last prompt token is recomputed");
    const stored = steps[0]?.kvEvents?.events.filter((x) => x.type === "BlockStored") as BlockStored[];
    assert.equal(
      stored.reduce((n, x) => n + x.blockHashes.length, 0),
      6,
      "the transferred full blocks are cached once loaded",
    );
    const rec = finished(steps, "d");
    assert.equal(rec.outputTokenIds.length, 3);
    assert.equal(rec.cachedTokens, 99);
    assert.equal(rec.externalTokens, 99);
    st = e.stats();
    assert.deepEqual(st.promptTokensBySource, {
      local_compute: 1,
      local_cache_hit: 0,
      external_kv_transfer: 99,
    });
    assert.equal(st.promptTokens, 100);
    assert.equal(st.numRequestsWaitingDeferred, 0);
    assert.equal(usedBlocks(e), 0);
  });

  it("takes the local prefix hit first and transfers only the rest", () => {
    const e = new Engine(small());
    const shared = tokens(64);
    e.addRequest({ id: "a", promptTokenIds: shared, maxTokens: 1, ignoreEos: true }, 0);
    runToIdle(e);
    const before = e.stats().promptTokensBySource;
    e.addRequest(
      {
        id: "d",
        promptTokenIds: [...shared, ...tokens(36, 5000)],
        maxTokens: 2,
        ignoreEos: true,
        remotePrefill: true,
      },
      1,
    );
    const s = e.step(1);
    assert.deepEqual(s.remoteKvNeeded, [{ requestId: "d", tokens: 36, blocks: 3, localHitTokens: 64 }]);
    e.completeRemoteKv("d", 2, true);
    const rec = finished(runToIdle(e, 2, 1000, true), "d");
    assert.equal(rec.cachedTokens, 99);
    assert.equal(rec.externalTokens, 35);
    const after = e.stats().promptTokensBySource;
    assert.deepEqual(
      {
        local_compute: after.local_compute - before.local_compute,
        local_cache_hit: after.local_cache_hit - before.local_cache_hit,
        external_kv_transfer: after.external_kv_transfer - before.external_kv_transfer,
      },
      { local_compute: 1, local_cache_hit: 64, external_kv_transfer: 35 },
    );
  });

  it("a failed load under policy fail ends the request with finish reason error and frees its blocks", () => {
    const e = new Engine(small());
    e.addRequest(
      { id: "d", promptTokenIds: tokens(80), maxTokens: 4, ignoreEos: true, remotePrefill: true },
      0,
    );
    e.step(0);
    const out = e.completeRemoteKv("d", 1, false);
    assert.equal(out.outcome, "failed");
    assert.equal(out.record?.finishReason, "error");
    assert.equal(out.record?.finishTime, 1);
    assert.equal(usedBlocks(e), 0);
    assert.equal(e.hasUnfinishedRequests(), false);
    assert.equal(e.stats().requestSuccess.error, 1);
    assert.equal(e.stats().promptTokens, 0);
    e.checkInvariants();
  });

  it("a failed load under policy recompute prefills locally", () => {
    const e = new Engine(small({ kvLoadFailurePolicy: "recompute" }));
    e.addRequest(
      { id: "d", promptTokenIds: tokens(80), maxTokens: 4, ignoreEos: true, remotePrefill: true },
      0,
    );
    e.step(0);
    assert.equal(e.completeRemoteKv("d", 1, false).outcome, "recompute");
    const steps = runToIdle(e, 1, 1000, true);
    assert.equal(steps[0]?.numPrefillTokens, 80);
    const rec = finished(steps, "d");
    assert.equal(rec.finishReason, "length");
    assert.deepEqual(e.stats().promptTokensBySource, {
      local_compute: 80,
      local_cache_hit: 0,
      external_kv_transfer: 0,
    });
    assert.equal(usedBlocks(e), 0);
  });

  it("aborting a request that waits for remote KV frees its blocks at once", () => {
    const e = new Engine(small());
    e.addRequest(
      { id: "d", promptTokenIds: tokens(300), maxTokens: 4, ignoreEos: true, remotePrefill: true },
      0,
    );
    e.step(0);
    assert.equal(usedBlocks(e), 19);
    assert.equal(e.abort("d", 0.5)?.finishReason, "abort");
    assert.equal(usedBlocks(e), 0);
    assert.equal(e.stats().numRequestsWaiting, 0);
    assert.equal(e.completeRemoteKv("d", 1, true).outcome, "unknown");
    e.checkInvariants();
  });

  it("a request that does not fit waits at the head of the queue, as vLLM's allocation failure", () => {
    const e = new Engine(small({ numGpuBlocks: 20, maxModelLen: 300 }));
    e.addRequest(
      { id: "a", promptTokenIds: tokens(200), maxTokens: 1, ignoreEos: true, remotePrefill: true },
      0,
    );
    e.addRequest(
      { id: "b", promptTokenIds: tokens(200, 900), maxTokens: 1, ignoreEos: true, remotePrefill: true },
      0,
    );
    const s = e.step(0);
    assert.deepEqual(
      s.remoteKvNeeded?.map((x) => x.requestId),
      ["a"],
    );
    assert.deepEqual(e.waitingForRemoteKv(), ["a"]);
    assert.equal(e.stats().numRequestsWaiting, 2);
    e.completeRemoteKv("a", 1, true);
    const later = stepWhileBusy(e, 1);
    assert.ok(
      later.some((x) => x.remoteKvNeeded?.[0]?.requestId === "b"),
      "b is parked once a frees",
    );
  });
});

describe("P/D block accounting", () => {
  it("random mixes of producer and consumer requests never leak a block", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            kind: fc.constantFrom("plain", "decode", "prefill"),
            len: fc.integer({ min: 1, max: 300 }),
            shared: fc.integer({ min: 0, max: 2 }),
            maxTokens: fc.integer({ min: 1, max: 8 }),
            fate: fc.constantFrom("ok", "fail", "abort", "release", "expire"),
          }),
          { minLength: 1, maxLength: 25 },
        ),
        fc.constantFrom("fail" as const, "recompute" as const),
        (reqs, policy) => {
          const e = new Engine(
            small({ numGpuBlocks: 120, maxModelLen: 400, kvLoadFailurePolicy: policy, kvLeaseDuration: 2 }),
          );
          let now = 0;
          let finishedWithTokens = 0;
          const fates = new Map<string, string>();
          reqs.forEach((q, i) => {
            const id = `r${i}`;
            fates.set(id, q.fate);
            e.addRequest(
              {
                id,
                promptTokenIds: [
                  ...tokens(Math.ceil(q.len / 2), q.shared * 1000),
                  ...tokens(q.len >> 1, 9000 + i * 400),
                ],
                maxTokens: q.kind === "decode" ? 1 : q.maxTokens,
                ignoreEos: true,
                remoteDecode: q.kind === "decode",
                remotePrefill: q.kind === "prefill",
              },
              now,
            );
          });
          for (let guard = 0; guard < 5000 && e.hasUnfinishedRequests(); guard++) {
            const s = e.step(now);
            e.checkInvariants();
            for (const o of s.outputs) if (o.record) finishedWithTokens++;
            now = Math.max(now, s.endTime) + 0.001;
            for (const id of e.waitingForRemoteKv()) {
              const fate = fates.get(id);
              if (fate === "abort") e.abort(id, now);
              else e.completeRemoteKv(id, now, fate !== "fail");
              e.checkInvariants();
            }
            for (const id of e.heldRequestIds()) {
              if (fates.get(id) === "release") e.releaseHeld(id, now);
            }
            e.expireLeases(now);
            e.checkInvariants();
          }
          assert.equal(e.hasUnfinishedRequests(), false);
          e.expireLeases(now + 10);
          const st = e.stats();
          assert.equal(st.numFreeBlocks, 119, "every block is free once holds end");
          // local_compute is what is left of the prompt tokens after the cache and transfer hits, so
          // the three always sum; what can break is the hits over-counting. Every request that
          // produced tokens computed at least its last prompt token itself (vLLM never caches or
          // transfers all of a prompt).
          const src = st.promptTokensBySource;
          assert.ok(
            src.local_compute >= finishedWithTokens,
            `local_compute ${src.local_compute} < ${finishedWithTokens} requests that each recomputed a token`,
          );
          const done = Object.values(st.requestSuccess).reduce((a, b) => a + b, 0);
          assert.equal(done, reqs.length, "every request finishes exactly once");
        },
      ),
      { numRuns: 60, seed: 12 },
    );
  });
});
