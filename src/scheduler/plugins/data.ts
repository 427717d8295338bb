/**
 * Typed data that producers write into the CycleState and scorers/filters read: prefix match
 * info (llm-d PrefixCacheMatchInfo) and in-flight load (llm-d InFlightLoad + UncachedRequestTokens).
 * Keys are namespaced by the producing plugin instance's name.
 */
import type { CycleState, DataKey } from "../types.ts";
import { familyKey } from "../types.ts";

export interface PrefixMatchInfo {
  /** Blocks hashed for this request (summed over prompts). */
  readonly totalBlocks: number;
  /** Effective block size in tokens (≥ 64). */
  readonly blockSizeTokens: number;
  /** Prompt tokens (real or pseudo). */
  readonly promptTokens: number;
  /** Blocks of this request the endpoint is believed to hold. */
  matchBlocks(endpointId: string): number;
  /** Whether any candidate matched at least one block. */
  readonly anyMatch: boolean;
  /**
   * Optional: every endpoint with matchBlocks > 0 and its count (endpoints not listed match 0),
   * so consumers can skip per-candidate lookups. Read-only.
   */
  matches?(): ReadonlyMap<string, number>;
  /**
   * Optional: a name for the prompt's first `blocks` blocks (53 bits of its last block's hash), the
   * same for every request sharing them; undefined past the first prompt's end.
   */
  prefixKey?(blocks: number): number | undefined;
}

/**
 * prefixKey() over a request's block hashes packed as [lo, hi] pairs (PackedHashes, PackedKeys): the
 * `blocks`-th block's hash, its high 32 bits and the top 21 of its low ones (an exact integer, no
 * string to build per lookup); undefined when the prompt has fewer blocks.
 */
export function packedKey(packed: ArrayLike<number> | undefined, blocks: number): number | undefined {
  if (packed === undefined || blocks < 1 || 2 * blocks > packed.length) return undefined;
  return (packed[2 * blocks - 1] >>> 0) * 2 ** 21 + (packed[2 * blocks - 2] >>> 11);
}

/** PrefixMatchInfo over a map of the matched endpoints (those absent match 0); producers extend it. */
export class MapMatchInfo implements PrefixMatchInfo {
  constructor(
    readonly totalBlocks: number,
    readonly blockSizeTokens: number,
    readonly promptTokens: number,
    /** Endpoints with a match, and their matchBlocks(). */
    readonly counts: Map<string, number>,
  ) {}
  get anyMatch(): boolean {
    return this.counts.size > 0;
  }
  matchBlocks(endpointId: string): number {
    return this.counts.get(endpointId) ?? 0;
  }
  matches(): ReadonlyMap<string, number> {
    return this.counts;
  }
}

export interface InFlightLoad {
  requests: number;
  tokens: number;
}

export interface InFlightInfo {
  /** Requests the gateway has in flight on the endpoint. */
  requests(endpointId: string): number;
  /** Uncached prompt tokens (plus output estimates, if enabled) in flight on the endpoint. */
  tokens(endpointId: string): number;
  /** This request's uncached prompt tokens (plus estimated output, if enabled) on the endpoint. */
  uncachedRequestTokens(endpointId: string): number;
  /**
   * Optional: requests() and tokens() of every endpoint of the cycle's candidate list, by position
   * (read-only), so scorers walking all candidates need no lookup by id; null if unavailable.
   */
  byPosition?(): {
    readonly requests: ArrayLike<number>;
    readonly tokens: ArrayLike<number>;
    /** contextTokens() by position, when the producer keeps it. */
    readonly context?: ArrayLike<number>;
  } | null;
  /** Optional: uncachedRequestTokens() when it is the same on every endpoint (nothing matched), else null. */
  uncachedForAll?(): number | null;
  /** Optional: the endpoint's prefill tokens/s learned from its first-token times; undefined until known. */
  prefillRate?(endpointId: string): number | undefined;
  /** Optional: uncached prompt tokens the gateway sent to the endpoint after time `since` (seconds). */
  promptTokensPickedSince?(endpointId: string, since: number): number;
  /**
   * Optional: whole prompt tokens (cached part included) of the requests in flight on the endpoint,
   * held until each ends: the context its decode steps read.
   */
  contextTokens?(endpointId: string): number;
  /**
   * Optional: when the oldest of the gateway's requests on the endpoint still waiting for its first
   * token was picked (seconds); undefined when none waits.
   */
  oldestWaitingSince?(endpointId: string): number | undefined;
  /** Optional: the endpoint's usual wait from pick to first token (a moving average, seconds). */
  usualWaitToStart?(endpointId: string): number | undefined;
}

export function prefixKey(producerName: string): DataKey<PrefixMatchInfo> {
  return familyKey<PrefixMatchInfo>("prefix-match-info", producerName);
}

export function inflightKey(producerName: string): DataKey<InFlightInfo> {
  return familyKey<InFlightInfo>("inflight-load", producerName);
}

/** Match ratio matchBlocks/totalBlocks; 0 when info is missing or empty. */
export function matchRatio(info: PrefixMatchInfo | undefined, endpointId: string): number {
  if (info === undefined || info.totalBlocks <= 0) return 0;
  return info.matchBlocks(endpointId) / info.totalBlocks;
}

/** Reads a required producer value, failing loudly if the producer did not run (a wiring bug). */
export function need<T>(cycle: CycleState, key: DataKey<T>, who: string): T {
  const v = cycle.get(key);
  if (v === undefined) throw new Error(`${who}: no data under "${key.name}"; its producer did not run`);
  return v;
}
