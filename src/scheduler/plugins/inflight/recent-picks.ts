/**
 * Each endpoint's recent picks (time, uncached prompt tokens), so a scorer can add to a scraped KV
 * figure what the gateway has sent since that scrape. Pure: times are passed in.
 */
/** Per endpoint, the last few seconds of picks: (time, uncached prompt tokens), oldest first. */
export class RecentPicks {
  readonly #at = new Map<string, { t: number[]; tokens: number[] }>();
  /** Picks older than this many seconds before the newest are dropped (scrapes are far fresher). */
  static readonly KEEP_S = 5;

  add(id: string, t: number, tokens: number): void {
    let r = this.#at.get(id);
    if (r === undefined) this.#at.set(id, (r = { t: [], tokens: [] }));
    r.t.push(t);
    r.tokens.push(tokens);
    let drop = 0;
    while (drop < r.t.length && r.t[drop] < t - RecentPicks.KEEP_S) drop++;
    if (drop > 0) {
      r.t.splice(0, drop);
      r.tokens.splice(0, drop);
    }
  }

  /** Uncached prompt tokens picked for `id` after time `since`. */
  since(id: string, since: number): number {
    const r = this.#at.get(id);
    if (r === undefined) return 0;
    let sum = 0;
    for (let i = r.t.length - 1; i >= 0 && r.t[i] > since; i--) sum += r.tokens[i];
    return sum;
  }

  retain(pool: ReadonlySet<string>): void {
    for (const id of [...this.#at.keys()]) if (!pool.has(id)) this.#at.delete(id);
  }
}
