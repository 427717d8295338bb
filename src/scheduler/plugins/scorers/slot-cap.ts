/**
 * A replica's sequence-slot cap (vLLM `--max-num-seqs`, which no metric exports), read from its
 * scraped running and waiting counts, for decode-load-scorer: a new request on a replica whose
 * slots are all taken waits for a running one to end.
 *
 * A cap is a plateau: while requests wait, the running count sits at the same highest value scrape
 * after scrape. Waiting behind a step's token budget or behind KV leaves the running count
 * wandering below its maximum instead, so those never read as a cap: the cap is known once at least
 * `SLOT_SCRAPES` scrapes with more requests than that count (running + waiting) were taken since
 * the highest running count was first seen, and at least half of them show exactly that count with
 * two or more waiting (one may be a request that arrived since the last step). Scrapes at ≥ 90% KV
 * utilisation are skipped (requests there wait for KV blocks). A count read too low (a plateau of
 * arrivals that waited one step) is dropped at the first scrape that runs more.
 */
export class SlotCap {
  #last = Number.NaN;
  #max = 0;
  #waiting = 0;
  #atMax = 0;

  /** One scrape (repeated reads of the same scrape, same `updateTime`, count once). */
  observe(updateTime: number, running: number, waiting: number, kvUsage = 0): void {
    if (updateTime === this.#last) return;
    this.#last = updateTime;
    if (running > this.#max) {
      this.#max = running;
      this.#waiting = 0;
      this.#atMax = 0;
    }
    // Requests waiting for KV, not for a slot: no evidence either way.
    if (kvUsage >= KV_FULL) return;
    // Fewer requests than the highest running count: no slot was lacking (a request that arrived
    // since the last step waits for the next one on any replica).
    if (waiting <= 0 || running + waiting <= this.#max) return;
    if (running === this.#max) {
      // One waiting request at the highest count may be a lone arrival since the last step.
      if (waiting < 2) return;
      this.#atMax++;
    }
    this.#waiting++;
  }

  /** The learned cap, or undefined while the scrapes show none. */
  get known(): number | undefined {
    return this.#waiting >= SLOT_SCRAPES && this.#atMax * 2 >= this.#waiting ? this.#max : undefined;
  }
}

/** KV utilisation from which waiting requests are taken to wait for KV blocks. */
const KV_FULL = 0.9;
/** Scrapes with requests waiting beyond the highest running count before a cap is believed. */
const SLOT_SCRAPES = 5;
