/**
 * approx-prefix-cache-producer (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/`): hashes the request's prompt
 * into chained
 * block hashes once per request, looks them up in the approximate index, and writes
 * PrefixMatchInfo for every candidate. After the pick (PreRequest) it records the blocks on the
 * chosen endpoint (and on the `prefill` profile's endpoint), learning only from its own decisions.
 */
import { z } from "zod";
import type { Hasher, PackedHashes } from "../../hash.ts";
import type { PluginHandle } from "../../plugin-spec.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  DataProducer,
  EndpointState,
  PluginStats,
  PreRequestHook,
  RequestFacts,
  ResponseHooks,
  ResponseInfo,
  ScheduleResult,
  TypedName,
} from "../../types.ts";
import type { PrefixMatchInfo } from "../data.ts";
import { MapMatchInfo, packedKey, prefixKey } from "../data.ts";
import { ChainCache } from "./chain-cache.ts";
import { chainHashesPacked, flatPrompt, rootHash, transientPrompt } from "./hashing.ts";
import { ApproxPrefixIndex } from "./indexer.ts";

export const APPROX_PREFIX_TYPE = "approx-prefix-cache-producer";
/** Block-size floor: smaller blocks blow up index memory (llm-d-router#1158). */
export const MIN_BLOCK_SIZE_TOKENS = 64;
/**
 * High 32 bits of the synthetic churn blocks' hashes (countOutputTokens): a real block hash has them
 * with probability 2^-32, and then also needs its low half to be one of the few live churn blocks'.
 */
const CHURN_HI = 0x4b56_4348 | 0;
/**
 * The low half is the churn counter times this odd constant (2^32 / golden ratio): a bijection on 32
 * bits, so still unique, and spread over the index's hash table, which starts each probe at the low
 * bits (block-table.ts). The counter itself filled consecutive slots: every real block whose hash
 * landed in that run probed past all live churn blocks, and a 512-replica simulation of the 150 × 5
 * shape took 1,079 s wall instead of ~500.
 */
const CHURN_SPREAD = 0x9e37_79b1 | 0;
/** Profile whose target also learns the blocks in P/D (hard-coded in llm-d too). */
export const PREFILL_PROFILE = "prefill";

export const approxPrefixParams = z.strictObject({
  autoTune: z.boolean().default(true),
  blockSizeTokens: z.number().int().positive().default(16),
  maxPrefixBlocksToMatch: z.number().int().nonnegative().default(2048),
  maxPrefixTokensToMatch: z.number().int().nonnegative().default(131072),
  lruCapacityPerServer: z.number().int().positive().default(31250),
  /**
   * kvgate: count what a request makes the engine allocate beyond its prompt's full blocks — the
   * prompt's tail and the output tokens (ResponseInfo.outputTokens: the gateway then reads each
   * response's usage) — as blocks in its endpoint's LRU, so a prefix leaves the index about when
   * the engine's KV churn evicts it (see #churn). false = llm-d's: prompt blocks only.
   */
  countOutputTokens: z.boolean().default(false),
});
export type ApproxPrefixParams = z.output<typeof approxPrefixParams>;

class MatchInfo extends MapMatchInfo {
  constructor(
    totalBlocks: number,
    blockSizeTokens: number,
    promptTokens: number,
    counts: Map<string, number>,
    /** Per prompt, its block hashes (PackedHashes), for the index to learn after the pick. */
    readonly hashes: PackedHashes[],
  ) {
    super(totalBlocks, blockSizeTokens, promptTokens, counts);
  }
  prefixKey(blocks: number): number | undefined {
    return packedKey(this.hashes[0], blocks);
  }
}

export class ApproxPrefixProducer implements DataProducer, PreRequestHook, ResponseHooks {
  readonly typedName: TypedName;
  readonly wantsResponseUsage: boolean;
  /** countOutputTokens: per endpoint, tokens allocated but not yet a whole block, and its last LRU capacity. */
  readonly #churned = new Map<string, { tokens: number; capacity: number }>();
  /** countOutputTokens: each request in flight's prompt blocks and tail, to free at its end. */
  readonly #held = new Map<string, { hashes: PackedHashes[]; tail: number }>();
  #blockSize = MIN_BLOCK_SIZE_TOKENS;
  /** Synthetic blocks added for churn so far (their hashes: CHURN_HI, then this count). */
  #churnBlocks = 0;
  readonly index = new ApproxPrefixIndex();
  readonly #key: DataKey<PrefixMatchInfo>;
  readonly #roots = new Map<string, bigint>();
  #lastRoot: { model: string; salt: string | undefined; h0: bigint } | null = null;
  readonly #chains = new ChainCache();
  #hitBlocks = 0;
  #lookupBlocks = 0;
  /**
   * Told of every block chain this producer learns from its own decisions (gateway replicas share
   * them with each other: src/scheduler/sync.ts). Null by default: a single gateway pays nothing.
   */
  onLearn: ((endpointId: string, hashes: PackedHashes, capacity: number, blockSize: number) => void) | null =
    null;

  constructor(
    name: string,
    readonly params: ApproxPrefixParams,
    readonly hasher: Hasher,
  ) {
    this.typedName = { type: APPROX_PREFIX_TYPE, name };
    this.#key = prefixKey(name);
    this.wantsResponseUsage = params.countOutputTokens;
  }

  produces(): DataKey<unknown>[] {
    return [this.#key];
  }

  /** Effective block size: endpoint metric under autoTune, else configured; floored at 64. */
  blockSize(endpoints: readonly EndpointState[]): number {
    const p = this.params;
    let bs = p.blockSizeTokens;
    const m = endpoints[0]?.metrics;
    if (p.autoTune && m?.cacheBlockSize !== undefined && m.cacheBlockSize > 0) bs = m.cacheBlockSize;
    return Math.max(bs, MIN_BLOCK_SIZE_TOKENS);
  }

  /** maxPrefixTokensToMatch wins when > 0; both caps 0 means unlimited. */
  maxBlocks(blockSize: number): number {
    const p = this.params;
    if (p.maxPrefixTokensToMatch > 0) return Math.floor(p.maxPrefixTokensToMatch / blockSize);
    return p.maxPrefixBlocksToMatch === 0 ? Number.POSITIVE_INFINITY : p.maxPrefixBlocksToMatch;
  }

  produce(cycle: CycleState, candidates: readonly EndpointState[]): void {
    const req = cycle.request;
    // With the one-call chain hasher nothing keeps the prompt bytes, so they need not be copied.
    const fast = this.hasher.chain !== undefined;
    const fp = fast ? transientPrompt(cycle, this.hasher) : flatPrompt(cycle, this.hasher);
    const bs = this.blockSize(candidates);
    const maxBlocks = this.maxBlocks(bs);
    const h0 = this.#root(req.model, req.cacheSalt);
    const perPrompt: PackedHashes[] = [];
    let counts: Map<string, number> | null = null;
    let total = 0;
    for (const seg of fp.segments) {
      // The one-call chain hasher rehashes a block faster than the chain cache compares it.
      const hashes = chainHashesPacked(this.hasher, h0, seg, bs, maxBlocks, fast ? null : this.#chains);
      perPrompt.push(hashes);
      total += hashes.length >>> 1;
      const m = this.index.matchPacked(hashes).counts;
      if (counts === null) counts = m;
      else for (const [id, n] of m) counts.set(id, (counts.get(id) ?? 0) + n);
    }
    cycle.set(this.#key, new MatchInfo(total, bs, fp.tokenCount, counts ?? new Map(), perPrompt));
  }

  preRequest(cycle: CycleState, result: ScheduleResult): void {
    const info = cycle.get(this.#key) as MatchInfo | undefined;
    const primary = result.target;
    if (info === undefined || primary === null) return;
    const targets = [primary];
    const prefill = result.profiles[PREFILL_PROFILE]?.target;
    if (prefill && prefill.id !== primary.id) targets.push(prefill);
    const tail = Math.max(0, info.promptTokens - info.totalBlocks * info.blockSizeTokens);
    for (const t of targets) {
      const cap = this.capacity(t, info.blockSizeTokens);
      for (const hashes of info.hashes) {
        this.index.addPacked(t.id, hashes, cap);
        this.onLearn?.(t.id, hashes, cap, info.blockSizeTokens);
      }
      if (this.params.countOutputTokens) {
        this.#blockSize = info.blockSizeTokens;
        this.#churn(t.id, 0, cap);
      }
    }
    if (this.params.countOutputTokens) this.#held.set(result.requestId, { hashes: info.hashes, tail });
    this.#hitBlocks += info.matchBlocks(primary.id);
    this.#lookupBlocks += info.totalBlocks;
  }

  /**
   * LRU capacity in index blocks: under autoTune the endpoint's GPU plus CPU KV blocks
   * (cache_config_info num_gpu_blocks + num_cpu_blocks) converted to this index's block size. llm-d
   * counts GPU blocks only (llm-d-router#1650: with offload on, scores run low) and uses the raw
   * count, overstating capacity when blocks are coarser. Limitation: vLLM's OffloadingConnector does
   * not report its CPU size in blocks (num_cpu_blocks stays "None"), so with it autoTune still sees
   * the GPU pool only; give a CPU index its own producer with autoTune false and
   * lruCapacityPerServer = CPU bytes / bytes per block, as llm-d's tiered-prefix-cache guide does.
   * Otherwise lruCapacityPerServer.
   */
  capacity(ep: EndpointState, blockSize: number): number {
    const m = ep.metrics;
    if (this.params.autoTune && m?.cacheNumBlocks !== undefined && m.cacheNumBlocks > 0) {
      const vllmBlock = m.cacheBlockSize !== undefined && m.cacheBlockSize > 0 ? m.cacheBlockSize : blockSize;
      const blocks = m.cacheNumBlocks + (m.cacheNumCpuBlocks ?? 0);
      return Math.max(1, Math.floor((blocks * vllmBlock) / blockSize));
    }
    return this.params.lruCapacityPerServer;
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    this.index.retain(pool);
    for (const id of [...this.#churned.keys()]) if (!pool.has(id)) this.#churned.delete(id);
  }

  onResponseComplete(req: RequestFacts, endpointId: string, _now: number, info?: ResponseInfo): void {
    if (!this.params.countOutputTokens) return;
    const held = this.#held.get(req.requestId);
    this.#held.delete(req.requestId);
    const c = this.#churned.get(endpointId);
    if (held === undefined || c === undefined) return;
    // Freed now: the engine puts a finished request's blocks at the young end of its LRU, and
    // until then they were held (never evicted) however long it decoded.
    for (const hashes of held.hashes) this.index.addPacked(endpointId, hashes, c.capacity);
    this.#churn(endpointId, held.tail + Math.max(0, info?.outputTokens ?? 0), c.capacity);
  }

  /**
   * The engine frees a finished request's blocks to the tail of its LRU free queue and takes every
   * new block from the head, so each block it allocates — prompt or output, 16 tokens in vLLM — ages
   * every cached prefix. The index, learning only its picks' full prompt blocks (≥ 64 tokens each),
   * ages them far slower: on mixed-length, where a 40-token question with a 200-token answer adds no
   * index block at all, a 50,000-token document stayed in the index after the engine had evicted
   * it, and the affinity filter kept sending its next request to a replica that prefilled it cold
   * beside the documents it was decoding. So those tokens enter the endpoint's LRU too, as blocks
   * of unique hashes no prompt matches, once they add up to a whole index block.
   */
  #churn(endpointId: string, tokens: number, capacity: number): void {
    let c = this.#churned.get(endpointId);
    if (c === undefined) {
      c = { tokens: 0, capacity };
      this.#churned.set(endpointId, c);
    }
    c.capacity = capacity;
    c.tokens += tokens;
    const bs = this.#blockSize;
    const n = Math.floor(c.tokens / bs);
    if (n <= 0) return;
    c.tokens -= n * bs;
    const packed = new Array<number>(2 * n);
    for (let i = 0; i < n; i++) {
      const k = this.#churnBlocks++;
      packed[2 * i] = Math.imul(k, CHURN_SPREAD);
      packed[2 * i + 1] = CHURN_HI + Math.floor(k / 2 ** 32);
    }
    this.index.addPacked(endpointId, packed, capacity);
  }

  /** Requests in flight whose blocks are kept to free at their end (countOutputTokens). */
  get heldRequests(): number {
    return this.#held.size;
  }

  stats(): PluginStats {
    return {
      indexSize: this.index.size,
      distinctBlocks: this.index.distinctBlocks,
      endpoints: this.index.endpointCount,
      hitBlocks: this.#hitBlocks,
      lookupBlocks: this.#lookupBlocks,
      hitRatio: this.#lookupBlocks === 0 ? 0 : this.#hitBlocks / this.#lookupBlocks,
      hashCacheHits: this.#chains.hits,
      hashCacheReusedBlocks: this.#chains.reusedBlocks,
    };
  }

  #root(model: string, salt: string | undefined): bigint {
    const last = this.#lastRoot;
    if (last !== null && last.model === model && last.salt === salt) return last.h0;
    const h0 = this.#rootOf(model, salt);
    this.#lastRoot = { model, salt, h0 };
    return h0;
  }

  #rootOf(model: string, salt: string | undefined): bigint {
    const k = `${model}\u0000${salt ?? ""}`;
    let h = this.#roots.get(k);
    if (h === undefined) {
      h = rootHash(this.hasher, model, salt);
      if (this.#roots.size >= 1024) this.#roots.clear();
      this.#roots.set(k, h);
    }
    return h;
  }
}

export const approxPrefixSpec = spec({
  type: APPROX_PREFIX_TYPE,
  stability: "stable",
  kind: "producer",
  summary: "Approximate prefix index learned from routing decisions; writes prefix match info.",
  params: approxPrefixParams,
  produces: ["prefix-match-info"],
  factory: (name, params, handle: PluginHandle) => {
    if (handle.hasher === null) throw new Error(`${APPROX_PREFIX_TYPE} "${name}" needs a hasher`);
    return new ApproxPrefixProducer(name, params, handle.hasher);
  },
});
