/**
 * Recursive least squares: an exact online linear regression, one O(d²) update per observation and
 * an O(d) prediction, with an exponential forgetting factor so the fit follows a fleet whose
 * behaviour drifts. Pure and allocation-free after construction (d ≈ 10 here: ~100 multiply-adds
 * per update, ~10 per prediction).
 *
 * Standard form (Haykin, Adaptive Filter Theory, ch. 10): k = P·x / (λ + xᵀ·P·x); w += k·(y − wᵀx);
 * P = (P − k·xᵀ·P) / λ, with P₀ = I/δ (a ridge prior of strength δ towards w = 0). The covariance is
 * re-symmetrised and its trace capped at every update so a long stretch without excitation in one
 * direction (a feature that stays 0) cannot blow P up under forgetting.
 */
export class Rls {
  readonly dim: number;
  readonly w: Float64Array;
  readonly #p: Float64Array;
  readonly #px: Float64Array;
  readonly #maxTrace: number;
  samples = 0;

  constructor(
    dim: number,
    /** Forgetting factor in (0, 1]; 1 = never forget. */
    readonly lambda = 0.9995,
    /** Ridge prior strength: P₀ = I/delta. */
    readonly delta = 1e-2,
  ) {
    if (!(lambda > 0 && lambda <= 1))
      throw new RangeError(`forgetting factor must be in (0, 1], got ${lambda}`);
    this.dim = dim;
    this.w = new Float64Array(dim);
    this.#p = new Float64Array(dim * dim);
    this.#px = new Float64Array(dim);
    for (let i = 0; i < dim; i++) this.#p[i * dim + i] = 1 / delta;
    this.#maxTrace = (dim / delta) * 10;
  }

  predict(x: ArrayLike<number>): number {
    const w = this.w;
    let s = 0;
    for (let i = 0; i < this.dim; i++) s += w[i] * x[i];
    return s;
  }

  /** One observation: features `x` (length dim), target `y`. Non-finite inputs are ignored. */
  update(x: ArrayLike<number>, y: number): void {
    if (!Number.isFinite(y)) return;
    const d = this.dim;
    const p = this.#p;
    const px = this.#px;
    for (let i = 0; i < d; i++) if (!Number.isFinite(x[i])) return;
    let denom = this.lambda;
    for (let i = 0; i < d; i++) {
      let s = 0;
      for (let j = 0; j < d; j++) s += p[i * d + j] * x[j];
      px[i] = s;
      denom += x[i] * s;
    }
    if (!(denom > 0)) return;
    const err = y - this.predict(x);
    const inv = 1 / denom;
    for (let i = 0; i < d; i++) this.w[i] += px[i] * inv * err;
    // P = (P − (P·x)(P·x)ᵀ/denom)/λ — P symmetric, so xᵀ·P = (P·x)ᵀ.
    const il = 1 / this.lambda;
    let trace = 0;
    for (let i = 0; i < d; i++) {
      for (let j = i; j < d; j++) {
        const v = (p[i * d + j] - px[i] * px[j] * inv) * il;
        p[i * d + j] = v;
        p[j * d + i] = v;
      }
      trace += p[i * d + i];
    }
    if (trace > this.#maxTrace) {
      const f = this.#maxTrace / trace;
      for (let i = 0; i < d * d; i++) p[i] *= f;
    }
    this.samples++;
  }
}
