/** Feeds a precise producer's index as a vLLM engine would: one BlockStored for a prompt's first blocks. */
import type { BlockStored } from "../../src/kv/events.ts";
import type { PrecisePrefixProducer } from "../../src/scheduler/plugins/precise-prefix-cache-producer.ts";

/**
 * The engine on endpoint `id` (serving model "m") stores blocks [0, n) of `tokens` in `medium`,
 * with engine hashes 2^63 + i (above any request key, so the two are never confused).
 */
export function storeBlocks(
  p: PrecisePrefixProducer,
  id: string,
  tokens: readonly number[],
  n: number,
  medium = "GPU",
): void {
  const ev: BlockStored = {
    type: "BlockStored",
    blockHashes: Array.from({ length: n }, (_, i) => (1n << 63n) + BigInt(i)),
    parentBlockHash: null,
    tokenIds: tokens.slice(0, n * 16),
    blockSize: 16,
    loraId: null,
    medium,
    loraName: null,
    extraKeys: null,
    groupIdx: 0,
    kvCacheSpecKind: "full_attention",
    kvCacheSpecSlidingWindow: null,
  };
  p.index.setEndpointModel(id, "m");
  p.index.applyEvent(id, ev);
}
