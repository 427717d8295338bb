/**
 * Hot prefixes for prefix-cache-affinity-filter's `spreadHotPrefixes` (kvgate): how fast requests
 * arrive for each prefix, against how fast the pool picks each endpoint. Sticky routing sends every
 * request of a prefix to the endpoints that hold it, so one popular prefix (a system prompt most
 * requests share) lands on one replica while the rest of the fleet idles. A prefix is hot while the
 * requests sent to the endpoints holding it — its own and the other prefixes homed there — exceed
 * their fair shares (the pool's requests per endpoint) by more than `margin` of one share; the
 * filter then lets the request go to an endpoint without it, which becomes one more home.
 *
 * A prefix is named by the hash of its last block, at each power-of-two depth (1, 2, 4, … blocks) up
 * to the part of the prompt that makes its homes sticky, and judged at the deepest of them: requests
 * that share a system prompt but differ in the length of their question count as one prefix at the
 * depths inside the system prompt, a request whose sticky part runs past a shared system prompt (a
 * long conversation) is judged by its own conversation, and a depth every endpoint holds (a chat
 * template's first block) brings no more than the pool's share per holder, so it is never hot.
 *
 * Rates are counts decayed exponentially with time constant `windowSeconds` (a steady rate r reads
 * r × windowSeconds). Pure: time (seconds) is passed in.
 */

/** A decayed count and when it was last brought up to date. */
interface Decayed {
  n: number;
  at: number;
}

/** Prefixes kept before the ones that have gone quiet are swept out. */
const SWEEP_AT = 4096;

export class PrefixRates {
  readonly #byKey = new Map<number, Decayed>();
  readonly #byEndpoint = new Map<string, Decayed>();
  readonly #all: Decayed = { n: 0, at: 0 };
  #sweepAt = SWEEP_AT;

  constructor(readonly windowSeconds: number) {}

  /** Counts one request of the pool, picked for `endpointId`, at `now`. */
  countPick(endpointId: string, now: number): void {
    this.#decay(this.#all, now);
    this.#all.n += 1;
    this.#bump(this.#byEndpoint, endpointId, now);
  }

  /** The endpoint's decayed count of picks at `now`. */
  picks(endpointId: string, now: number): number {
    return this.#read(this.#byEndpoint, endpointId, now);
  }

  /** Forgets the endpoints that left the pool. */
  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const id of [...this.#byEndpoint.keys()]) if (!pool.has(id)) this.#byEndpoint.delete(id);
  }

  /** The prefix's decayed count of requests at `now` (0 if not tracked). */
  prefix(key: number, now: number): number {
    return this.#read(this.#byKey, key, now);
  }

  /** Counts one request of the prefix `key` at `now`; returns its decayed count. */
  countPrefix(key: number, now: number): number {
    if (!this.#byKey.has(key) && this.#byKey.size >= this.#sweepAt) this.#sweep(now);
    return this.#bump(this.#byKey, key, now);
  }

  /** The pool's decayed count of picks at `now`. */
  requests(now: number): number {
    this.#decay(this.#all, now);
    return this.#all.n;
  }

  /** Prefixes currently tracked. */
  get size(): number {
    return this.#byKey.size;
  }

  /** Adds one to `key`'s decayed count in `m` (created at 0); returns the count. */
  #bump<K>(m: Map<K, Decayed>, key: K, now: number): number {
    let d = m.get(key);
    if (d === undefined) {
      d = { n: 0, at: now };
      m.set(key, d);
    }
    this.#decay(d, now);
    d.n += 1;
    return d.n;
  }

  /** `key`'s decayed count in `m` at `now` (0 if absent). */
  #read<K>(m: Map<K, Decayed>, key: K, now: number): number {
    const d = m.get(key);
    if (d === undefined) return 0;
    this.#decay(d, now);
    return d.n;
  }

  #decay(d: Decayed, now: number): void {
    const dt = now - d.at;
    if (dt > 0) {
      d.n *= Math.exp(-dt / this.windowSeconds);
      d.at = now;
    }
  }

  /** Drops the prefixes whose count has decayed below one request; keeps the map bounded. */
  #sweep(now: number): void {
    for (const [k, d] of this.#byKey) {
      this.#decay(d, now);
      if (d.n < 1) this.#byKey.delete(k);
    }
    this.#sweepAt = Math.max(SWEEP_AT, 2 * this.#byKey.size);
  }
}
