/**
 * Each endpoint's prefill throughput as the gateway sees it, learned online from its own requests:
 * a request picked at `pickedAt` whose first token arrives at `startedAt` had its uncached prompt
 * tokens prefilled between the later of its pick and the endpoint's previous first token (the
 * engine prefills in arrival order) and `startedAt`. The estimate is Σ tokens / Σ seconds over
 * recent samples, each weighted down by half per `halfLifeTokens` tokens observed since, so a
 * long prefill counts for more than a short question whose time is mostly one step's latency.
 *
 * What it measures is the endpoint's effective rate under its real mix of decode and prefill,
 * which is what predicts a queued request's wait; llm-d asks users to calibrate
 * `peakPrefillThroughput` by hand per model and GPU instead (llm-d/llm-d
 * guides/recipes/router/calibration). Pure: times are passed in.
 */

interface Acc {
  /** Last first-token time on the endpoint. */
  lastStart: number;
  tokens: number;
  seconds: number;
  samples: number;
  /** Tokens observed in all (not decayed), to tell when there is enough to trust. */
  seen: number;
}

export interface PrefillRateView {
  /** Learned tokens/s, or undefined until `minTokens` prompt tokens were observed. */
  tokensPerSecond: number | undefined;
  samples: number;
  tokensObserved: number;
}

export class PrefillRateEstimator {
  readonly #acc = new Map<string, Acc>();

  constructor(
    /** Observed tokens after which a sample weighs half. */
    readonly halfLifeTokens = 1_000_000,
    /** Tokens to observe on an endpoint before its rate is used. */
    readonly minTokens = 32_768,
  ) {}

  /** A first token: `tokens` uncached prompt tokens picked at `pickedAt`, started at `startedAt`. */
  observe(endpointId: string, pickedAt: number, startedAt: number, tokens: number): void {
    let a = this.#acc.get(endpointId);
    if (a === undefined) {
      a = { lastStart: Number.NEGATIVE_INFINITY, tokens: 0, seconds: 0, samples: 0, seen: 0 };
      this.#acc.set(endpointId, a);
    }
    const begin = Math.max(pickedAt, a.lastStart);
    if (startedAt > a.lastStart) a.lastStart = startedAt;
    const seconds = startedAt - begin;
    if (!(tokens > 0) || !(seconds > 0) || !Number.isFinite(seconds)) return;
    const decay = 0.5 ** (tokens / this.halfLifeTokens);
    a.tokens = a.tokens * decay + tokens;
    a.seconds = a.seconds * decay + seconds;
    a.samples++;
    a.seen += tokens;
  }

  /** Learned tokens/s of an endpoint, or undefined while too little was observed. */
  rate(endpointId: string): number | undefined {
    const a = this.#acc.get(endpointId);
    if (a === undefined || a.seen < this.minTokens || !(a.seconds > 0)) return undefined;
    return a.tokens / a.seconds;
  }

  view(endpointId: string): PrefillRateView {
    const a = this.#acc.get(endpointId);
    return {
      tokensPerSecond: this.rate(endpointId),
      samples: a?.samples ?? 0,
      tokensObserved: a?.seen ?? 0,
    };
  }

  retain(pool: ReadonlySet<string>): void {
    for (const id of [...this.#acc.keys()]) if (!pool.has(id)) this.#acc.delete(id);
  }
}
