/**
 * Output tokens emitted before / up to given times, counted in one pass over the records' chunks:
 * the throughput side of the per-stage benchmark figures.
 */
import type { RequestRecord } from "./request-metrics.ts";

/**
 * Output tokens of the successful requests emitted before / up to given times (one per token, at
 * its chunk's arrival), for a set of query times fixed up front: one pass over the chunks, no sort.
 * before(x) and upTo(x) count the tokens at t < x and t ≤ x; NaN times and queries count nothing.
 */
export class EmissionCounts {
  /** The query times, ascending and distinct (NaN left out). */
  readonly #xs: Float64Array;
  /** #{t < xs[j]} and #{t ≤ xs[j]}. */
  readonly #below: Float64Array;
  readonly #upTo: Float64Array;

  constructor(records: readonly RequestRecord[], queries: readonly number[]) {
    const xs = Float64Array.from(new Set(queries.filter((x) => !Number.isNaN(x)))).sort();
    const m = xs.length;
    // A token at t adds to below[j] for j ≥ b = #{xs ≤ t}, and to upTo[j] for j ≥ a = #{xs < t}.
    const hb = new Float64Array(m + 1);
    const ha = new Float64Array(m + 1);
    let a = 0;
    let b = 0;
    for (const r of records) {
      if (r.error) continue;
      const { chunkTimes: ts, chunkTokens: ks } = r;
      for (let i = 0; i < ts.length; i++) {
        const k = ks[i];
        if (!(k > 0)) continue;
        const t = ts[i];
        if (Number.isNaN(t)) continue;
        // Chunk times ascend within a request, so the cursors mostly stay put.
        while (b < m && xs[b] <= t) b++;
        while (b > 0 && xs[b - 1] > t) b--;
        while (a < m && xs[a] < t) a++;
        while (a > 0 && xs[a - 1] >= t) a--;
        const w = Math.ceil(k);
        hb[b] += w;
        ha[a] += w;
      }
    }
    this.#xs = xs;
    this.#below = new Float64Array(m);
    this.#upTo = new Float64Array(m);
    let sb = 0;
    let sa = 0;
    for (let j = 0; j < m; j++) {
      sb += hb[j];
      sa += ha[j];
      this.#below[j] = sb;
      this.#upTo[j] = sa;
    }
  }

  before(x: number): number {
    const j = this.#find(x);
    return j < 0 ? 0 : this.#below[j];
  }

  upTo(x: number): number {
    const j = this.#find(x);
    return j < 0 ? 0 : this.#upTo[j];
  }

  #find(x: number): number {
    if (Number.isNaN(x)) return -1;
    const xs = this.#xs;
    let lo = 0;
    let hi = xs.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (xs[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    if (lo >= xs.length || xs[lo] !== x)
      throw new Error(`emission count asked for an unregistered time ${x}`);
    return lo;
  }
}
