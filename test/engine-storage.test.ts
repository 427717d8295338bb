/**
 * The fleet's shared-storage tier behind the engines' CPU tiers (storage-tier.ts, llm-d's filesystem
 * backend semantics): a prompt evicted from HBM and CPU but in storage hits from storage after the
 * modelled read; any replica hits what another stored; storage KV events carry llm-d's medium and
 * survive the wire; block, pin and transfer accounting under random two-replica workloads.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import type { OffloadLoad } from "../src/engine/cpu-tier.ts";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import { SharedStorage, STORAGE_MEDIUM } from "../src/engine/storage-tier.ts";
import type { EngineConfig, RequestRecord } from "../src/engine/types.ts";
import { decodeEventBatch } from "../src/kv/event-codec.ts";
import { encodeEventBatch } from "../src/kv/event-encode.ts";
import type { KVEvent } from "../src/kv/events.ts";
import { Engine, engineConfig, tokens } from "./helpers/engine-fixtures.ts";

/** 69 usable GPU blocks: one 1024-token request fits, two 512-token prompts do not. */
const tight = (over: Partial<EngineConfig> = {}) =>
  engineConfig({ numGpuBlocks: 70, maxModelLen: 1024, maxNumBatchedTokens: 1024, ...over });
const BPT = kvBytesPerToken(tight().profile.model);
/** A CPU tier of `chunks` 16-token chunks. */
const cpu = (chunks: number) => ({ kvOffload: { cpuBytes: chunks * 16 * BPT } });

const req = (id: string, n: number, base: number, maxTokens = 1) => ({
  id,
  promptTokenIds: tokens(n, base),
  maxTokens,
  ignoreEos: true,
});

interface Arrival {
  replica: number;
  at: number;
  req: ReturnType<typeof req>;
}

interface Driven {
  loads: OffloadLoad[];
  records: Map<string, RequestRecord>;
  events: KVEvent[];
  /** The step time at which each load was started. */
  foundAt: Map<OffloadLoad, number>;
}

/**
 * Steps engines that share a storage tier in one timeline (always the engine whose clock is
 * earliest), completing each load at its readyAt and checking every invariant after each step,
 * the storage's pins against the reads in flight included.
 */
function driveAll(
  engines: Engine[],
  storage: SharedStorage,
  start: number[],
  out?: Driven[],
  arrivals: Arrival[] = [],
): Driven[] {
  const runs: Driven[] =
    out ?? engines.map(() => ({ loads: [], records: new Map(), events: [], foundAt: new Map() }));
  const now = start.slice();
  const pending: OffloadLoad[][] = engines.map(() => []);
  const queued = arrivals.slice().sort((a, b) => a.at - b.at);
  const busy = (i: number) =>
    engines[i].hasUnfinishedRequests() ||
    pending[i].length > 0 ||
    engines[i].nextOffloadFree() !== null ||
    queued.some((a) => a.replica === i);
  for (let guard = 0; guard < 200000; guard++) {
    let i = -1;
    for (let k = 0; k < engines.length; k++) if (busy(k) && (i < 0 || now[k] < now[i])) i = k;
    if (i < 0) return runs;
    const e = engines[i];
    // Requests reach an engine at their arrival: an idle engine's clock jumps to the next one.
    const next = queued.find((a) => a.replica === i);
    if (
      next !== undefined &&
      !e.hasUnfinishedRequests() &&
      pending[i].length === 0 &&
      e.nextOffloadFree() === null
    )
      now[i] = Math.max(now[i], next.at);
    for (let q = 0; q < queued.length; q++) {
      const a = queued[q];
      if (a.replica !== i || a.at > now[i]) continue;
      e.addRequest(a.req, a.at);
      queued.splice(q--, 1);
    }
    pending[i].sort((a, b) => a.readyAt - b.readyAt);
    while (pending[i].length > 0 && pending[i][0].readyAt <= now[i]) {
      const l = pending[i].shift() as OffloadLoad;
      assert.equal(e.completeRemoteKv(l.requestId, now[i], true).outcome, "loaded");
    }
    const s = e.step(now[i]);
    e.checkInvariants();
    storage.checkInvariants();
    let reading = 0;
    for (const p of pending) for (const l of p) reading += l.storageKeys?.length ?? 0;
    for (const l of s.offloadLoads ?? []) reading += l.storageKeys?.length ?? 0;
    assert.equal(storage.totalPins, reading, "storage pins = chunks of the reads in flight");
    for (const ev of s.kvEvents?.events ?? []) runs[i].events.push(ev);
    for (const l of s.offloadLoads ?? []) {
      pending[i].push(l);
      runs[i].loads.push(l);
      runs[i].foundAt.set(l, now[i]);
    }
    for (const o of s.outputs) if (o.record) runs[i].records.set(o.requestId, o.record);
    if (s.numScheduledRequests > 0) now[i] = s.endTime;
    else if (busy(i)) {
      const wake = Math.min(
        ...pending[i].map((l) => l.readyAt),
        ...queued.filter((a) => a.replica === i).map((a) => a.at),
        e.nextOffloadFree() ?? Number.POSITIVE_INFINITY,
        // Another engine's progress (a store, a read) may be what this one waits for.
        ...now.filter((_, k) => k !== i && busy(k)),
      );
      if (wake === Number.POSITIVE_INFINITY) throw new Error(`engine ${i} stalled at ${now[i]}`);
      now[i] = Math.max(now[i], wake, now[i] + 1e-6);
    }
  }
  throw new Error("engines did not finish");
}

/** A, then B (which evicts A from HBM and, in a small CPU tier, from CPU), then A again. */
function evictTwice(storage: SharedStorage | null, cpuChunks: number) {
  const opts = storage === null ? {} : { sharedStorage: storage };
  // 256-token chunks of prefill: b's stores come in steps, each evicting a's oldest CPU chunks.
  const e = new Engine(tight({ ...cpu(cpuChunks), maxNumBatchedTokens: 256 }), opts);
  const st = storage ?? new SharedStorage();
  const [run] = driveAll([e], st, [0]);
  e.addRequest(req("a", 512, 0), 0);
  driveAll([e], st, [0], [run]);
  const t1 = Math.max(...[...run.records.values()].map((r) => r.finishTime ?? 0)) + 1;
  e.addRequest(req("b", 960, 10000), t1);
  driveAll([e], st, [t1], [run]);
  const t2 = Math.max(...[...run.records.values()].map((r) => r.finishTime ?? 0)) + 1;
  e.addRequest(req("a2", 512, 0), t2);
  const loadsBefore = run.loads.length;
  driveAll([e], st, [t2], [run]);
  return { e, rec: run.records.get("a2") as RequestRecord, loads: run.loads.slice(loadsBefore), start: t2 };
}

describe("shared storage tier: hits", () => {
  it("a prompt evicted from HBM and CPU but in storage hits from storage, loaded at its read bandwidth", () => {
    // 40 CPU chunks (640 tokens): b's 960 tokens push every one of a's chunks out of CPU.
    const without = evictTwice(null, 40);
    assert.equal(without.loads.length, 0, "without storage nothing of a is left outside HBM");
    const gpuHit = without.rec.cachedTokens;
    assert.ok(gpuHit < 512 - 16, `b evicted most of a from HBM (GPU hit ${gpuHit})`);

    const readBandwidth = 2e9;
    const storage = new SharedStorage({ readBandwidth, writeBandwidth: 4e9 });
    const { e, rec, loads, start } = evictTwice(storage, 40);
    assert.equal(loads.length, 1, "one load, for a2");
    const [l] = loads;
    assert.equal(l.tokens, 512 - gpuHit, "the lookup continues past HBM through storage to the prompt's end");
    assert.equal(l.storageTokens, l.tokens, "every chunk comes from storage");
    assert.deepEqual(l.keys, [], "nothing from CPU");
    assert.equal(l.bytes, l.tokens * BPT);
    assert.ok(
      Math.abs(l.readyAt - l.startTime - l.bytes / readBandwidth) < 1e-12,
      "read at storage bandwidth",
    );
    assert.ok(l.startTime >= start);
    assert.ok((rec.firstTokenTime as number) > l.readyAt, "the first token waits for the read");
    assert.equal(rec.cachedTokens, 511, "cached_tokens counts storage hits too");
    const s = e.stats().offload;
    assert.equal(s?.storageHits, 512 - gpuHit);
    assert.equal(s?.externalHits, 512 - gpuHit);
    assert.equal(storage.counters.readBytes, l.bytes);
    assert.equal(storage.counters.writtenChunks, (512 + 960) / 16, "every chunk was written once");
    assert.ok(
      Math.abs(storage.counters.writeTime - storage.counters.writeBytes / 4e9) < 1e-12,
      "writes take write bandwidth",
    );
  });

  it("a chunk one replica stored is a hit for another replica that never saw the prompt", () => {
    const storage = new SharedStorage({ readBandwidth: 5e9 });
    const r1 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    const r2 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    r1.addRequest(req("a", 512, 0), 0);
    const runs = driveAll([r1, r2], storage, [0, 0]);
    const t = 10;
    r2.addRequest(req("a-on-r2", 512, 0), t);
    driveAll([r1, r2], storage, [t, t], runs);
    const [l] = runs[1].loads;
    assert.ok(l, "r2 loads a's prefix");
    assert.equal(l.storageTokens, 512, "from storage: r2's HBM and CPU never held it");
    assert.equal(runs[1].records.get("a-on-r2")?.cachedTokens, 511);
    assert.ok(Math.abs(l.readyAt - l.startTime - (512 * BPT) / 5e9) < 1e-12);
    // r2 wrote nothing new: the chunks were in storage already.
    assert.equal(storage.counters.writtenChunks, 32);
  });

  it("a store is not hittable in storage before its write ends", () => {
    const storage = new SharedStorage({ writeBandwidth: 1e6 });
    const r1 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    const r2 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    r1.addRequest(req("a", 512, 0), 0);
    const runs = driveAll([r1], storage, [0]);
    r2.addRequest(req("a2", 512, 0), 1);
    const r2run = driveAll([r2], storage, [1]);
    assert.equal(r2run[0].loads.length, 0, "512 tokens at 1 MB/s are still being written");
    assert.equal(r2run[0].records.get("a2")?.cachedTokens, 0);
    assert.ok(runs[0].records.get("a"));
  });

  it("storage needs a CPU tier, and one chunk size per shared tier", () => {
    const storage = new SharedStorage();
    assert.throws(() => new Engine(tight(), { sharedStorage: storage }), /needs kvOffload/);
    new Engine(tight(cpu(10)), { sharedStorage: storage });
    assert.throws(
      () =>
        new Engine(tight({ kvOffload: { cpuBytes: 640 * BPT, chunkTokens: 64 } }), {
          sharedStorage: storage,
        }),
      /one model and offload block size/,
    );
  });
});

describe("shared storage tier: KV events", () => {
  it("BlockStored with medium SHARED_STORAGE (llm-d's placeholder: one hash per chunk, no tokens) survives both wire layouts", () => {
    for (const format of ["array", "map"] as const) {
      const storage = new SharedStorage();
      const e = new Engine(tight({ kvOffload: { cpuBytes: 4 * 2 ** 30, chunkTokens: 64 } }), {
        sharedStorage: storage,
      });
      e.addRequest(req("a", 200, 0), 0);
      const [run] = driveAll([e], storage, [0]);
      const late = e.step(100).kvEvents;
      const events: KVEvent[] = [];
      for (const b of [...run.events.map((ev) => ({ ts: 0, events: [ev], dataParallelRank: 0 })), late])
        if (b !== null)
          for (const ev of decodeEventBatch(encodeEventBatch(b, format)).events) events.push(ev as KVEvent);
      const gpu = events.flatMap((ev) =>
        ev.type === "BlockStored" && ev.medium === "GPU" ? ev.blockHashes : [],
      );
      const stored = events.filter((ev) => ev.type === "BlockStored" && ev.medium === STORAGE_MEDIUM);
      assert.equal(stored.length, 1, `${format}: one event for the one write`);
      const [ev] = stored;
      assert.ok(ev.type === "BlockStored");
      assert.deepEqual(
        ev.blockHashes,
        [gpu[3], gpu[7], gpu[11]],
        "the 64-token chunks' last GPU block hashes",
      );
      assert.deepEqual(ev.tokenIds, []);
      assert.equal(ev.blockSize, 0);
      const cpuAt = events.findIndex((x) => x.type === "BlockStored" && x.medium === "CPU");
      assert.ok(cpuAt >= 0 && cpuAt < events.indexOf(ev), "announced after its CPU copy");
    }
  });

  it("cleanup that drops a chunk publishes BlockRemoved SHARED_STORAGE from the replica that wrote it", () => {
    const storage = new SharedStorage({ capacityBytes: 40 * 16 * BPT });
    const r1 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    const r2 = new Engine(tight(cpu(200)), { sharedStorage: storage });
    r1.addRequest(req("a", 512, 0), 0);
    const runs = driveAll([r1, r2], storage, [0, 0]);
    r2.addRequest(req("b", 512, 7000), 5);
    driveAll([r1, r2], storage, [5, 5], runs);
    const removedBy = (i: number) =>
      runs[i].events.flatMap((ev) =>
        ev.type === "BlockRemoved" && ev.medium === STORAGE_MEDIUM ? ev.blockHashes : [],
      );
    // r1 is idle meanwhile: its next step publishes what b's write did to its chunks.
    const late = r1.step(50).kvEvents?.events ?? [];
    const r1Removed = [
      ...removedBy(0),
      ...late.flatMap((ev) =>
        ev.type === "BlockRemoved" && ev.medium === STORAGE_MEDIUM ? ev.blockHashes : [],
      ),
    ];
    assert.equal(r1Removed.length, 32 + 32 - 40, "b's write dropped 24 of a's chunks, announced by r1");
    assert.equal(removedBy(1).length, 0);
    assert.equal(storage.size, 40);
  });
});

describe("shared storage tier: accounting under random two-replica workloads", () => {
  it("blocks, capacities, pins and read times stay consistent", () => {
    const workload = fc.record({
      cpuChunks: fc.integer({ min: 4, max: 60 }),
      storageChunks: fc.integer({ min: 4, max: 120 }),
      readGBps: fc.constantFrom(1, 10, 100),
      reqs: fc.array(
        fc.record({
          replica: fc.constantFrom(0, 1),
          base: fc.constantFrom(0, 5000, 9000),
          len: fc.integer({ min: 1, max: 400 }),
          maxTokens: fc.integer({ min: 1, max: 20 }),
          at: fc.double({ min: 0, max: 2, noNaN: true }),
        }),
        { minLength: 2, maxLength: 16 },
      ),
    });
    let withReads = 0;
    fc.assert(
      fc.property(workload, (w) => {
        const readBandwidth = w.readGBps * 1e9;
        const storage = new SharedStorage({ capacityBytes: w.storageChunks * 16 * BPT, readBandwidth });
        const engines = [0, 1].map(
          () =>
            new Engine(tight({ maxModelLen: 512, numGpuBlocks: 60, ...cpu(w.cpuChunks) }), {
              sharedStorage: storage,
            }),
        );
        const arrivals = w.reqs.map((r, i) => ({
          replica: r.replica,
          at: r.at,
          req: req(`r${i}`, r.len, r.base, r.maxTokens),
        }));
        const runs = driveAll(engines, storage, [0, 0], undefined, arrivals);
        assert.equal(runs[0].records.size + runs[1].records.size, w.reqs.length, "every request finishes");
        assert.ok(storage.size <= w.storageChunks);
        let readBytes = 0;
        let storageHits = 0;
        const reads = runs.flatMap((r) => r.loads).filter((l) => (l.storageKeys?.length ?? 0) > 0);
        for (const l of runs.flatMap((r) => r.loads)) {
          const own = runs.find((r) => r.loads.includes(l)) as Driven;
          const rec = own.records.get(l.requestId) as RequestRecord;
          const found = own.foundAt.get(l) as number;
          assert.ok(!rec.tokenTimes.some((x) => x > found && x <= l.readyAt), "no token while it loads");
          storageHits += l.storageTokens ?? 0;
          const sBytes = (l.storageKeys?.length ?? 0) * 16 * BPT;
          readBytes += sBytes;
          assert.ok(
            l.readyAt - l.startTime >= sBytes / readBandwidth - 1e-12,
            "a read takes its bytes' time",
          );
        }
        // The fleet's read link carries one read at a time: total read time = bytes / bandwidth.
        assert.equal(storage.counters.readBytes, readBytes);
        assert.ok(Math.abs(storage.counters.readTime - readBytes / readBandwidth) < 1e-9);
        assert.equal(
          storageHits,
          engines.reduce((n, e) => n + (e.stats().offload?.storageHits ?? 0), 0),
        );
        assert.equal(storage.totalPins, 0, "no read left pinned");
        for (const l of reads) assert.ok((l.storageTokens ?? 0) > 0);
        if (reads.length > 0) withReads++;
      }),
      { numRuns: 50, seed: 31 },
    );
    assert.ok(withReads >= 10, `storage reads happened in ${withReads} of 50 workloads`);
  });
});
