/**
 * Block hash → block id for the approximate prefix index: an open-addressing hash table (linear
 * probing, backward-shift deletion) in one Int32Array of (lo, hi, id) slots. A lookup reads one
 * or two cache lines of the table and allocates nothing; a JS Map keyed by the hash's low bits,
 * with collision chains through the block records, cost several Map operations per new block
 * (learning a cold 8k-token prompt: hundreds). The low half of an xxh64 hash is uniformly
 * distributed, so it is the probe start as it is; keys made up by callers must be spread as well
 * (producer.ts's churn blocks): consecutive low halves fill one run of slots that every other key
 * landing in it probes through.
 */

const EMPTY = -1;
/** int32 fields per slot: lo, hi, block id, unused (16-byte slots, four per cache line). */
const SLOT = 4;

export class BlockTable {
  #t = BlockTable.#alloc(1024);
  #mask = 1023;
  #size = 0;

  static #alloc(slots: number): Int32Array {
    const t = new Int32Array(slots * SLOT);
    for (let i = 2; i < t.length; i += SLOT) t[i] = EMPTY;
    return t;
  }

  get size(): number {
    return this.#size;
  }

  /** The block with hash (lo, hi), or −1. */
  get(lo: number, hi: number): number {
    const t = this.#t;
    const mask = this.#mask;
    for (let i = lo & mask; ; i = (i + 1) & mask) {
      const o = i * SLOT;
      const b = t[o + 2];
      if (b === EMPTY) return EMPTY;
      if (t[o] === lo && t[o + 1] === hi) return b;
    }
  }

  /** Adds (lo, hi) → b; the hash must not be present. */
  add(lo: number, hi: number, b: number): void {
    if ((this.#size + 1) * 2 > this.#mask + 1) this.#grow();
    this.#place(lo, hi, b);
    this.#size++;
  }

  /** Removes the hash (lo, hi) if present. */
  delete(lo: number, hi: number): void {
    const t = this.#t;
    const mask = this.#mask;
    let i = lo & mask;
    for (; ; i = (i + 1) & mask) {
      const o = i * SLOT;
      if (t[o + 2] === EMPTY) return;
      if (t[o] === lo && t[o + 1] === hi) break;
    }
    // Backward shift: pull later slots of the probe run into the hole when their home position
    // does not lie (cyclically) in (hole, slot], so every remaining key stays reachable.
    for (let j = (i + 1) & mask; ; j = (j + 1) & mask) {
      const oj = j * SLOT;
      if (t[oj + 2] === EMPTY) break;
      const home = t[oj] & mask;
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      const oi = i * SLOT;
      t[oi] = t[oj];
      t[oi + 1] = t[oj + 1];
      t[oi + 2] = t[oj + 2];
      i = j;
    }
    t[i * SLOT + 2] = EMPTY;
    this.#size--;
  }

  /** The longest run of occupied slots: the most a lookup can probe (a diagnostic, O(table)). */
  longestRun(): number {
    const t = this.#t;
    const slots = this.#mask + 1;
    let best = 0;
    let run = 0;
    // Twice round, so a run that wraps past the last slot is counted whole.
    for (let k = 0; k < 2 * slots && run < slots; k++) {
      run = t[(k & this.#mask) * SLOT + 2] === EMPTY ? 0 : run + 1;
      if (run > best) best = run;
    }
    return best;
  }

  #place(lo: number, hi: number, b: number): void {
    const t = this.#t;
    const mask = this.#mask;
    let i = lo & mask;
    while (t[i * SLOT + 2] !== EMPTY) i = (i + 1) & mask;
    const o = i * SLOT;
    t[o] = lo;
    t[o + 1] = hi;
    t[o + 2] = b;
  }

  #grow(): void {
    const old = this.#t;
    const slots = (this.#mask + 1) * 2;
    this.#t = BlockTable.#alloc(slots);
    this.#mask = slots - 1;
    for (let o = 0; o < old.length; o += SLOT)
      if (old[o + 2] !== EMPTY) this.#place(old[o], old[o + 1], old[o + 2]);
  }
}
