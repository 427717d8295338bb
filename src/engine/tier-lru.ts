/**
 * LRU eviction shared by the offload tiers (cpu-tier.ts, storage-tier.ts): which chunks to drop so
 * `n` more fit. A Map iterates in insertion order and the tiers re-insert a chunk on every hit, so
 * the first entries are the least recently used. A chunk still being written (readyAt > now) or
 * pinned by a load in flight stays.
 */
export interface EvictableChunk {
  readyAt: number;
  pins: number;
}

/** Keys to evict, oldest first, so that `n` chunks fit in `capacity`; null when they cannot. */
export function lruVictims<C extends EvictableChunk>(
  chunks: ReadonlyMap<string, C>,
  capacity: number,
  n: number,
  now: number,
): string[] | null {
  let free = capacity - chunks.size;
  const victims: string[] = [];
  for (const [k, c] of chunks) {
    if (free >= n) break;
    if (c.pins > 0 || c.readyAt > now) continue;
    victims.push(k);
    free++;
  }
  return free >= n ? victims : null;
}
