/**
 * bench:kv-events — how fast precise mode ingests vLLM KV events on one core: encoded event batches
 * (both encodings) go through decodeEventBatch and PreciseIndex.applyEvent in-process, as the subscriber
 * does after receiving them. Reports block events (block hashes named by BlockStored / BlockRemoved)
 * per CPU-second, median of several repetitions after a warm-up, for 8 and 64 endpoints, two workloads:
 *   fill   — BlockStored only (runs of 1–32 blocks of 16 tokens; half continue a held block, a fifth
 *            start with one of 16 shared system prompts): the expensive path, every block is hashed;
 *   steady — each endpoint's cache fills (min(8192, blocks/endpoints/4) blocks), then every store
 *            evicts: BlockStored plus BlockRemoved.
 * Also decode-only throughput, the FNV-1a hasher on the same input (for the hasher choice), and index
 * bytes per (block, endpoint) entry: the index's own estimate from its arrays and a process.memoryUsage()
 * delta (run with --expose-gc, as the npm script does, for a clean delta).
 *
 *   npm run bench:kv-events -- [--reps 5] [--blocks 600000] [--json FILE]
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { dirname, resolve } from "node:path";
import { type BlockHasher, BlockKeyer, fnv1a64Hasher, loadXxh64Hasher } from "../kv/block-keys.ts";
import {
  type DecodedEventBatch,
  decodeEventBatch,
  type EventFormat,
  encodeEventBatch,
} from "../kv/event-codec.ts";
import type { KVEvent, KVEventBatch } from "../kv/events.ts";
import { decodeEventBatchFast } from "../kv/precise-decode.ts";
import { PreciseIndex } from "../kv/precise-index.ts";
import { parseBenchArgs } from "./cli-args.ts";

const USAGE =
  "usage: npm run bench:kv-events -- [--reps 5] [--blocks 600000] [--only ENDPOINTS:WORKLOAD:FORMAT] [--json FILE]";

type Decoder = (buf: Uint8Array) => DecodedEventBatch;

const BLOCK = 16;
const CACHE_BLOCKS = 8192;
const TARGET = 1_000_000;

type Workload = "fill" | "steady";
interface Msg {
  ep: string;
  bytes: Uint8Array;
}

/** A seeded xorshift PRNG. */
function prng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

/**
 * Generates per-endpoint engine-like streams, interleaved round-robin, until `totalBlocks` block events,
 * encoded in both formats as they are generated (decoded objects are not kept: a large live heap would
 * slow every GC of the measured passes).
 */
function generate(endpoints: number, workload: Workload, totalBlocks: number, seed: number) {
  const cache = Math.min(CACHE_BLOCKS, Math.floor(totalBlocks / endpoints / 4));
  const r = prng(seed);
  const int = (n: number) => Math.floor(r() * n);
  const hash = () => (BigInt(int(2 ** 32)) << 32n) | BigInt(int(2 ** 32));
  const systems = Array.from({ length: 16 }, () => {
    const n = 8 + int(56);
    return {
      hashes: Array.from({ length: n }, hash),
      tokens: Array.from({ length: n * BLOCK }, () => int(150_000)),
    };
  });
  const held: bigint[][] = Array.from({ length: endpoints }, () => []);
  const encoded: Record<EventFormat, Msg[]> = { array: [], map: [] };
  let blocks = 0;
  let stored = 0;
  while (blocks < totalBlocks) {
    for (let e = 0; e < endpoints && blocks < totalBlocks; e++) {
      const h = held[e];
      const events: KVEvent[] = [];
      const n = 1 + int(6);
      for (let i = 0; i < n; i++) {
        let hashes: bigint[];
        let tokens: number[];
        let parent: bigint | null = null;
        if (h.length > 0 && r() < 0.5) parent = h[int(h.length)];
        if (parent === null && r() < 0.2) {
          const sys = systems[int(systems.length)];
          hashes = sys.hashes.slice();
          tokens = sys.tokens;
        } else {
          const len = 1 + int(32);
          hashes = Array.from({ length: len }, hash);
          tokens = Array.from({ length: len * BLOCK }, () => int(150_000));
        }
        events.push({
          type: "BlockStored",
          blockHashes: hashes,
          parentBlockHash: parent,
          tokenIds: tokens,
          blockSize: BLOCK,
          loraId: null,
          medium: "GPU",
          loraName: null,
          extraKeys: hashes.map(() => null),
          groupIdx: 0,
          kvCacheSpecKind: "full_attention",
          kvCacheSpecSlidingWindow: null,
        });
        for (const x of hashes) h.push(x);
        blocks += hashes.length;
        stored += hashes.length;
        if (workload === "steady" && h.length > cache) {
          const victims: bigint[] = [];
          while (h.length > cache) {
            const at = int(h.length);
            victims.push(h[at]);
            h[at] = h[h.length - 1];
            h.pop();
          }
          events.push({ type: "BlockRemoved", blockHashes: victims, medium: "GPU", groupIdx: 0 });
          blocks += victims.length;
        }
      }
      const ep = `10.0.${e >> 8}.${e & 255}:8000`;
      const batch: KVEventBatch = { ts: 1.7e9, events, dataParallelRank: 0 };
      for (const f of ["array", "map"] as const) encoded[f].push({ ep, bytes: encodeEventBatch(batch, f) });
    }
  }
  return { encoded, blocks, stored, cache };
}

interface Pass {
  blocks: number;
  events: number;
  cpuSeconds: number;
  index: PreciseIndex;
}

/** Decodes and applies every message into `index` (cleared first: capacity kept, as in a long-running gateway). */
function ingest(msgs: Msg[], index: PreciseIndex, decode: Decoder, decodeOnly = false): Pass {
  index.clear();
  let blocks = 0;
  let events = 0;
  const t0 = process.cpuUsage();
  for (const m of msgs) {
    const b = decode(m.bytes);
    events += b.events.length;
    if (decodeOnly) {
      for (const ev of b.events) blocks += ev.type === "AllBlocksCleared" ? 1 : ev.blockHashes.length;
      continue;
    }
    for (const ev of b.events) blocks += index.applyEvent(m.ep, ev);
  }
  const t = process.cpuUsage(t0);
  return { blocks, events, cpuSeconds: (t.user + t.system) / 1e6, index };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function measure(msgs: Msg[], hasher: BlockHasher, decode: Decoder, reps: number, decodeOnly = false) {
  const index = new PreciseIndex({ keyer: new BlockKeyer({ hasher, blockSize: BLOCK }) });
  ingest(msgs, index, decode, decodeOnly); // warm-up: JIT, and the index grows to its size once
  const rates: number[] = [];
  const eventRates: number[] = [];
  for (let i = 0; i < reps; i++) {
    const p = ingest(msgs, index, decode, decodeOnly);
    rates.push(p.blocks / p.cpuSeconds);
    eventRates.push(p.events / p.cpuSeconds);
  }
  return { blocksPerCpuSecond: median(rates), eventsPerCpuSecond: median(eventRates), reps: rates };
}

/** Full GCs with pauses between: V8 frees ArrayBuffer backing stores after the GC, concurrently. */
async function settle(): Promise<void> {
  const gc = (globalThis as { gc?: () => void }).gc;
  for (let i = 0; i < 4; i++) {
    gc?.();
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function memory(msgs: Msg[], hasher: BlockHasher) {
  const gc = (globalThis as { gc?: () => void }).gc;
  await settle();
  const before = process.memoryUsage();
  const { index } = ingest(
    msgs,
    new PreciseIndex({ keyer: new BlockKeyer({ hasher, blockSize: BLOCK }) }),
    decodeEventBatchFast,
  );
  await settle();
  const after = process.memoryUsage();
  const s = index.stats();
  const delta = after.heapUsed + after.arrayBuffers - (before.heapUsed + before.arrayBuffers);
  return {
    entries: s.entries,
    keys: s.keys,
    bytesPerEntryEstimate: s.bytesPerEntry,
    bytesPerEntryMeasured: delta / s.entries,
    gcExposed: gc !== undefined,
  };
}

/**
 * Request-side cost on a large index: keys of an 8k-token prompt (512 blocks), then the lookup (match) over
 * 256 endpoints, as the precise producer runs them. Every endpoint holds a 128-block shared system prompt; 32 also hold the whole prompt.
 */
function lookupCost(hasher: BlockHasher, reps: number) {
  const keyer = new BlockKeyer({ hasher, blockSize: BLOCK });
  const index = new PreciseIndex({ keyer });
  const r = prng(5);
  const tokens = Array.from({ length: 8192 }, () => Math.floor(r() * 150_000));
  const ids = Array.from({ length: 256 }, (_, e) => `10.1.${e >> 8}.${e & 255}:8000`);
  for (const [e, id] of ids.entries()) {
    index.setEndpointModel(id, "m");
    const n = e < 32 ? 512 : 128;
    index.applyEvent(id, {
      type: "BlockStored",
      blockHashes: Array.from({ length: n }, (_, j) => BigInt(j + 1)),
      parentBlockHash: null,
      tokenIds: tokens.slice(0, n * BLOCK),
      blockSize: BLOCK,
      loraId: null,
      medium: "GPU",
      loraName: null,
      extraKeys: null,
      groupIdx: 0,
      kvCacheSpecKind: null,
      kvCacheSpecSlidingWindow: null,
    });
  }
  const keyTimes: number[] = [];
  const lookupTimes: number[] = [];
  let matched = 0;
  // The producer's path: packed keys (one wasm call), candidates resolved once, one walk for all.
  const eps = index.resolve(ids);
  for (let i = 0; i < reps * 40; i++) {
    const t0 = process.cpuUsage();
    const keys = keyer.packedKeys(tokens, "m");
    const t1 = process.cpuUsage();
    const m = index.match(keys, eps, 0);
    const t2 = process.cpuUsage();
    for (let j = 0; j < m.count; j++) if (m.pos[j] === 0) matched = m.blocks[j];
    keyTimes.push(t1.user + t1.system - t0.user - t0.system);
    lookupTimes.push(t2.user + t2.system - t1.user - t1.system);
  }
  return {
    promptTokens: tokens.length,
    keys: tokens.length / BLOCK,
    endpoints: ids.length,
    entries: index.stats().entries,
    matchedBlocksOfFullHolders: matched,
    keysMicrosecondsMedian: median(keyTimes),
    lookupMicrosecondsMedian: median(lookupTimes),
  };
}

async function main(): Promise<void> {
  const { values } = parseBenchArgs("bench:kv-events", USAGE, {
    options: {
      reps: { type: "string", default: "5" },
      blocks: { type: "string", default: "600000" },
      json: { type: "string", default: "results/bench-kv-events.json" },
      /** Run only matching cases, e.g. "64:fill:map" (endpoints:workload:format, any part may be "*"). */
      only: { type: "string", default: "*:*:*" },
    },
  });
  const reps = Number(values.reps);
  const total = Number(values.blocks);
  if (!Number.isInteger(reps) || reps < 1) throw new Error("--reps must be a positive integer");
  if (!Number.isInteger(total) || total < 1000) throw new Error("--blocks must be an integer >= 1000");
  const xxh = await loadXxh64Hasher();
  const fnv = fnv1a64Hasher();
  const results = [];
  let memoryResult: Awaited<ReturnType<typeof memory>> | null = null;
  for (const endpoints of [8, 64]) {
    for (const workload of ["fill", "steady"] as Workload[]) {
      const gen = generate(endpoints, workload, total, endpoints * 7 + workload.length);
      for (const format of ["array", "map"] as EventFormat[]) {
        const only = values.only.split(":");
        if ([String(endpoints), workload, format].some((v, i) => only[i] !== "*" && only[i] !== v)) continue;
        const msgs = gen.encoded[format];
        if (endpoints === 64 && workload === "fill" && format === "map")
          memoryResult = await memory(msgs, xxh);
        const bytes = msgs.reduce((a, m) => a + m.bytes.length, 0);
        const few = Math.min(reps, 3);
        const full = measure(msgs, xxh, decodeEventBatchFast, reps);
        const reference = measure(msgs, xxh, decodeEventBatch, few);
        const fastDecode = measure(msgs, xxh, decodeEventBatchFast, reps, true);
        const referenceDecode = measure(msgs, xxh, decodeEventBatch, few, true);
        const fnvRate =
          format === "map" ? measure(msgs, fnv, decodeEventBatchFast, few).blocksPerCpuSecond : null;
        results.push({
          endpoints,
          workload,
          format,
          blockEvents: gen.blocks,
          storedShare: gen.stored / gen.blocks,
          cacheBlocksPerEndpoint: workload === "steady" ? gen.cache : null,
          payloadBytesPerBlock: bytes / gen.blocks,
          /** The subscriber's path: specialised decoder + index with xxh64 keys. */
          blocksPerCpuSecond: full.blocksPerCpuSecond,
          eventsPerCpuSecond: full.eventsPerCpuSecond,
          withReferenceDecoderBlocksPerCpuSecond: reference.blocksPerCpuSecond,
          decodeOnlyBlocksPerCpuSecond: fastDecode.blocksPerCpuSecond,
          referenceDecodeOnlyBlocksPerCpuSecond: referenceDecode.blocksPerCpuSecond,
          withFnvBlocksPerCpuSecond: fnvRate,
          reps: full.reps,
        });
        const M = (x: number) => `${(x / 1e6).toFixed(2)}M`;
        console.log(
          `${String(endpoints).padStart(2)} endpoints, ${workload.padEnd(6)} ${format.padEnd(5)}: ` +
            `${M(full.blocksPerCpuSecond)} block events/CPU-s (with decodeEventBatch ${M(reference.blocksPerCpuSecond)}; ` +
            `decode alone ${M(fastDecode.blocksPerCpuSecond)} vs ${M(referenceDecode.blocksPerCpuSecond)}` +
            `${fnvRate === null ? "" : `; with FNV-1a ${M(fnvRate)}`}; ${((gen.stored / gen.blocks) * 100).toFixed(0)}% stored)`,
        );
      }
    }
  }
  const worst = Math.min(...results.map((r) => r.blocksPerCpuSecond));
  const lookup = lookupCost(xxh, reps);
  console.log(
    `request side: keys of ${lookup.promptTokens} tokens ${lookup.keysMicrosecondsMedian.toFixed(0)} µs, ` +
      `lookup over ${lookup.keys} keys x ${lookup.endpoints} endpoints ${lookup.lookupMicrosecondsMedian.toFixed(0)} µs (median CPU time)`,
  );
  const summary = {
    benchmark: "kv-events",
    node: process.version,
    cpu: cpus()[0]?.model ?? "unknown",
    cpus: cpus().length,
    /** CPU time is inflated when other processes share the cores and caches: check the load. */
    loadAverage1m: loadavg()[0],
    hasher: "xxh64 (xxhash-wasm)",
    workload: `${total} block events per pass; BlockStored runs of 1-32 blocks x ${BLOCK} tokens; steady = full caches (min(${CACHE_BLOCKS}, blocks/endpoints/4) blocks) with BlockRemoved evictions`,
    reps,
    targetBlocksPerCpuSecond: TARGET,
    worstBlocksPerCpuSecond: worst,
    meetsTarget: worst >= TARGET,
    memory: memoryResult,
    lookup,
    results,
  };
  const out = resolve(values.json);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(summary, null, 2)}\n`);
  const m = memoryResult;
  console.log(
    `worst case ${(worst / 1e6).toFixed(2)}M block events/CPU-s (target ${TARGET / 1e6}M: ${summary.meetsTarget ? "met" : "NOT met"})` +
      (m === null
        ? ""
        : `; index ${m.bytesPerEntryEstimate.toFixed(0)} B/entry estimated, ${m.bytesPerEntryMeasured.toFixed(0)} B/entry measured (${m.entries} entries${m.gcExposed ? "" : ", no --expose-gc"})`) +
      ` → ${out}`,
  );
}

await main();
