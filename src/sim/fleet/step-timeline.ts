/**
 * Each replica's step end times, kept once so a finished request's token times can be a view of
 * them instead of a copy of their own. In the simulator a request gets one token at the end of each
 * step that decodes it, and a running request is decoded in every step of its replica until it
 * finishes, so its token times are a run of consecutive entries of the replica's timeline — unless
 * it was preempted, or its run crosses a segment boundary, in which case it gets a copy. A 512-replica
 * run of a million 1,000-token answers would otherwise hold 8 GB of token times.
 */

/** Steps per segment: large enough that few runs cross a boundary, small enough per idle replica. */
const SEGMENT = 16384;

export class StepTimeline {
  readonly #segments: Float64Array[] = [];
  /** Entries used in the last segment. */
  #used = SEGMENT;
  /** Views handed out and copies made (runs broken by preemption or a segment boundary). */
  views = 0;
  copies = 0;

  /** Appends a step's end time (strictly after the previous one). */
  push(end: number): void {
    if (this.#used === SEGMENT) {
      this.#segments.push(new Float64Array(SEGMENT));
      this.#used = 0;
    }
    this.#segments[this.#segments.length - 1][this.#used++] = end;
  }

  /** The latest step end pushed, if any. */
  last(): number | undefined {
    const segs = this.#segments;
    if (segs.length === 0 || this.#used === 0) return undefined;
    return segs[segs.length - 1][this.#used - 1];
  }

  /**
   * `times` (ascending token times of one request on this replica) as a Float64Array holding the
   * same values: a view of the timeline when they are consecutive entries of one segment, else a copy.
   */
  tokenTimes(times: ArrayLike<number>): Float64Array {
    const m = times.length;
    if (m === 0) return new Float64Array(0);
    const segs = this.#segments;
    // Runs end at the latest step, so their segment is almost always the last or the one before.
    for (let s = segs.length - 1; s >= 0 && s >= segs.length - 2; s--) {
      const seg = segs[s];
      const used = s === segs.length - 1 ? this.#used : SEGMENT;
      if (used === 0 || seg[0] > times[0]) continue;
      const start = lowerBound(seg, used, times[0]);
      if (start + m > used || seg[start] !== times[0]) break;
      let k = 1;
      while (k < m && seg[start + k] === times[k]) k++;
      if (k < m) break;
      this.views++;
      return seg.subarray(start, start + m);
    }
    this.copies++;
    return Float64Array.from(times);
  }
}

function lowerBound(a: Float64Array, n: number, x: number): number {
  let lo = 0;
  let hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

let ones = new Uint8Array(1024).fill(1);

/** m ones (each chunk carries one token), as a view of one shared array: callers must not modify it. */
export function oneTokenChunks(m: number): Uint8Array {
  if (m > ones.length) ones = new Uint8Array(Math.max(m, 2 * ones.length)).fill(1);
  return ones.subarray(0, m);
}
