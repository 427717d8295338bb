/**
 * The engine's CPU offload tier (vLLM native OffloadingConnector semantics): a prompt evicted from
 * HBM hits from CPU after the modelled host→device copy; CPU KV events in the placeholder and
 * self-describing forms survive the wire; block and transfer accounting under random workloads.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import type { OffloadLoad } from "../src/engine/cpu-tier.ts";
import { DEFAULT_HOST_LINK_BYTES_PER_SECOND } from "../src/engine/cpu-tier.ts";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import type { EngineConfig, RequestRecord, StepResult } from "../src/engine/types.ts";
import { decodeEventBatch } from "../src/kv/event-codec.ts";
import { encodeEventBatch } from "../src/kv/event-encode.ts";
import type { BlockStored, KVEvent } from "../src/kv/events.ts";
import { Engine, engineConfig, tokens } from "./helpers/engine-fixtures.ts";

const GiB = 2 ** 30;

/** 69 usable GPU blocks: one 1024-token request fits, two 512-token prompts do not. */
const tight = (over: Partial<EngineConfig> = {}) =>
  engineConfig({ numGpuBlocks: 70, maxModelLen: 1024, maxNumBatchedTokens: 1024, ...over });

interface Run {
  steps: StepResult[];
  loads: OffloadLoad[];
  records: Map<string, RequestRecord>;
  /** The step time at which each load was started. */
  foundAt: Map<OffloadLoad, number>;
  now: number;
}

/**
 * Steps `e` until idle, completing each CPU-tier load at its readyAt (the caller's job), jumping
 * the clock when only loads are pending. Checks invariants after every step.
 */
function drive(e: Engine, start: number, onStep?: (s: StepResult, now: number) => void): Run {
  const run: Run = { steps: [], loads: [], records: new Map(), foundAt: new Map(), now: start };
  const pending: OffloadLoad[] = [];
  let now = start;
  const busy = () => e.hasUnfinishedRequests() || pending.length > 0 || e.nextOffloadFree() !== null;
  for (let i = 0; i < 100000 && busy(); i++) {
    pending.sort((a, b) => a.readyAt - b.readyAt);
    while (pending.length > 0 && pending[0].readyAt <= now) {
      const l = pending.shift() as OffloadLoad;
      assert.equal(e.completeRemoteKv(l.requestId, now, true).outcome, "loaded");
    }
    const s = e.step(now);
    e.checkInvariants();
    run.steps.push(s);
    onStep?.(s, now);
    for (const l of s.offloadLoads ?? []) {
      assert.ok(l.startTime >= now, "a load starts no earlier than the step that found it");
      pending.push(l);
      run.loads.push(l);
      run.foundAt.set(l, now);
    }
    for (const o of s.outputs) if (o.record) run.records.set(o.requestId, o.record);
    if (s.numScheduledRequests > 0) now = s.endTime;
    else {
      // Nothing ran: the next load's end or the next store's end (which frees blocks) moves it on.
      const wake = [...pending.map((l) => l.readyAt), e.nextOffloadFree() ?? Number.POSITIVE_INFINITY];
      const next = Math.min(...wake);
      if (next === Number.POSITIVE_INFINITY) {
        if (e.hasUnfinishedRequests()) throw new Error(`stalled at ${now}`);
      } else now = Math.max(now, next);
    }
  }
  run.now = now;
  return run;
}

const req = (id: string, n: number, base: number, maxTokens = 1) => ({
  id,
  promptTokenIds: tokens(n, base),
  maxTokens,
  ignoreEos: true,
});

/** A, then B (which evicts most of A from HBM), then A again: returns A-again's record and its load. */
function evictAndReturn(over: Partial<EngineConfig>) {
  const e = new Engine(tight(over));
  e.addRequest(req("a", 512, 0), 0);
  let t = drive(e, 0).now;
  e.addRequest(req("b", 960, 10000), t);
  t = drive(e, t).now;
  e.addRequest(req("a2", 512, 0), t);
  const run = drive(e, t);
  return { e, rec: run.records.get("a2") as RequestRecord, loads: run.loads, start: t };
}

describe("CPU offload tier: hits", () => {
  it("a prompt evicted from HBM but in CPU hits from CPU, loaded at the host link's bandwidth", () => {
    const without = evictAndReturn({});
    const gpuHit = without.rec.cachedTokens;
    assert.ok(gpuHit < 512 - 16, `B evicted most of A from HBM (GPU hit ${gpuHit})`);
    assert.equal(without.loads.length, 0);

    const { e, rec, loads, start } = evictAndReturn({ kvOffload: { cpuBytes: 4 * GiB } });
    assert.equal(loads.length, 1, "one load, for a2");
    const [l] = loads;
    assert.equal(l.requestId, "a2");
    assert.equal(l.tokens, 512 - gpuHit, "the CPU hit continues past the GPU hit to the prompt's end");
    const bytes = l.tokens * kvBytesPerToken(e.config.profile.model);
    assert.equal(l.bytes, bytes);
    assert.ok(Math.abs(l.readyAt - l.startTime - bytes / DEFAULT_HOST_LINK_BYTES_PER_SECOND) < 1e-12);
    assert.ok(l.startTime >= start);
    assert.ok((rec.firstTokenTime as number) > l.readyAt, "the first token waits for the load");
    assert.equal(rec.cachedTokens, 511, "cached_tokens counts both tiers (the last token is recomputed)");
    const s = e.stats();
    assert.equal(s.offload?.externalHits, 512 - gpuHit);
    assert.equal(s.offload?.externalQueries, 512 + 960 + 512, "every first admission queries the connector");
    assert.equal(s.offload?.loadBytes, bytes);
    assert.equal(s.promptTokensBySource.external_kv_transfer, 511 - gpuHit);
    assert.equal(s.promptTokensBySource.local_compute, 512 + 960 + 1, "a2 computes one token");
  });

  it("a load cannot be completed before its copy ends", () => {
    const e = new Engine(tight({ kvOffload: { cpuBytes: 4 * GiB, loadBandwidth: 1e6 } }));
    e.addRequest(req("a", 512, 0), 0);
    let t = drive(e, 0).now;
    e.addRequest(req("b", 960, 10000), t);
    t = drive(e, t).now;
    e.addRequest(req("a2", 512, 0), t);
    const s = e.step(t);
    const l = s.offloadLoads?.[0];
    assert.ok(l && l.readyAt - t > 1, "1 MB/s makes the copy take seconds");
    assert.throws(() => e.completeRemoteKv("a2", t, true), /CPU-tier load ends at/);
    assert.equal(e.completeRemoteKv("a2", l.readyAt, true).outcome, "loaded");
  });

  it("a store is not hittable before its copy ends, and its request's GPU blocks wait for it", () => {
    const e = new Engine(tight({ kvOffload: { cpuBytes: 4 * GiB, storeBandwidth: 1e6 } }));
    e.addRequest(req("a", 512, 0), 0);
    const s = e.step(0);
    assert.equal(s.outputs[0]?.finishReason, "length", "one step: the prefill and its one token");
    const t = s.endTime;
    const bytes = 512 * kvBytesPerToken(e.config.profile.model);
    assert.equal(e.cpuTier?.size, 32);
    assert.equal(e.cpuTier?.readyKeys(t).length, 0, "32 chunks at 1 MB/s take minutes to copy");
    assert.equal(e.stats().offload?.storeBytes, bytes);
    const freeAt = e.nextOffloadFree();
    assert.ok(freeAt !== null && Math.abs(freeAt - (t + bytes / 1e6)) < 1e-6);
    assert.equal(e.stats().numFreeBlocks, 69 - 32, "a's 32 blocks stay in use while they copy");
    const before = e.step(freeAt - 1).kvEvents?.events ?? [];
    assert.equal(before.filter((ev) => ev.type === "BlockStored" && ev.medium === "CPU").length, 0);
    const after = e.step(freeAt).kvEvents?.events ?? [];
    assert.equal(after.filter((ev) => ev.type === "BlockStored" && ev.medium === "CPU").length, 1);
    assert.equal(e.stats().numFreeBlocks, 69);
    assert.equal(e.nextOffloadFree(), null);
    e.checkInvariants();
  });
});

/** Runs A with offload events on and returns the CPU events, encoded and decoded in `format`. */
function cpuEvents(over: Partial<EngineConfig>, format: "array" | "map" = "array") {
  const e = new Engine(tight(over));
  e.addRequest(req("a", 200, 0), 0);
  const batches: KVEvent[] = [];
  const gpu: bigint[] = [];
  const t = drive(e, 0, (s) => {
    if (s.kvEvents === null) return;
    const back = decodeEventBatch(encodeEventBatch(s.kvEvents, format));
    for (const ev of back.events) batches.push(ev as KVEvent);
  }).now;
  // A late step publishes the stores that ended meanwhile.
  const last = e.step(t + 10).kvEvents;
  if (last !== null)
    for (const ev of decodeEventBatch(encodeEventBatch(last, format)).events) batches.push(ev as KVEvent);
  for (const ev of batches) if (ev.type === "BlockStored" && ev.medium === "GPU") gpu.push(...ev.blockHashes);
  const cpu = batches.filter((ev): ev is BlockStored => ev.type === "BlockStored" && ev.medium === "CPU");
  return { cpu, gpu };
}

describe("CPU offload tier: KV events", () => {
  it("placeholder form (vLLM's default): one hash per chunk, the chunk's last GPU block hash, no tokens", () => {
    const { cpu, gpu } = cpuEvents({ kvOffload: { cpuBytes: GiB, chunkTokens: 64 } });
    assert.equal(gpu.length, 12, "200 tokens: 12 full GPU blocks");
    const hashes = cpu.flatMap((ev) => ev.blockHashes);
    assert.deepEqual(hashes, [gpu[3], gpu[7], gpu[11]], "three 64-token chunks");
    for (const ev of cpu) {
      assert.deepEqual(ev.tokenIds, []);
      assert.equal(ev.parentBlockHash, null);
      assert.equal(ev.blockSize, 0);
    }
  });

  it("self-describing form: per-block hashes, parent, tokens and the GPU block size", () => {
    const { cpu, gpu } = cpuEvents(
      {
        kvOffload: { cpuBytes: GiB, chunkTokens: 64, selfDescribingEvents: true },
      },
      "map",
    );
    assert.equal(cpu.length, 3, "one event per chunk");
    assert.deepEqual(
      cpu.flatMap((ev) => ev.blockHashes),
      gpu,
    );
    assert.equal(cpu[0].parentBlockHash, null);
    assert.equal(cpu[1].parentBlockHash, gpu[3]);
    assert.deepEqual(cpu[1].tokenIds, tokens(200).slice(64, 128));
    for (const ev of cpu) assert.equal(ev.blockSize, 16);
    assert.equal(cpu[2].kvCacheSpecKind, "full_attention");
  });
});

describe("CPU offload tier: accounting under random workloads", () => {
  it("blocks, capacity, pins, events and transfer times stay consistent", () => {
    const workload = fc.record({
      chunkFactor: fc.constantFrom(1, 2, 4),
      cpuChunks: fc.integer({ min: 4, max: 80 }),
      selfDescribing: fc.boolean(),
      reqs: fc.array(
        fc.record({
          base: fc.constantFrom(0, 5000, 9000),
          len: fc.integer({ min: 1, max: 400 }),
          maxTokens: fc.integer({ min: 1, max: 40 }),
          gap: fc.double({ min: 0, max: 0.05, noNaN: true }),
        }),
        { minLength: 1, maxLength: 12 },
      ),
    });
    fc.assert(
      fc.property(workload, (w) => {
        const base = tight({ maxModelLen: 512, numGpuBlocks: 60 });
        const chunkTokens = 16 * w.chunkFactor;
        const bpt = kvBytesPerToken(base.profile.model);
        const e = new Engine(
          {
            ...base,
            kvOffload: {
              cpuBytes: w.cpuChunks * chunkTokens * bpt,
              chunkTokens,
              selfDescribingEvents: w.selfDescribing,
            },
          },
          { keepOffloadTransfers: true },
        );
        const tier = e.cpuTier;
        assert.ok(tier);
        assert.equal(tier.capacity, w.cpuChunks);
        let t = 0;
        const live = new Map<bigint, number>();
        const allLoads: OffloadLoad[] = [];
        let storeBytes = 0;
        let storeSeconds = 0;
        w.reqs.forEach((r, i) => {
          e.addRequest(req(`r${i}`, r.len, r.base, r.maxTokens), t);
          t += r.gap;
        });
        const run = drive(e, 0, (s) => {
          for (const ev of s.kvEvents?.events ?? []) {
            if (ev.type === "AllBlocksCleared" || ev.medium !== "CPU") continue;
            for (const h of ev.blockHashes) {
              const n = (live.get(h) ?? 0) + (ev.type === "BlockStored" ? 1 : -1);
              assert.ok(n >= 0, "a CPU removal follows its store");
              if (n === 0) live.delete(h);
              else live.set(h, n);
            }
          }
          for (const x of tier.takeTransfers()) {
            if (x.kind !== "store") continue;
            storeBytes += x.bytes;
            storeSeconds += x.seconds;
          }
          tier.checkInvariants();
        });
        allLoads.push(...run.loads);
        const s = e.stats();
        assert.equal(run.records.size, w.reqs.length, "every request finishes");
        assert.ok((s.offload?.numChunks ?? 0) <= w.cpuChunks);
        // Every load: bytes at the link's bandwidth, and the link carries one copy at a time.
        const bw = DEFAULT_HOST_LINK_BYTES_PER_SECOND;
        let loadBytes = 0;
        const sorted = allLoads.slice().sort((a, b) => a.startTime - b.startTime);
        for (let k = 0; k < sorted.length; k++) {
          const l = sorted[k];
          loadBytes += l.bytes;
          assert.ok(Math.abs(l.readyAt - l.startTime - l.bytes / bw) < 1e-12);
          if (k > 0) assert.ok(l.startTime >= sorted[k - 1].readyAt - 1e-12, "loads never overlap");
          const rec = run.records.get(l.requestId);
          assert.ok(rec, `${l.requestId} finished`);
          assert.ok(
            rec.tokenTimes.some((x) => x > l.readyAt),
            "it decodes after its load",
          );
          const found = run.foundAt.get(l) as number;
          assert.ok(!rec.tokenTimes.some((x) => x > found && x <= l.readyAt), "no token while it loads");
        }
        assert.equal(s.offload?.loadBytes, loadBytes);
        assert.equal(s.offload?.storeBytes, storeBytes);
        assert.ok(Math.abs((s.offload?.storeTime ?? 0) - storeSeconds) < 1e-9);
        assert.ok(Math.abs(storeSeconds - storeBytes / bw) < 1e-9);
        // After a late step every store has ended: the events describe exactly what the tier holds.
        const late = run.now + 1e6;
        for (const ev of e.step(late).kvEvents?.events ?? []) {
          if (ev.type === "AllBlocksCleared" || ev.medium !== "CPU") continue;
          for (const h of ev.blockHashes)
            live.set(h, (live.get(h) ?? 0) + (ev.type === "BlockStored" ? 1 : -1));
        }
        let announced = 0;
        for (const n of live.values()) announced += n;
        const hashesPerChunk = w.selfDescribing ? w.chunkFactor : 1;
        assert.equal(announced, tier.readyKeys(late).length * hashesPerChunk);
        assert.equal(tier.readyKeys(late).length, tier.size);
      }),
      { numRuns: 60, seed: 13 },
    );
  });
});

describe("CPU tier event order", () => {
  it("a chunk's CPU BlockStored comes before the GPU BlockRemoved of its blocks, even when the caller idles between requests", () => {
    const e = new Engine(tight({ enableKvCacheEvents: true, kvOffload: { cpuBytes: 4 * GiB } }));
    const events: KVEvent[] = [];
    /** Steps only while requests are unfinished: a driver that does not wake up for store copies. */
    const run = (now: number) => {
      for (let i = 0; i < 10000 && e.hasUnfinishedRequests(); i++) {
        const s = e.step(now);
        for (const ev of s.kvEvents?.events ?? []) events.push(ev);
        now = Math.max(now, s.endTime);
      }
      return now;
    };
    e.addRequest({ id: "a", promptTokenIds: tokens(512, 1000), maxTokens: 1, ignoreEos: true }, 0);
    const t = run(0);
    e.addRequest({ id: "b", promptTokenIds: tokens(960, 50000), maxTokens: 1, ignoreEos: true }, t + 10);
    run(t + 10);
    const cpuStoredAt = new Map<bigint, number>();
    events.forEach((ev, i) => {
      if (ev.type === "BlockStored" && ev.medium === "CPU")
        for (const h of ev.blockHashes) if (!cpuStoredAt.has(h)) cpuStoredAt.set(h, i);
    });
    let checked = 0;
    events.forEach((ev, i) => {
      if (ev.type !== "BlockRemoved" || ev.medium !== "GPU") return;
      for (const h of ev.blockHashes) {
        const at = cpuStoredAt.get(h);
        if (at === undefined) continue;
        assert.ok(
          at < i,
          `block ${h}: CPU BlockStored (event ${at}) after its GPU BlockRemoved (event ${i})`,
        );
        checked++;
      }
    });
    assert.ok(checked > 0, "b's allocation evicted some of a's blocks that the CPU tier holds");
  });
});
