/**
 * predicted-latency-producer (llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/
 * dataproducer/predictedlatency/: plugin.go, dataproducer_hooks.go, prediction.go), in process:
 * per request it predicts TTFT and TPOT on every candidate with the online model
 * (src/scheduler/latency/predictor.ts) and writes each endpoint's prediction, headroom and validity
 * for latency-scorer, slo-headroom-tier-filter, latency-slo-admitter and prefix-cache-affinity-filter
 * (ttftSource: latencyPredictor). It learns from the gateway's own observations: the features
 * of the picked endpoint at decision time, then TTFT at the first response chunk (pick → first
 * token) and TPOT at the end ((end − first token) / (output tokens − 1)), in wall time behind
 * `kvgate serve` and virtual time in `kvgate simulate` — the same hooks.
 *
 * Validity as llm-d's validatePrediction: TTFT valid iff predicted < x-llm-d-slo-ttft-ms (headroom =
 * SLO − predicted; no SLO → always negative, so the scorer still prefers the fastest). With
 * streamingMode, TPOT valid iff predicted < the request's TPOT SLO × sloBufferFactor, tightened to
 * the endpoint's smallest TPOT SLO among its running requests × sloBufferFactor; without
 * streamingMode, or on a prefill pod, TPOT is neutralised (valid, headroom 0). Where kvgate differs:
 * an SLO the request does not set is not a constraint — TTFT without an SLO counts as valid (its
 * headroom stays −predicted), and in streamingMode a request without a TPOT SLO has TPOT
 * neutralised. llm-d marks both invalid, so a request naming only one SLO could never be valid
 * anywhere: the tier filter would keep every endpoint and the admitter refuse it whenever no
 * endpoint is idle or cold. Not streamingMode trains TTFT from the first byte of every
 * response (a non-streamed one's first byte is its end, as llm-d's e2e-as-TTFT); streamingMode only
 * from streamed ones.
 */
import { z } from "zod";
import { parseDuration } from "../../../flow/duration.ts";
import type { Hasher } from "../../hash.ts";
import type { LatencyFeatures } from "../../latency/predictor.ts";
import { LatencyPredictor } from "../../latency/predictor.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  DataProducer,
  EndpointState,
  PluginStats,
  PreRequestHook,
  RequestFacts,
  ResponseHooks,
  ResponseInfo,
  ScheduleResult,
  TypedName,
} from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { InFlightInfo, PrefixMatchInfo } from "../data.ts";
import { inflightKey, matchRatio, prefixKey } from "../data.ts";
import { flatPrompt } from "../prefix/hashing.ts";
import type { LatencyPredictionInfo, LatencyPredictions } from "./data.ts";
import { latencyKey } from "./data.ts";

export const PREDICTED_LATENCY_TYPE = "predicted-latency-producer";

const duration = z.string().refine((s) => parseDuration(s) !== null, {
  message: 'must be a duration such as "5m", "30s" or "1m30s"',
});

export const latencyProducerParams = z.strictObject({
  /** llm-d: mean tokens between sampled per-token TPOT observations. kvgate trains on each request's mean TPOT. */
  samplingMean: z.number().positive().default(1000),
  maxDecodeTokenSamplesForPrediction: z.number().int().nonnegative().default(0),
  sloBufferFactor: z.number().positive().default(1),
  /** How long a picked request's record is kept without a response event. */
  contextTTL: duration.default("5m"),
  streamingMode: z.boolean().default(false),
  /** Label whose value is the endpoint's pod role (pod_type); unset → "" for every endpoint. */
  endpointRoleLabel: z.string().min(1).optional(),
  predictInProduce: z.boolean().default(true),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
  inFlightLoadProducerName: z.string().min(1).optional(),
  /** kvgate: observations before the model is used (llm-d's chart: LATENCY_MIN_SAMPLES_FOR_RETRAIN 100). */
  minSamples: z.number().int().positive().default(100),
});
export type LatencyProducerParams = z.output<typeof latencyProducerParams>;

/** One observation the model trained on, for benchmarks (features at decision time, latency in ms). */
export interface LatencyObservation {
  kind: "ttft" | "tpot";
  endpointId: string;
  features: LatencyFeatures;
  ms: number;
  now: number;
}

interface Pending {
  endpointId: string;
  features: LatencyFeatures;
  pickedAt: number;
  stream: boolean;
  inputTokens: number;
  tpotSlo: number;
  startedAt: number;
}

interface CycleFeatures {
  features: Map<string, LatencyFeatures>;
}

const UNAVAILABLE_PREFIX = "latency model not ready";

export class PredictedLatencyProducer implements DataProducer, PreRequestHook, ResponseHooks {
  readonly typedName: TypedName;
  readonly wantsResponseUsage = true;
  readonly model: LatencyPredictor;
  readonly #key: DataKey<LatencyPredictions>;
  readonly #prefix: DataKey<PrefixMatchInfo>;
  readonly #inflight: DataKey<InFlightInfo>;
  readonly #features: DataKey<CycleFeatures>;
  readonly #ttl: number;
  readonly #pending = new Map<string, Pending>();
  /** Context tokens of requests past their first token, per endpoint. */
  readonly #decodeTokens = new Map<string, number>();
  /** TPOT SLOs of the requests in flight per endpoint (for the endpoint's minimum). */
  readonly #tpotSlos = new Map<string, number[]>();
  /** Called for every observation the model trains on (benchmarks collect them). */
  onObservation: ((o: LatencyObservation) => void) | null = null;
  #observed = { ttft: 0, tpot: 0, skippedFailover: 0, expired: 0 };

  constructor(
    name: string,
    readonly params: LatencyProducerParams,
    readonly hasher: Hasher | null = null,
  ) {
    this.typedName = { type: PREDICTED_LATENCY_TYPE, name };
    this.model = new LatencyPredictor({ minSamples: params.minSamples });
    this.#key = latencyKey(name);
    this.#prefix = prefixKey(params.prefixMatchInfoProducerName as string);
    this.#inflight = inflightKey(params.inFlightLoadProducerName as string);
    this.#features = dataKey<CycleFeatures>(`predicted-latency-features/${name}`);
    this.#ttl = parseDuration(params.contextTTL) ?? 300;
  }

  produces(): DataKey<unknown>[] {
    return [this.#key];
  }

  consumes() {
    return { required: [this.#prefix, this.#inflight] };
  }

  #podType(e: EndpointState): string {
    const l = this.params.endpointRoleLabel;
    return l === undefined ? "" : (e.labels[l] ?? "");
  }

  /** The features of the request on `e` now (llm-d's bulkPredictWithMetrics inputs). */
  featuresOf(cycle: CycleState, e: EndpointState, inputTokens: number): LatencyFeatures {
    const load = cycle.get(this.#inflight);
    const m = e.metrics;
    return {
      kvCachePercentage: m?.kvCacheUsagePercent ?? 0,
      inputTokenLength: inputTokens,
      numRequestWaiting: m?.waitingQueueSize ?? 0,
      numRequestRunning: load?.requests(e.id) ?? 0,
      numTokensGenerated: 1,
      prefixCacheScore: matchRatio(cycle.get(this.#prefix), e.id),
      prefillTokensInFlight: load?.tokens(e.id) ?? 0,
      decodeTokensInFlight: this.#decodeTokens.get(e.id) ?? 0,
      podType: this.#podType(e),
    };
  }

  produce(cycle: CycleState, candidates: readonly EndpointState[]): void {
    const input = flatPrompt(cycle, this.hasher).tokenCount;
    const features = new Map<string, LatencyFeatures>();
    for (const e of candidates) features.set(e.id, this.featuresOf(cycle, e, input));
    cycle.set(this.#features, { features });
    const why = this.#whyUnavailable(candidates);
    if (why !== null) {
      cycle.set(this.#key, new Predictions(new Map(), why));
      return;
    }
    const req = cycle.request;
    const ttftSlo = req.sloTtftMs ?? 0;
    const tpotSlo = req.sloTpotMs ?? 0;
    const p = this.params;
    const load = cycle.get(this.#inflight);
    const out = new Map<string, LatencyPredictionInfo>();
    for (const e of candidates) {
      const f = features.get(e.id) as LatencyFeatures;
      const pred = this.model.predict(f);
      const ttft = pred.ttftMs ?? 0;
      const tpot = pred.tpotMs ?? 0;
      let tpotValid = true;
      let tpotHeadroom = 0;
      if (p.streamingMode && f.podType !== "prefill" && tpotSlo > 0) {
        let buffered = tpotSlo * p.sloBufferFactor;
        const podMin = this.#minTpotSlo(e.id);
        if (podMin > 0) buffered = Math.min(buffered, podMin * p.sloBufferFactor);
        tpotValid = tpot < buffered;
        tpotHeadroom = buffered - tpot;
      }
      out.set(e.id, {
        ttftValid: ttftSlo > 0 ? ttft < ttftSlo : true,
        tpotValid,
        ttftHeadroom: ttftSlo - ttft,
        tpotHeadroom,
        ttftMs: ttft,
        tpotMs: tpot,
        dispatchedRequestCount: load?.requests(e.id) ?? 0,
      });
    }
    cycle.set(this.#key, new Predictions(out, null));
  }

  /** Why this cycle gets no predictions (llm-d: the predictor has no model yet), or null. */
  #whyUnavailable(candidates: readonly EndpointState[]): string | null {
    if (!this.params.predictInProduce) return "predictInProduce is false (training only)";
    const needTpot = this.params.streamingMode;
    for (const role of new Set(candidates.map((e) => this.#podType(e)))) {
      const s = this.model.samples(role);
      const min = this.params.minSamples;
      const tpotNeeded = needTpot && role !== "prefill";
      if (s.ttft < min || (tpotNeeded && s.tpot < min)) {
        const what = `TTFT ${s.ttft}/${min}${tpotNeeded ? `, TPOT ${s.tpot}/${min}` : ""} samples`;
        return `${UNAVAILABLE_PREFIX}${role ? ` for role "${role}"` : ""} (${what})`;
      }
    }
    return null;
  }

  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void {
    this.#expire(now);
    const target = result.target;
    const f = target ? cycle.get(this.#features)?.features.get(target.id) : undefined;
    if (target === null || f === undefined) return;
    const req = cycle.request;
    const tpotSlo = req.sloTpotMs ?? 0;
    this.#pending.set(result.requestId, {
      endpointId: target.id,
      features: f,
      pickedAt: now,
      stream: req.stream,
      inputTokens: f.inputTokenLength,
      tpotSlo,
      startedAt: -1,
    });
    if (tpotSlo > 0) {
      const l = this.#tpotSlos.get(target.id) ?? [];
      l.push(tpotSlo);
      this.#tpotSlos.set(target.id, l);
    }
  }

  onResponseStarted(req: RequestFacts, endpointId: string, now: number): void {
    const r = this.#pending.get(req.requestId);
    if (r === undefined || r.startedAt >= 0) return;
    r.startedAt = now;
    // After a failover the decision-time features describe another endpoint: no sample.
    if (endpointId !== r.endpointId) {
      this.#observed.skippedFailover++;
      return;
    }
    this.#decodeTokens.set(endpointId, (this.#decodeTokens.get(endpointId) ?? 0) + r.inputTokens);
    if (this.params.streamingMode && !r.stream) return;
    this.#train("ttft", r, (now - r.pickedAt) * 1000, now);
  }

  onResponseComplete(req: RequestFacts, endpointId: string, now: number, info?: ResponseInfo): void {
    const r = this.#pending.get(req.requestId);
    if (r === undefined) return;
    this.#forget(req.requestId, r);
    const n = info?.outputTokens;
    if (r.startedAt < 0 || endpointId !== r.endpointId || !r.stream || n === undefined || n < 2) return;
    this.#train("tpot", r, ((now - r.startedAt) * 1000) / (n - 1), now);
  }

  #train(kind: "ttft" | "tpot", r: Pending, ms: number, now: number): void {
    if (!(ms > 0) || !Number.isFinite(ms)) return;
    if (kind === "ttft") this.model.observeTtft(r.features, ms);
    else this.model.observeTpot(r.features, ms);
    this.#observed[kind]++;
    this.onObservation?.({ kind, endpointId: r.endpointId, features: r.features, ms, now });
  }

  #forget(id: string, r: Pending): void {
    this.#pending.delete(id);
    if (r.startedAt >= 0) {
      const left = (this.#decodeTokens.get(r.endpointId) ?? 0) - r.inputTokens;
      if (left > 0) this.#decodeTokens.set(r.endpointId, left);
      else this.#decodeTokens.delete(r.endpointId);
    }
    if (r.tpotSlo > 0) {
      const l = this.#tpotSlos.get(r.endpointId);
      const i = l?.indexOf(r.tpotSlo) ?? -1;
      if (l !== undefined && i >= 0) l.splice(i, 1);
      if (l !== undefined && l.length === 0) this.#tpotSlos.delete(r.endpointId);
    }
  }

  /** Records older than contextTTL (a response whose end was never reported) are dropped. */
  #expire(now: number): void {
    for (const [id, r] of this.#pending) {
      if (now - r.pickedAt <= this.#ttl) break; // insertion order = pick order
      this.#forget(id, r);
      this.#observed.expired++;
    }
  }

  #minTpotSlo(endpointId: string): number {
    const l = this.#tpotSlos.get(endpointId);
    if (l === undefined) return 0;
    let min = Number.POSITIVE_INFINITY;
    for (const v of l) if (v < min) min = v;
    return Number.isFinite(min) ? min : 0;
  }

  explain(cycle: CycleState): Record<string, unknown> {
    const preds = cycle.get(this.#key);
    const out: Record<string, unknown> = {
      samples: Object.fromEntries(this.model.roles().map((r) => [r || "(none)", this.model.samples(r)])),
      minSamples: this.params.minSamples,
      slo: { ttftMs: cycle.request.sloTtftMs ?? null, tpotMs: cycle.request.sloTpotMs ?? null },
    };
    if (cycle.request.sloHeaderNotes?.length) out.ignoredHeaders = cycle.request.sloHeaderNotes;
    if (preds?.unavailable) {
      out.predictions = null;
      out.fallback = `${preds.unavailable}: latency-scorer scores on KV, queue and prefix (composite); slo-headroom-tier-filter keeps all; latency-slo-admitter admits; prefix-cache-affinity-filter (latencyPredictor) keeps all`;
    } else if (preds instanceof Predictions) {
      out.predictions = Object.fromEntries(
        [...preds.byId].map(([id, p]) => [
          id,
          {
            ttftMs: round(p.ttftMs),
            tpotMs: round(p.tpotMs),
            ttftHeadroom: round(p.ttftHeadroom),
            tpotHeadroom: round(p.tpotHeadroom),
            valid: p.ttftValid && p.tpotValid,
          },
        ]),
      );
    }
    return out;
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const id of [...this.#decodeTokens.keys()]) if (!pool.has(id)) this.#decodeTokens.delete(id);
    for (const id of [...this.#tpotSlos.keys()]) if (!pool.has(id)) this.#tpotSlos.delete(id);
  }

  stats(): PluginStats {
    return {
      ttftSamples: this.#observed.ttft,
      tpotSamples: this.#observed.tpot,
      skippedFailover: this.#observed.skippedFailover,
      expired: this.#observed.expired,
      tracked: this.#pending.size,
    };
  }
}

class Predictions implements LatencyPredictions {
  constructor(
    readonly byId: Map<string, LatencyPredictionInfo>,
    readonly unavailable: string | null,
  ) {}
  get(endpointId: string): LatencyPredictionInfo | undefined {
    return this.byId.get(endpointId);
  }
}

function round(v: number): number {
  return Math.round(v * 100) / 100;
}

export const predictedLatencySpec = spec({
  type: PREDICTED_LATENCY_TYPE,
  stability: "alpha",
  kind: "producer",
  summary: "Predicts TTFT and TPOT per endpoint with an online model trained on the gateway's observations.",
  params: latencyProducerParams,
  produces: ["latency-prediction-info"],
  needs: () => [
    { family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true },
    { family: "inflight-load", param: "inFlightLoadProducerName", required: true },
  ],
  factory: (name, p, handle) => new PredictedLatencyProducer(name, p, handle.hasher),
});
