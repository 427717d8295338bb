/** End to end below the gateway: the engine's CPU offload tier publishes vLLM's CPU KV events (both
 * forms, through the wire codec) and the precise index, fed them, still finds a prompt HBM evicted,
 * at the CPU weight, where an index of GPU events alone has lost it. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { EngineConfig } from "../src/engine/types.ts";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import { decodeEventBatch } from "../src/kv/event-codec.ts";
import { encodeEventBatch } from "../src/kv/event-encode.ts";
import type { KVEvent } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { Engine, engineConfig, tokens } from "./helpers/engine-fixtures.ts";

const xxh = await loadXxh64Hasher();
const keyer = new BlockKeyer({ hasher: xxh, blockSize: 16 });

/** A (512 tokens), then B (960), which evicts most of A from 69 usable GPU blocks; every event. */
function run(over: Partial<EngineConfig>, format: "array" | "map"): KVEvent[] {
  const e = new Engine(
    engineConfig({ numGpuBlocks: 70, maxModelLen: 1024, maxNumBatchedTokens: 1024, ...over }),
  );
  const events: KVEvent[] = [];
  let now = 0;
  const step = () => {
    const s = e.step(now);
    if (s.kvEvents !== null) events.push(...decodeEventBatch(encodeEventBatch(s.kvEvents, format)).events);
    return s;
  };
  for (const [id, n, base] of [
    ["a", 512, 0],
    ["b", 960, 10000],
  ] as const) {
    e.addRequest({ id, promptTokenIds: tokens(n, base), maxTokens: 1, ignoreEos: true }, now);
    for (let i = 0; i < 10000 && (e.hasUnfinishedRequests() || e.nextOffloadFree() !== null); i++) {
      const s = step();
      now = s.numScheduledRequests > 0 ? s.endTime : Math.max(now, e.nextOffloadFree() ?? now);
    }
  }
  now += 10;
  step(); // publishes stores that ended meanwhile
  return events;
}

function lookup(events: KVEvent[], filter: (ev: KVEvent) => boolean) {
  const ix = new PreciseIndex({ keyer, placeholderSpan: 4 });
  ix.setEndpointModel("r", "test-model");
  for (const ev of events) if (filter(ev)) ix.applyEvent("r", ev);
  const r = ix.longestPrefix(keyer.keys(tokens(512, 0), "test-model"), ["r"], 0);
  return { blocks: r.blocks[0], score: r.scores[0], stats: ix.stats() };
}

describe("engine CPU tier → precise index", () => {
  for (const [form, selfDescribingEvents, format] of [
    ["placeholder", false, "array"],
    ["self-describing", true, "map"],
  ] as const) {
    it(`${form} events: the prompt HBM evicted is still found, on CPU`, () => {
      const events = run(
        { kvOffload: { cpuBytes: 4 * 2 ** 30, chunkTokens: 64, selfDescribingEvents } },
        format,
      );
      const gpuOnly = lookup(events, (ev) => ev.type === "AllBlocksCleared" || ev.medium === "GPU");
      assert.ok(gpuOnly.blocks < 32, `GPU events alone: A's run is broken (${gpuOnly.blocks} blocks)`);
      const all = lookup(events, () => true);
      assert.equal(all.blocks, 32, "GPU + CPU events: all 32 blocks of A");
      assert.ok(all.score >= 32 * 0.8 - 1e-9 && all.score < 32, `CPU-weighted score ${all.score}`);
      assert.equal(all.stats.unknownMedium, 0);
      assert.equal(all.stats.locationOnlyUnknown, 0, "every placeholder named a block the index knew");
    });
  }
});
