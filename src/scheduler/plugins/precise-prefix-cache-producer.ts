/**
 * precise-prefix-cache-producer (llm-d type name, llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/`): prefix match info
 * from what each endpoint actually holds, per vLLM's KV-cache events, instead of kvgate's own routing
 * history. It owns a PreciseIndex (src/kv/precise-index.ts); the data layer feeds it by connecting a
 * KvEventsSubscriber (src/datalayer/kv-events-subscriber.ts) to `producer.index`, per endpoint, using
 * `producer.kvEvents` (topic filter and ports).
 *
 * Per request it computes the request keys of `RequestFacts.tokenIds` (the gateway tokenizes; the keys
 * are kvgate's own xxh64 chain over token ids, seeded with the request's model and cache_salt, see
 * src/kv/block-keys.ts) and writes the same PrefixMatchInfo datum as approx-prefix-cache-producer, so
 * prefix-cache-scorer and the other consumers read it unchanged:
 *   matchBlocks(e) = LongestPrefix score of e = Σ over e's consecutive blocks from block 0 of the block's
 *                    best tier weight (kvCacheBackendConfigs: gpu 1.0, cpu 0.8), so a CPU-tier block
 *                    counts 0.8 everywhere matchBlocks is used; heldBlocks(e) is the plain count.
 *   totalBlocks = full blocks of the prompt; blockSizeTokens = the configured block size (no 64 floor:
 *                 keys must align with vLLM's blocks, so it must equal the engines' block size).
 * Without tokenIds it writes nothing: prefix-cache-scorer then scores 0 for every endpoint.
 * With speculativeIndexing, PreRequest adds the request's keys to the chosen endpoint (and the prefill
 * profile's) as speculative entries for speculativeTTL, so a burst of same-prefix requests lands together
 * before the engine's first BlockStored arrives. kvgate's speculativeScope "cold" speculates only for a
 * request no candidate holds any block of (a new prefix); a request with a home already is indexed by
 * its engine's events alone (on multi-turn, speculating every turn cost precise 6–12% TTFT p99).
 * tokenProcessorConfig.hashSeed / hashAlgorithm are accepted for llm-d config compatibility and change
 * nothing: kvgate's keys are only compared with themselves (engine hashes are mapped, not recomputed).
 */
import { z } from "zod";
import { parseDuration } from "../../flow/duration.ts";
import { BlockKeyer, type PackedKeys, xxh64BlockHasher } from "../../kv/block-keys.ts";
import { PreciseIndex } from "../../kv/precise-index.ts";
import { MAX_ENTRIES } from "../../kv/precise-store.ts";
import { ConfigError } from "../errors.ts";
import type { Hasher } from "../hash.ts";
import type { PluginHandle } from "../plugin-spec.ts";
import { spec } from "../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  DataProducer,
  EndpointState,
  PluginStats,
  PreRequestHook,
  ScheduleResult,
  TypedName,
} from "../types.ts";
import type { PrefixMatchInfo } from "./data.ts";
import { MapMatchInfo, packedKey, prefixKey } from "./data.ts";

export const PRECISE_PREFIX_TYPE = "precise-prefix-cache-producer";
const PREFILL_PROFILE = "prefill";

const duration = z
  .string()
  .refine((s) => parseDuration(s) !== null, { message: 'expected a duration such as "2s" or "500ms"' });
const port = z.number().int().min(1).max(65535);

const backendConfigs = z
  .array(z.strictObject({ name: z.string().min(1), weight: z.number().min(0) }))
  .min(1)
  .max(6);
const DEFAULT_BACKENDS = [
  { name: "gpu", weight: 1.0 },
  { name: "cpu", weight: 0.8 },
];

/**
 * Load bandwidths for timeSavedScoring, bytes/s, by tier: cpu 25 GB/s (PCIe Gen4 ×16, 31.5 GB/s
 * theoretical per direction, about 25 practical; Gen5 hosts reach about 50), shared_storage and
 * storage 10 GB/s (the cloud storage of llm-d's 2026-02-09 file-system offload blog), disk 7 GB/s
 * (one NVMe Gen4 drive's sequential read).
 */
export const DEFAULT_TIER_BANDWIDTHS = [
  { name: "cpu", bytesPerSecond: 25e9 },
  { name: "shared_storage", bytesPerSecond: 10e9 },
  { name: "storage", bytesPerSecond: 10e9 },
  { name: "disk", bytesPerSecond: 7e9 },
];

export const precisePrefixParams = z.strictObject({
  blockSizeTokens: z.number().int().positive().default(16),
  tokenProcessorConfig: z
    .strictObject({
      /** Wins over the top-level blockSizeTokens when set. */
      blockSizeTokens: z.number().int().positive().optional(),
      hashSeed: z.string().optional(),
      hashAlgorithm: z.enum(["cbor-fnv", "xxh64"]).optional(),
    })
    .optional(),
  /** llm-d's location of the tier weights (llm-d-kv-cache `pkg/kvcache/indexer.go`); its other keys are accepted and change nothing. */
  indexerConfig: z.looseObject({ kvCacheBackendConfigs: backendConfigs.optional() }).optional(),
  /** The same list at the top level (kvgate's older spelling); indexerConfig's wins when both are set. */
  kvCacheBackendConfigs: backendConfigs.optional(),
  /** kvgate-only: tiers every endpoint of the pool reaches (e.g. ["shared_storage"]); each needs a weight. */
  sharedStorageTiers: z.array(z.string().min(1)).max(5).default([]),
  /** kvgate-only: placeholder offload events held until their GPU event arrives, at most this many. */
  maxHeldPlaceholders: z.number().int().nonnegative().default(65536),
  /**
   * kvgate-only: the offload connector's block size in tokens, for placeholder events that say
   * block_size 0 (newer vLLM); default = blockSizeTokens (vLLM's native connector default).
   */
  offloadBlockSizeTokens: z.number().int().positive().optional(),
  /**
   * kvgate-only: score a tier's block by the prefill time it saves instead of a fixed weight:
   * weight(tier) = (recompute − load) / recompute = 1 − prefillTokensPerSecond · kvBytesPerToken /
   * bytesPerSecond(tier), floored at 0 (a tier slower than recompute counts as a miss); gpu = 1.
   * Defaults: prefillTokensPerSecond 15928 (llm-d's prefix-cache-affinity-filter
   * peakPrefillThroughput default), kvBytesPerToken 131072 (Llama-3.1-8B in bf16: 2 × 32 layers × 8
   * KV heads × 128 × 2 bytes), tierBandwidths DEFAULT_TIER_BANDWIDTHS. One rate for the pool: kvgate
   * has no per-endpoint prefill-rate signal.
   */
  timeSavedScoring: z
    .strictObject({
      prefillTokensPerSecond: z.number().positive().default(15928),
      kvBytesPerToken: z.number().positive().default(131072),
      tierBandwidths: z
        .array(z.strictObject({ name: z.string().min(1), bytesPerSecond: z.number().positive() }))
        .default(DEFAULT_TIER_BANDWIDTHS),
    })
    .optional(),
  speculativeIndexing: z.boolean().default(false),
  speculativeTTL: duration.default("2s"),
  /** kvgate-only: "all" (llm-d) speculates every request's keys, "cold" only a request no candidate holds a block of. */
  speculativeScope: z.enum(["all", "cold"]).default("all"),
  /** kvgate-only: hard budget of (block, endpoint) entries in the index (about 80 bytes each). */
  maxIndexEntries: z
    .number()
    .int()
    .positive()
    .max(MAX_ENTRIES - 1)
    .default(4_000_000),
  kvEventsConfig: z
    .strictObject({
      topicFilter: z.string().default("kv@"),
      /** llm-d's; accepted, no effect: kvgate decodes vLLM's events on one event loop, per endpoint. */
      engineType: z.literal("vllm").optional(),
      concurrency: z.number().int().positive().optional(),
      discoverPods: z.literal(true).optional(),
      podDiscoveryConfig: z
        .strictObject({ socketPort: port.default(5557), replaySocketPort: port.optional() })
        .default({ socketPort: 5557 }),
    })
    .default({ topicFilter: "kv@", podDiscoveryConfig: { socketPort: 5557 } }),
});
export type PrecisePrefixParams = z.output<typeof precisePrefixParams>;

/** The prefix-match-info datum; matchBlocks is the tier-weighted LongestPrefix score. */
export class PreciseMatchInfo extends MapMatchInfo {
  constructor(
    totalBlocks: number,
    blockSizeTokens: number,
    promptTokens: number,
    /** Endpoints with a match: weighted score (matchBlocks) and plain block count (heldBlocks). */
    scores: Map<string, number>,
    readonly held: Map<string, number>,
    /** The request's block keys (PackedKeys), for speculative indexing after the pick. */
    readonly keys: PackedKeys,
  ) {
    super(totalBlocks, blockSizeTokens, promptTokens, scores);
  }
  prefixKey(blocks: number): number | undefined {
    return packedKey(this.keys, blocks);
  }
  /** Consecutive blocks from block 0 the endpoint holds on any weighted tier, unweighted. */
  heldBlocks(endpointId: string): number {
    return this.held.get(endpointId) ?? 0;
  }
}

export class PrecisePrefixProducer implements DataProducer, PreRequestHook {
  readonly typedName: TypedName;
  /** Feed this from the endpoints' KV events (KvEventsSubscriber). */
  readonly index: PreciseIndex;
  readonly blockSizeTokens: number;
  /** Weight per tier (lowercase), from kvCacheBackendConfigs or timeSavedScoring. */
  readonly tierWeights: Record<string, number>;
  /** What the data layer needs to subscribe: `tcp://<endpoint host>:<socketPort>`, replay on replaySocketPort. */
  readonly kvEvents: { topicFilter: string; socketPort: number; replaySocketPort: number | null };
  readonly #key: DataKey<PrefixMatchInfo>;
  readonly #speculativeTtl: number;
  /**
   * Called for each speculative entry this gateway adds after a pick (src/scheduler/sync.ts sends
   * them to its peers). `keys` is only valid during the call: copy what is kept.
   */
  onSpeculate: ((endpointId: string, keys: PackedKeys, ttlSeconds: number) => void) | null = null;
  #requests = 0;
  #withoutTokens = 0;
  #hitBlocks = 0;
  #lookupBlocks = 0;
  /** The last candidate list's endpoint numbers (index.resolve), reused while the list and the index's endpoints are unchanged. */
  #candidates: readonly EndpointState[] = [];
  #eps: Int32Array = new Int32Array(0);
  #epsVersion = -1;

  constructor(
    name: string,
    readonly params: PrecisePrefixParams,
    hasher: Hasher,
  ) {
    this.typedName = { type: PRECISE_PREFIX_TYPE, name };
    this.#key = prefixKey(name);
    this.blockSizeTokens = params.tokenProcessorConfig?.blockSizeTokens ?? params.blockSizeTokens;
    this.#speculativeTtl = parseDuration(params.speculativeTTL) as number;
    this.tierWeights = tierWeights(name, params);
    const off = params.offloadBlockSizeTokens ?? this.blockSizeTokens;
    if (off % this.blockSizeTokens !== 0)
      throw new ConfigError(
        `${PRECISE_PREFIX_TYPE} "${name}": offloadBlockSizeTokens ${off} is not a multiple of the block size ${this.blockSizeTokens}; set it to the offload connector's block_size`,
      );
    this.index = new PreciseIndex({
      keyer: new BlockKeyer({ hasher: xxh64BlockHasher(hasher), blockSize: this.blockSizeTokens }),
      maxEntries: params.maxIndexEntries,
      tierWeights: this.tierWeights,
      sharedTiers: params.sharedStorageTiers,
      maxHeldPlaceholders: params.maxHeldPlaceholders,
      placeholderSpan: off / this.blockSizeTokens,
      speculativeTtl: this.#speculativeTtl,
    });
    const pd = params.kvEventsConfig.podDiscoveryConfig;
    this.kvEvents = {
      topicFilter: params.kvEventsConfig.topicFilter,
      socketPort: pd.socketPort,
      replaySocketPort: pd.replaySocketPort ?? null,
    };
  }

  produces(): DataKey<unknown>[] {
    return [this.#key];
  }

  produce(cycle: CycleState, candidates: readonly EndpointState[]): void {
    const req = cycle.request;
    this.#requests++;
    if (req.tokenIds === undefined) {
      this.#withoutTokens++;
      return;
    }
    const keys = this.index.keyer.packedKeys(req.tokenIds, req.model, req.cacheSalt);
    const scores = new Map<string, number>();
    const held = new Map<string, number>();
    if (keys.length > 0 && candidates.length > 0) {
      const r = this.index.match(keys, this.#resolve(candidates), cycle.now);
      for (let i = 0; i < r.count; i++) {
        const id = candidates[r.pos[i]].id;
        scores.set(id, r.scores[i]);
        held.set(id, r.blocks[i]);
      }
    }
    cycle.set(
      this.#key,
      new PreciseMatchInfo(keys.length >>> 1, this.blockSizeTokens, req.tokenIds.length, scores, held, keys),
    );
  }

  /** The candidates' endpoint numbers in the index; re-resolved only when the list holds other objects or the index's endpoints changed. */
  #resolve(candidates: readonly EndpointState[]): Int32Array {
    const last = this.#candidates;
    const n = candidates.length;
    let same = n === last.length && this.#epsVersion === this.index.endpointsVersion;
    for (let i = 0; same && i < n; i++) same = candidates[i] === last[i];
    if (!same) {
      this.#eps = this.index.resolve(candidates.map((c) => c.id));
      this.#candidates = candidates.slice();
      this.#epsVersion = this.index.endpointsVersion;
    }
    return this.#eps;
  }

  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void {
    const info = cycle.get(this.#key) as PreciseMatchInfo | undefined;
    const primary = result.target;
    if (info === undefined || primary === null) return;
    this.#hitBlocks += info.heldBlocks(primary.id);
    this.#lookupBlocks += info.totalBlocks;
    if (!this.params.speculativeIndexing || info.keys.length === 0) return;
    if (this.params.speculativeScope === "cold" && info.anyMatch) return;
    this.index.addSpeculative(primary.id, info.keys, now, this.#speculativeTtl);
    this.onSpeculate?.(primary.id, info.keys, this.#speculativeTtl);
    const prefill = result.profiles[PREFILL_PROFILE]?.target;
    if (prefill && prefill.id !== primary.id) {
      this.index.addSpeculative(prefill.id, info.keys, now, this.#speculativeTtl);
      this.onSpeculate?.(prefill.id, info.keys, this.#speculativeTtl);
    }
  }

  /** Endpoints that left the pool are dropped from the index at once. */
  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const id of this.index.endpointIds()) if (!pool.has(id)) this.index.removeEndpoint(id);
  }

  stats(): PluginStats {
    const s = this.index.stats();
    return {
      indexEntries: s.entries,
      indexKeys: s.keys,
      indexBytes: s.bytes,
      indexBytesPerEntry: s.bytesPerEntry,
      endpoints: s.endpoints,
      evictions: s.evictions,
      unknownParent: s.unknownParent,
      removedUnknown: s.removedUnknown,
      unknownMedium: s.unknownMedium,
      placeholdersHeld: this.index.heldPlaceholders,
      placeholderResolved: s.placeholderResolved,
      placeholderDropped: s.placeholderDropped,
      speculativeAdded: s.speculativeAdded,
      speculativeConfirmed: s.speculativeConfirmed,
      speculativeExpired: s.speculativeExpired,
      requests: this.#requests,
      requestsWithoutTokens: this.#withoutTokens,
      hitBlocks: this.#hitBlocks,
      lookupBlocks: this.#lookupBlocks,
      hitRatio: this.#lookupBlocks === 0 ? 0 : this.#hitBlocks / this.#lookupBlocks,
    };
  }
}

/**
 * The tier weights: kvCacheBackendConfigs (indexerConfig's, else the top-level list, else gpu 1.0,
 * cpu 0.8), or under timeSavedScoring the time each tier saves. Names are case-insensitive; a
 * duplicate, a missing gpu, a shared tier without a weight or (timeSavedScoring) a tier without a
 * bandwidth is a ConfigError.
 */
function tierWeights(name: string, p: PrecisePrefixParams): Record<string, number> {
  const who = `${PRECISE_PREFIX_TYPE} "${name}"`;
  const list = p.indexerConfig?.kvCacheBackendConfigs ?? p.kvCacheBackendConfigs ?? DEFAULT_BACKENDS;
  const out: Record<string, number> = {};
  for (const b of list) {
    const k = b.name.toLowerCase();
    if (k in out)
      throw new ConfigError(
        `${who}: kvCacheBackendConfigs lists "${b.name}" twice (names are case-insensitive); keep one`,
      );
    out[k] = b.weight;
  }
  if (!("gpu" in out))
    throw new ConfigError(
      `${who}: kvCacheBackendConfigs has no "gpu" entry; add {name: gpu, weight: 1.0} (events without a medium are GPU events)`,
    );
  for (const t of p.sharedStorageTiers)
    if (t.toLowerCase() === "gpu")
      throw new ConfigError(`${who}: sharedStorageTiers cannot name gpu (each replica's HBM is its own)`);
    else if (!(t.toLowerCase() in out))
      throw new ConfigError(
        `${who}: sharedStorageTiers names "${t}", which kvCacheBackendConfigs does not weigh; add {name: ${t}, weight: …} there`,
      );
  const ts = p.timeSavedScoring;
  if (ts === undefined) return out;
  const bw = new Map(ts.tierBandwidths.map((b) => [b.name.toLowerCase(), b.bytesPerSecond]));
  const perToken = ts.prefillTokensPerSecond * ts.kvBytesPerToken;
  for (const k of Object.keys(out)) {
    if (k === "gpu") {
      out[k] = 1;
      continue;
    }
    const b = bw.get(k);
    if (b === undefined)
      throw new ConfigError(
        `${who}: timeSavedScoring has no bandwidth for tier "${k}"; add {name: ${k}, bytesPerSecond: …} to tierBandwidths`,
      );
    out[k] = Math.max(0, 1 - perToken / b);
  }
  return out;
}

export const precisePrefixSpec = spec({
  type: PRECISE_PREFIX_TYPE,
  stability: "alpha",
  kind: "producer",
  summary: "Prefix match info from the endpoints' KV-cache events (ZMQ); needs RequestFacts.tokenIds.",
  params: precisePrefixParams,
  produces: ["prefix-match-info"],
  unsupportedParams: {
    tokenizersPoolConfig: "kvgate tokenizes in the gateway and passes RequestFacts.tokenIds",
  },
  factory: (name, params, handle: PluginHandle) => {
    const hasher = handle.hasher;
    if (hasher === null) throw new Error(`${PRECISE_PREFIX_TYPE} "${name}" needs a hasher`);
    return new PrecisePrefixProducer(name, params, hasher);
  },
});
