/**
 * A P/D producer's held KV blocks: the blocks of finished remoteDecode prefills, kept (still
 * referenced, so counted in KV-cache usage and never evicted) until the consumer has read them, a
 * release notification arrives, or their lease (kv-lease.ts) runs out — vLLM NixlConnector's
 * `_reqs_need_send` on the prefill side. Pure: `now` is passed in.
 */
import type { BlockPool } from "./block-pool.ts";
import { KvLeases } from "./kv-lease.ts";

interface Held {
  blocks: number[];
  tokens: number;
}

export class HeldKv {
  readonly leases: KvLeases;
  private readonly held = new Map<string, Held>();
  private numBlocks = 0;

  constructor(
    private readonly pool: BlockPool,
    leaseDuration?: number,
  ) {
    this.leases = new KvLeases(leaseDuration);
  }

  /** Takes ownership of `blocks` (one reference each) for request `id`, leased from `now`. */
  hold(id: string, blocks: number[], tokens: number, now: number): void {
    this.release(id);
    this.held.set(id, { blocks, tokens });
    this.numBlocks += blocks.length;
    this.leases.grant(id, now);
  }

  /** Frees the blocks held for `id`. False if none are. */
  release(id: string): boolean {
    const h = this.held.get(id);
    if (h === undefined) return false;
    this.held.delete(id);
    this.leases.delete(id);
    this.numBlocks -= h.blocks.length;
    this.pool.freeReversed(h.blocks);
    return true;
  }

  /** Frees every hold whose lease ran out at or before `now`; returns their ids. */
  expire(now: number): string[] {
    const ids = this.leases.takeExpired(now);
    for (const id of ids) this.release(id);
    return ids;
  }

  has(id: string): boolean {
    return this.held.has(id);
  }

  /** The blocks and tokens held for `id` (the caller must not modify them), or undefined. */
  get(id: string): Readonly<Held> | undefined {
    return this.held.get(id);
  }

  ids(): string[] {
    return [...this.held.keys()];
  }

  get size(): number {
    return this.held.size;
  }

  get blockCount(): number {
    return this.numBlocks;
  }

  /** Adds one reference per held block into `refs` (for invariant checks). */
  countRefs(refs: Int32Array): void {
    for (const h of this.held.values()) for (const b of h.blocks) refs[b]++;
  }
}
