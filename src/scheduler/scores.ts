/**
 * Float64Arrays for per-candidate scores without an off-heap allocation per request. A scorer's
 * output is read at once by its profile run, so each scorer reuses one buffer (ScoreBuffer); what
 * outlives the call (a profile's totals, kept for failover order and explanations) comes from
 * zeroedScores().
 *
 * `new Float64Array(256)` gets its own malloc'd backing store (~1.2 µs, several µs right after a
 * scavenge; bench:picker) while arrays of up to 8 elements live on the JS heap. Larger ones are
 * carved here from 64 KiB slabs: each view is fresh (slab memory is never handed out twice, so
 * views stay valid however long they are kept) and a slab is freed by the GC with its last view.
 */
const SLAB_BYTES = 1 << 16;
/** Arrays up to this length are allocated normally (on-heap, cheap). */
const SMALL = 8;

let slab = new ArrayBuffer(SLAB_BYTES);
let used = 0;

/** A new zero-filled Float64Array of length `n`. */
export function zeroedScores(n: number): Float64Array {
  const bytes = n * 8;
  if (n <= SMALL || bytes > SLAB_BYTES >>> 2) return new Float64Array(n);
  if (used + bytes > SLAB_BYTES) {
    slab = new ArrayBuffer(SLAB_BYTES);
    used = 0;
  }
  const out = new Float64Array(slab, used, n);
  used += bytes;
  return out;
}

/**
 * A scorer's output array, reused from call to call: zero-filled, of exactly the requested
 * length (one array kept per length, a few lengths at most). The caller must read it before the
 * scorer's next call (Scorer.score()'s contract).
 */
export class ScoreBuffer {
  readonly #bySize = new Map<number, Float64Array>();

  get(n: number): Float64Array {
    const kept = this.#bySize.get(n);
    if (kept !== undefined) return kept.fill(0);
    if (this.#bySize.size >= 4) this.#bySize.clear();
    const fresh = new Float64Array(n);
    this.#bySize.set(n, fresh);
    return fresh;
  }
}
