/**
 * Prefix-cache rewrites. Before the approx-prefix-cache-producer split the approximate index lived
 * in prefix-cache-scorer; before precise-prefix-cache-producer, the KV-event index lived in
 * precise-prefix-cache-scorer. Each old scorer becomes a producer plus a prefix-cache-scorer of the
 * same name, with character sizes converted to tokens so the same prefix and capacity are covered.
 */
import type { RawPlugin } from "../config.ts";
import { MIN_BLOCK_SIZE_TOKENS } from "../plugins/prefix/producer.ts";
import type { Ctx, Params } from "./common.ts";
import { CHARS_PER_TOKEN, flow, isRecord, keysOf, nonNegativeInt, positiveInt, who } from "./common.ts";

/** Parameters of the approximate prefix index that sat on prefix-cache-scorer before the producer split. */
export const APPROX_KEYS = [
  "hashBlockSize",
  "blockSize",
  "blockSizeTokens",
  "autoTune",
  "maxPrefixBlocksToMatch",
  "maxPrefixTokensToMatch",
  "lruCapacityPerServer",
];

/**
 * prefix-cache-scorer with index parameters, as GIE v1.0 (`hashBlockSize`, characters), GIE after
 * PR #1888 (`autoTune`, `blockSize` in characters) and later GIE / llm-d-router before the
 * approx-prefix-cache-producer split (`blockSizeTokens`) configured it: the scorer stays, the index
 * parameters move to a producer, translated so the same prompt prefix and KV capacity are covered.
 */
export function splitApproxScorer(p: RawPlugin, producer: RawPlugin, ctx: Ctx): RawPlugin[] {
  const old = p.parameters;
  const scorerParams: Params = {};
  for (const [k, v] of Object.entries(old)) if (!APPROX_KEYS.includes(k)) scorerParams[k] = v;
  scorerParams.prefixMatchInfoProducerName = producer.name;
  const next: Params = {};
  const notes: string[] = [];
  const chars = positiveInt(p, old.hashBlockSize === undefined ? "blockSize" : "hashBlockSize");
  if (old.hashBlockSize !== undefined && old.blockSize !== undefined)
    notes.push("blockSize ignored (hashBlockSize given)");
  const givenTokens = positiveInt(p, "blockSizeTokens");
  if (old.autoTune !== undefined) next.autoTune = old.autoTune;
  else if (old.hashBlockSize !== undefined) {
    next.autoTune = false;
    notes.push("autoTune: false (GIE v1.0 used the configured sizes as given)");
  }
  /** Tokens per block in the old config: the unit of maxPrefixBlocksToMatch and lruCapacityPerServer. */
  let oldBlockTokens = 16;
  if (givenTokens !== undefined) {
    next.blockSizeTokens = givenTokens;
    oldBlockTokens = givenTokens;
    if (chars !== undefined) notes.push(`${charKey(old)} ignored (blockSizeTokens given)`);
  } else if (chars !== undefined) {
    oldBlockTokens = chars / CHARS_PER_TOKEN;
    next.blockSizeTokens = Math.max(1, Math.ceil(oldBlockTokens));
    notes.push(`${charKey(old)}: ${chars} characters → blockSizeTokens: ${next.blockSizeTokens}`);
  }
  if (old.maxPrefixTokensToMatch !== undefined) next.maxPrefixTokensToMatch = old.maxPrefixTokensToMatch;
  const maxBlocks = nonNegativeInt(p, "maxPrefixBlocksToMatch");
  if (maxBlocks !== undefined && old.maxPrefixTokensToMatch === undefined) {
    next.maxPrefixTokensToMatch = Math.ceil(maxBlocks * oldBlockTokens);
    notes.push(
      `maxPrefixBlocksToMatch: ${maxBlocks} → maxPrefixTokensToMatch: ${next.maxPrefixTokensToMatch} (the same prefix length)`,
    );
  } else if (maxBlocks !== undefined)
    notes.push("maxPrefixBlocksToMatch ignored (maxPrefixTokensToMatch given)");
  const lru = positiveInt(p, "lruCapacityPerServer");
  if (lru !== undefined) {
    const newBlock = Math.max(Number(next.blockSizeTokens ?? 16), MIN_BLOCK_SIZE_TOKENS);
    next.lruCapacityPerServer = Math.max(1, Math.ceil((lru * oldBlockTokens) / newBlock));
    if (next.lruCapacityPerServer !== lru) {
      notes.push(
        `lruCapacityPerServer: ${lru} blocks of ${oldBlockTokens} tokens → ${next.lruCapacityPerServer} blocks of ${newBlock} (kvgate's blocks are at least ${MIN_BLOCK_SIZE_TOKENS} tokens)`,
      );
    }
  }
  producer.parameters = next;
  ctx.warnings.push(
    `${who(p)}: index parameters ${keysOf(p, APPROX_KEYS)} on the scorer are deprecated (${approxShape(old)}); loaded as approx-prefix-cache-producer "${producer.name}" ${flow(next)}${notes.map((n) => `; ${n}`).join("")} — declare "- type: approx-prefix-cache-producer" with those parameters`,
  );
  return [{ ...p, parameters: scorerParams }, producer];
}

/**
 * approx-prefix-cache-producer's deprecated `blockSize` is in characters (llm-d-router
 * approximateprefix config): without blockSizeTokens it becomes blockSizeTokens at 4 characters
 * per token; with it, it is ignored, as upstream does.
 */
export function charBlockSize(p: RawPlugin, ctx: Ctx): RawPlugin {
  const chars = positiveInt(p, "blockSize");
  if (chars === undefined) return p;
  const { blockSize: _, ...params } = p.parameters;
  if (params.blockSizeTokens !== undefined) {
    ctx.warnings.push(
      `${who(p)}: parameter "blockSize" is deprecated and ignored (blockSizeTokens given); remove it`,
    );
    return { ...p, parameters: params };
  }
  params.blockSizeTokens = Math.max(1, Math.ceil(chars / CHARS_PER_TOKEN));
  ctx.warnings.push(
    `${who(p)}: parameter "blockSize" (characters) is deprecated; loaded as blockSizeTokens: ${params.blockSizeTokens} (${chars} characters at ${CHARS_PER_TOKEN} per token) — write that instead`,
  );
  return { ...p, parameters: params };
}

/**
 * precise-prefix-cache-scorer (llm-d-inference-scheduler v0.3+, a deprecated alias in llm-d-router):
 * its index becomes precise-prefix-cache-producer, its scoring a prefix-cache-scorer of the same name.
 */
export function splitPreciseScorer(p: RawPlugin, producer: RawPlugin, ctx: Ctx): RawPlugin[] {
  const next: Params = {};
  const notes: string[] = [];
  const params = { ...p.parameters };
  const indexer = params.indexerConfig;
  if (
    isRecord(indexer) &&
    indexer.tokenProcessorConfig !== undefined &&
    params.tokenProcessorConfig === undefined
  ) {
    params.tokenProcessorConfig = indexer.tokenProcessorConfig;
    notes.push("indexerConfig.tokenProcessorConfig → tokenProcessorConfig");
  }
  for (const [k, v] of Object.entries(params)) {
    if (k === "indexerConfig" && isRecord(v) && v.kvCacheBackendConfigs !== undefined) {
      next.indexerConfig = { kvCacheBackendConfigs: v.kvCacheBackendConfigs };
      notes.push("indexerConfig: only kvCacheBackendConfigs (the tier weights) is used");
    } else if (k === "indexerConfig") {
      notes.push(
        "indexerConfig ignored (kvgate keeps an in-memory index sized by maxIndexEntries and tokenizes in the gateway)",
      );
    } else if (k === "speculativeTTL" && typeof v === "number") {
      next.speculativeTTL = `${v / 1e6}ms`;
      notes.push(`speculativeTTL: ${v} (nanoseconds) → "${next.speculativeTTL}"`);
    } else if (k === "tokenProcessorConfig" && isRecord(v)) {
      const { blockSize, ...rest } = v;
      next.tokenProcessorConfig = blockSize === undefined ? rest : { ...rest, blockSizeTokens: blockSize };
      if (blockSize !== undefined) notes.push("tokenProcessorConfig.blockSize → blockSizeTokens");
    } else if (k === "kvEventsConfig" && isRecord(v)) {
      const { zmqEndpoint, concurrency, discoverPods, ...rest } = v;
      next.kvEventsConfig = rest;
      if (zmqEndpoint !== undefined)
        notes.push(
          `kvEventsConfig.zmqEndpoint ignored (kvgate binds no socket; it subscribes to each endpoint's publisher on podDiscoveryConfig.socketPort)`,
        );
      if (concurrency !== undefined) notes.push("kvEventsConfig.concurrency ignored (one event loop)");
      if (discoverPods === false)
        notes.push("kvEventsConfig.discoverPods: false ignored (kvgate always subscribes per endpoint)");
    } else next[k] = v;
  }
  producer.parameters = next;
  ctx.warnings.push(
    `${who(p)} is deprecated (llm-d-inference-scheduler v0.3+; an alias in llm-d-router); loaded as precise-prefix-cache-producer "${producer.name}" ${flow(next)} + prefix-cache-scorer "${p.name}"${notes.map((n) => `; ${n}`).join("")} — declare those two plugins instead`,
  );
  return [
    { type: "prefix-cache-scorer", name: p.name, parameters: { prefixMatchInfoProducerName: producer.name } },
    producer,
  ];
}

function charKey(old: Params): string {
  return old.hashBlockSize !== undefined ? "hashBlockSize" : "blockSize";
}

/** Which release configured the scorer this way. */
function approxShape(old: Params): string {
  if (old.hashBlockSize !== undefined) return "GIE v1.0 / llm-d-inference-scheduler v0.3, characters";
  if (old.blockSize !== undefined) return "GIE after PR #1888, characters";
  return "GIE / llm-d-router before the approx-prefix-cache-producer split";
}
