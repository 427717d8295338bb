/**
 * The in-process latency model behind predicted-latency-producer: TTFT and TPOT of a request on an
 * endpoint, from llm-d's features (llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/
 * dataproducer/predictedlatency/latencypredictorclient/types.go: kv_cache_percentage,
 * input_token_length, num_request_waiting, num_request_running, num_tokens_generated,
 * prefix_cache_score, prefill_tokens_in_flight, decode_tokens_in_flight, pod_type), trained online
 * from the gateway's own observations. No sidecar, no network hop: a prediction is a dot product.
 *
 * The learner is recursive least squares on engineered features (the training server's
 * `effective_input_tokens = (1 − prefix_cache_score) · input_token_length`, `is_queued`, and a few
 * products of load and work), one model per pod role, fitted by least squares weighted 1/y² so the
 * error it minimises is relative — what MAPE measures. Chosen by measurement against the
 * alternatives kept here (`mode`: plain least squares, a log-latency fit, and llm-d's queued /
 * not-queued split), with
 * `npm run bench:latency-model`. Below `minSamples` observations a model reports not ready and the
 * plugins fall back as llm-d's do when its predictor has no model yet. Pure: no clocks.
 */
import { Rls } from "./rls.ts";

/** What the model sees of one request on one endpoint at decision time (llm-d's feature names). */
export interface LatencyFeatures {
  /** Scraped vllm:kv_cache_usage_perc, 0..1. */
  kvCachePercentage: number;
  inputTokenLength: number;
  /** Scraped vllm:num_requests_waiting. */
  numRequestWaiting: number;
  /** Requests in flight on the endpoint (the gateway's count, as llm-d's in-flight snapshot). */
  numRequestRunning: number;
  /** Output tokens generated so far; 1 at decision time (llm-d's generatedTokenCounts). */
  numTokensGenerated: number;
  /** Matched prefix blocks / request blocks on the endpoint, 0..1. */
  prefixCacheScore: number;
  /** Uncached prompt tokens the gateway has in flight on the endpoint, before this request. */
  prefillTokensInFlight: number;
  /** Context tokens of the endpoint's requests past their first token. */
  decodeTokensInFlight: number;
  /** llm-d.ai/role of the endpoint: "prefill", "decode", or "" (aggregated). */
  podType: string;
}

/**
 * relative: a linear model fitted by least squares weighted 1/y² (the relative error, what MAPE
 * measures); linear: plain least squares; log: a linear model of log(latency); split: relative,
 * with llm-d's queued / not-queued regimes fitted apart.
 */
export type ModelMode = "relative" | "linear" | "log" | "split";

export interface PredictorOptions {
  /** Observations before a model is used (llm-d chart: LATENCY_MIN_SAMPLES_FOR_RETRAIN = 100). */
  minSamples: number;
  /** RLS forgetting factor. */
  lambda: number;
  mode: ModelMode;
}

export const DEFAULT_PREDICTOR_OPTIONS: PredictorOptions = {
  minSamples: 100,
  lambda: 0.9995,
  mode: "relative",
};

export const TTFT_DIM = 11;
export const TPOT_DIM = 8;

/** TTFT basis: the work ahead of the request, its own uncached prefill, and the load that slows both. */
export function ttftBasis(f: LatencyFeatures, out: Float64Array): Float64Array {
  const eff = ((1 - clamp01(f.prefixCacheScore)) * f.inputTokenLength) / 1000;
  const ahead = f.prefillTokensInFlight / 1000;
  const run = f.numRequestRunning / 10;
  const wait = f.numRequestWaiting / 10;
  out[0] = 1;
  out[1] = eff;
  out[2] = ahead;
  out[3] = wait;
  out[4] = run;
  out[5] = clamp01(f.kvCachePercentage);
  out[6] = eff * run;
  out[7] = ahead * run;
  out[8] = f.inputTokenLength / 1000;
  out[9] = f.numRequestWaiting > 0 ? 1 : 0;
  out[10] = f.decodeTokensInFlight / 100_000;
  return out;
}

/** TPOT basis: the batch a decode step carries (sequences, their context, prefill chunks sharing it). */
export function tpotBasis(f: LatencyFeatures, out: Float64Array): Float64Array {
  const run = f.numRequestRunning / 10;
  out[0] = 1;
  out[1] = run;
  out[2] = clamp01(f.kvCachePercentage);
  out[3] = f.decodeTokensInFlight / 100_000;
  out[4] = f.prefillTokensInFlight / 10_000;
  out[5] = f.numRequestWaiting / 10;
  out[6] = f.inputTokenLength / 10_000;
  out[7] = run * run;
  return out;
}

/** One latency target (TTFT or TPOT) for one pod role. */
class Target {
  readonly #models: Rls[];
  readonly #x: Float64Array;
  readonly #xs: Float64Array;
  #meanY = 0;
  samples = 0;

  constructor(
    readonly dim: number,
    readonly basis: (f: LatencyFeatures, out: Float64Array) => Float64Array,
    readonly opts: PredictorOptions,
  ) {
    const n = opts.mode === "split" ? 2 : 1;
    this.#models = Array.from({ length: n }, () => new Rls(dim, opts.lambda));
    this.#x = new Float64Array(dim);
    this.#xs = new Float64Array(dim);
  }

  #model(f: LatencyFeatures): Rls {
    return this.#models.length === 2 && f.numRequestWaiting > 0 ? this.#models[1] : this.#models[0];
  }

  observe(f: LatencyFeatures, ms: number): void {
    if (!(ms > 0) || !Number.isFinite(ms)) return;
    const x = this.basis(f, this.#x);
    const mode = this.opts.mode;
    if (mode === "log") this.#model(f).update(x, Math.log(ms));
    else if (mode === "linear") this.#model(f).update(x, ms);
    else {
      // Weighted least squares, weight (ȳ/y)² ∝ 1/y²: fit x·ȳ/y to ȳ. The running mean ȳ keeps the
      // rows at the data's own scale, so the ridge prior stays weak against them.
      this.#meanY += (ms - this.#meanY) / (this.samples + 1);
      const k = this.#meanY / ms;
      const xs = this.#xs;
      for (let i = 0; i < this.dim; i++) xs[i] = x[i] * k;
      this.#model(f).update(xs, this.#meanY);
    }
    this.samples++;
  }

  get ready(): boolean {
    return this.samples >= this.opts.minSamples;
  }

  /** Milliseconds, or undefined while not ready. */
  predict(f: LatencyFeatures): number | undefined {
    if (!this.ready) return undefined;
    const m = this.#model(f);
    // A regime with too few samples of its own borrows the other's fit.
    const use = m.samples < Math.min(this.opts.minSamples, 20) ? this.#models[0] : m;
    const v = use.predict(this.basis(f, this.#x));
    const ms = this.opts.mode === "log" ? Math.exp(Math.min(v, 30)) : v;
    return ms > 0 && Number.isFinite(ms) ? ms : 0;
  }
}

export interface RoleSamples {
  ttft: number;
  tpot: number;
}

export interface Prediction {
  /** Undefined while the TTFT model has fewer than minSamples observations. */
  ttftMs: number | undefined;
  tpotMs: number | undefined;
}

export class LatencyPredictor {
  readonly opts: PredictorOptions;
  readonly #roles = new Map<string, { ttft: Target; tpot: Target }>();

  constructor(opts: Partial<PredictorOptions> = {}) {
    this.opts = { ...DEFAULT_PREDICTOR_OPTIONS, ...opts };
  }

  #role(podType: string) {
    let r = this.#roles.get(podType);
    if (r === undefined) {
      r = {
        ttft: new Target(TTFT_DIM, ttftBasis, this.opts),
        tpot: new Target(TPOT_DIM, tpotBasis, this.opts),
      };
      this.#roles.set(podType, r);
    }
    return r;
  }

  observeTtft(f: LatencyFeatures, ms: number): void {
    this.#role(f.podType).ttft.observe(f, ms);
  }

  observeTpot(f: LatencyFeatures, ms: number): void {
    this.#role(f.podType).tpot.observe(f, ms);
  }

  predict(f: LatencyFeatures): Prediction {
    const r = this.#roles.get(f.podType);
    if (r === undefined) return { ttftMs: undefined, tpotMs: undefined };
    return { ttftMs: r.ttft.predict(f), tpotMs: r.tpot.predict(f) };
  }

  /** Observations per role so far. */
  samples(podType: string): RoleSamples {
    const r = this.#roles.get(podType);
    return { ttft: r?.ttft.samples ?? 0, tpot: r?.tpot.samples ?? 0 };
  }

  roles(): string[] {
    return [...this.#roles.keys()];
  }
}

function clamp01(v: number): number {
  return v < 0 ? 0 : v > 1 ? 1 : Number.isFinite(v) ? v : 0;
}
