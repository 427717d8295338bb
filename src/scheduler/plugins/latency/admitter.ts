/**
 * latency-slo-admitter (llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/admitter/
 * latencyslo/plugin.go): refuses a sheddable request (priority < 0) that carries an SLO
 * (x-llm-d-slo-ttft-ms or x-llm-d-slo-tpot-ms > 0) when no candidate can serve it: none is predicted
 * to meet both SLOs, none is idle (0 running requests scraped), and none is cold (scraped KV use
 * < 2%, where predictions are least reliable). Admits everything else, and fails open when there
 * are no predictions (model not ready). The gateway answers a refusal as llm-d's director does: 500,
 * "request cannot be admitted: …", no dropped-reason header.
 */
import { z } from "zod";
import { spec } from "../../plugin-spec.ts";
import type { Admitter, CycleState, DataKey, EndpointState, TypedName } from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { LatencyPredictions } from "./data.ts";
import { isValid, latencyKey } from "./data.ts";

export const ADMITTER_TYPE = "latency-slo-admitter";
const COLD_KV = 0.02;

export const admitterParams = z.strictObject({
  latencyPredictionInfoProducerName: z.string().min(1).optional(),
});
export type AdmitterParams = z.output<typeof admitterParams>;

export type AdmitDecision =
  | "not-sheddable"
  | "no-slo"
  | "no-predictions"
  | "valid-endpoint"
  | "idle-endpoint"
  | "cold-endpoint"
  | "rejected";

export const NO_VALID_ENDPOINT = "no valid endpoint available to serve the request";

export class LatencySloAdmitter implements Admitter {
  readonly typedName: TypedName;
  readonly #latency: DataKey<LatencyPredictions>;
  readonly #decision: DataKey<AdmitDecision>;
  readonly decisions: Record<AdmitDecision, number> = {
    "not-sheddable": 0,
    "no-slo": 0,
    "no-predictions": 0,
    "valid-endpoint": 0,
    "idle-endpoint": 0,
    "cold-endpoint": 0,
    rejected: 0,
  };

  constructor(
    name: string,
    readonly params: AdmitterParams,
  ) {
    this.typedName = { type: ADMITTER_TYPE, name };
    this.#latency = latencyKey(params.latencyPredictionInfoProducerName as string);
    this.#decision = dataKey(`latency-slo-admitter/${name}`);
  }

  consumes() {
    return { required: [this.#latency] };
  }

  admit(cycle: CycleState, candidates: readonly EndpointState[]): string | null {
    const d = this.#decide(cycle, candidates);
    this.decisions[d]++;
    cycle.set(this.#decision, d);
    if (d !== "rejected") return null;
    const req = cycle.request;
    const slo = [
      req.sloTtftMs !== undefined ? `TTFT ${req.sloTtftMs} ms` : null,
      req.sloTpotMs !== undefined ? `TPOT ${req.sloTpotMs} ms` : null,
    ].filter((s) => s !== null);
    return `${NO_VALID_ENDPOINT} (sheddable request: no endpoint is predicted to meet its SLO of ${slo.join(", ")}, and none is idle or cold; retry later, relax the SLO, or send it at a non-negative priority)`;
  }

  #decide(cycle: CycleState, candidates: readonly EndpointState[]): AdmitDecision {
    const req = cycle.request;
    if (req.priority >= 0) return "not-sheddable";
    if (!((req.sloTtftMs ?? 0) > 0 || (req.sloTpotMs ?? 0) > 0)) return "no-slo";
    const preds = cycle.get(this.#latency);
    let predicted = false;
    let valid = false;
    let idle = false;
    let cold = false;
    for (const e of candidates) {
      const m = e.metrics;
      if (m === null || m.kvCacheUsagePercent < COLD_KV) cold = true;
      if (m === null || m.runningRequestsSize === 0) idle = true;
      const p = preds?.get(e.id);
      if (p !== undefined) {
        predicted = true;
        if (isValid(p)) valid = true;
      }
    }
    if (!predicted) return "no-predictions";
    if (valid) return "valid-endpoint";
    if (idle) return "idle-endpoint";
    if (cold) return "cold-endpoint";
    return "rejected";
  }

  explain(cycle: CycleState): Record<string, unknown> | undefined {
    const d = cycle.get(this.#decision);
    if (d === undefined) return undefined;
    return d === "no-predictions"
      ? { decision: "admitted", why: d, fallback: "no latency predictions yet: admitted (fail open)" }
      : { decision: d === "rejected" ? "rejected" : "admitted", why: d };
  }

  stats() {
    return { ...this.decisions };
  }
}

export const admitterSpec = spec({
  type: ADMITTER_TYPE,
  stability: "alpha",
  kind: "admitter",
  summary: "Refuses sheddable requests with an SLO that no endpoint is predicted to meet.",
  params: admitterParams,
  needs: () => [
    { family: "latency-prediction-info", param: "latencyPredictionInfoProducerName", required: true },
  ],
  factory: (name, p) => new LatencySloAdmitter(name, p),
});
