/**
 * Zero-filled Float64Arrays for per-candidate scores, without an off-heap allocation per array.
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
