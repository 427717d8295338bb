/**
 * bench:picker, precise half: what a precise-prefix config needs that an approximate one does not.
 * - Token ids: the gateway tokenizes before schedule(), so the timed decision gets RequestFacts.tokenIds.
 *   Here the chat prompt's flattened bytes are cut into 4-byte pseudo-tokens (the approximate path's
 *   unit) and each is mapped to an id below 200,003, a vocabulary-sized range. Done before the timer.
 * - A warm index built the way the gateway builds it: after each pick, the chosen endpoint's simulated
 *   engine stores the prompt's blocks it lacks and announces them with vLLM's BlockStored (per-replica
 *   engine hashes, parent = the last cached block's hash), evicting least-recently-used blocks
 *   (BlockRemoved) beyond its KV pool; the batch is msgpack-encoded as vLLM sends it and, a delivery lag
 *   later, decoded and applied as the KV-events subscriber does. All outside the timed calls.
 * - The approximate twin: the same config with the precise producer swapped for the approximate one
 *   (same name, so the consumers are unchanged): the ratio precise / twin isolates the producer.
 */
import { parseAllDocuments, stringify } from "yaml";
import { BlockKeyer, xxh64BlockHasher } from "../kv/block-keys.ts";
import { encodeEventBatch } from "../kv/event-encode.ts";
import type { KVEvent } from "../kv/events.ts";
import { decodeEventBatchFast } from "../kv/precise-decode.ts";
import type { PreciseIndex } from "../kv/precise-index.ts";
import type { Hasher } from "../scheduler/hash.ts";
import { PrecisePrefixProducer } from "../scheduler/plugins/precise-prefix-cache-producer.ts";
import { flattenChat } from "../scheduler/plugins/prefix/hashing.ts";
import type { EndpointState, RequestFacts, ScheduleResult } from "../scheduler/types.ts";
import type { RequestSpec, Workload } from "./picker-decision.ts";

const VOCAB = 200_003;

/** A workload whose requests carry token ids, as the gateway hands them to the scheduler in precise mode. */
export class TokenizedWorkload implements Workload {
  constructor(readonly inner: Workload) {}

  materialize(spec: RequestSpec): RequestFacts {
    const req = this.inner.materialize(spec);
    if (req.prompt.kind !== "chat") return req;
    const bytes = flattenChat(req.prompt.messages, req.prompt.tools, null);
    const n = bytes.length >>> 2;
    const view = new DataView(bytes.buffer, bytes.byteOffset, n * 4);
    // Built by push: a packed array of small integers, as a tokenizer's output is (not a holey one).
    const ids: number[] = [];
    for (let i = 0; i < n; i++) ids.push((view.getUint32(4 * i, true) % VOCAB) | 0);
    req.tokenIds = ids;
    return req;
  }
}

/** The scheduler's precise producers' indexes (what the gateway's KV-event subscribers feed). */
export function preciseIndexes(plugins: Iterable<unknown>): PreciseIndex[] {
  const out: PreciseIndex[] = [];
  for (const p of plugins) if (p instanceof PrecisePrefixProducer) out.push(p.index);
  return out;
}

/**
 * `configText` with every precise-prefix-cache-producer replaced by an approx-prefix-cache-producer of
 * the same name (default parameters); null when the config has none.
 */
export function approximateTwin(configText: string): string | null {
  const docs = parseAllDocuments(configText).map((d) => d.toJS() as Record<string, unknown>);
  let swapped = false;
  for (const d of docs) {
    const plugins = d?.plugins as { type: string; name?: string; parameters?: unknown }[] | undefined;
    for (const p of plugins ?? []) {
      if (p.type !== "precise-prefix-cache-producer") continue;
      p.type = "approx-prefix-cache-producer";
      p.name ??= "precise-prefix-cache-producer";
      delete p.parameters;
      swapped = true;
    }
  }
  return swapped ? docs.map((d) => stringify(d)).join("---\n") : null;
}

interface Replica {
  /** Block key (low 52 bits) → engine hash; Map order is the LRU order (first = least recent). */
  blocks: Map<number, bigint>;
}

/**
 * Simulated vLLM engines behind the endpoints, and the KV-event path from them into the indexes.
 * Block identity is a key over token ids (the bench's own keyer); engine hashes are per-replica
 * counters with the top bit set, as unrelated to the index's keys as vLLM's are.
 */
export class KvEventFeed {
  readonly #replicas = new Map<string, Replica>();
  readonly #pending: { at: number; endpoint: string; bytes: Uint8Array }[] = [];
  #head = 0;
  #seq = 0n;
  readonly #keyer: BlockKeyer;
  batches = 0;
  stored = 0;
  removed = 0;

  constructor(
    readonly indexes: readonly PreciseIndex[],
    hasher: Hasher,
    readonly opts: { blockSize: number; capacityBlocks: number; lagSeconds: number; model: string },
  ) {
    this.#keyer = new BlockKeyer({ hasher: xxh64BlockHasher(hasher), blockSize: opts.blockSize });
  }

  /** Tells the indexes which model each endpoint serves (the subscriber reads it from the topic). */
  register(endpoints: readonly EndpointState[]): void {
    for (const ix of this.indexes) for (const e of endpoints) ix.setEndpointModel(e.id, this.opts.model);
  }

  /** The pick's engine runs the prompt: its new blocks are stored, announced, and old ones evicted. */
  picked(req: RequestFacts, result: ScheduleResult, now: number): void {
    const target = result.target;
    const tokens = req.tokenIds;
    if (target === null || tokens === undefined) return;
    let rep = this.#replicas.get(target.id);
    if (rep === undefined) this.#replicas.set(target.id, (rep = { blocks: new Map() }));
    const B = this.opts.blockSize;
    const keys = this.#keyer.keys(tokens, req.model, req.cacheSalt);
    const ids = Array.from(keys, (k) => Number(k & 0xfffffffffffffn));
    let first = 0;
    while (first < ids.length && rep.blocks.has(ids[first])) first++;
    const events: KVEvent[] = [];
    if (first < ids.length) {
      const hashes: bigint[] = [];
      for (let i = first; i < ids.length; i++) hashes.push((1n << 63n) | ++this.#seq);
      events.push({
        type: "BlockStored",
        blockHashes: hashes,
        parentBlockHash: first === 0 ? null : (rep.blocks.get(ids[first - 1]) as bigint),
        tokenIds: tokens.slice(first * B, ids.length * B),
        blockSize: B,
        loraId: null,
        medium: "GPU",
        loraName: null,
        extraKeys: hashes.map(() => null),
        groupIdx: 0,
        kvCacheSpecKind: "full_attention",
        kvCacheSpecSlidingWindow: null,
      });
      for (let i = first; i < ids.length; i++) rep.blocks.set(ids[i], hashes[i - first]);
      this.stored += hashes.length;
    }
    // Touch last-first, so block 0 is the most recent: vLLM frees a request's blocks tail first.
    for (let i = first - 1; i >= 0; i--) {
      const h = rep.blocks.get(ids[i]) as bigint;
      rep.blocks.delete(ids[i]);
      rep.blocks.set(ids[i], h);
    }
    if (rep.blocks.size > this.opts.capacityBlocks) {
      const victims: bigint[] = [];
      for (const [k, h] of rep.blocks) {
        if (rep.blocks.size <= this.opts.capacityBlocks) break;
        rep.blocks.delete(k);
        victims.push(h);
      }
      events.push({ type: "BlockRemoved", blockHashes: victims, medium: "GPU", groupIdx: 0 });
      this.removed += victims.length;
    }
    if (events.length === 0) return;
    const bytes = encodeEventBatch({ ts: now, events, dataParallelRank: null }, "array");
    this.#pending.push({ at: now + this.opts.lagSeconds, endpoint: target.id, bytes });
  }

  /** Delivers every batch due by `now`, in publish order, as the subscriber applies them. */
  deliver(now: number): void {
    const q = this.#pending;
    while (this.#head < q.length && q[this.#head].at <= now) {
      const m = q[this.#head++];
      const batch = decodeEventBatchFast(m.bytes);
      for (const ix of this.indexes) for (const ev of batch.events) ix.applyEvent(m.endpoint, ev);
      this.batches++;
    }
    if (this.#head > 1024) {
      q.splice(0, this.#head);
      this.#head = 0;
    }
  }
}
