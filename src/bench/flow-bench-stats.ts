/**
 * bench:flow, pure half: the config variants the bench compares (derived from
 * config/examples/flow-control.yaml), seeded prompts, percentiles and the per-class summaries of a
 * list of timed requests. No sockets or clocks here, so the bench's arithmetic can be tested alone.
 */
import { parseAllDocuments, stringify } from "yaml";
import { createRng } from "../scheduler/rng.ts";

/**
 * vtc / round-robin: the example's standard band with that fairness; global-strict = FCFS across
 * tenants; vtc-no-reserve: vtc without the prefill reserve (a flooding tenant may prefill on every
 * replica at once); vtc-no-holdback: vtc without the holdback (a flooding tenant may fill the gate).
 */
export const FLOW_CONFIGS = [
  "vtc",
  "vtc-no-reserve",
  "vtc-no-holdback",
  "round-robin",
  "global-strict",
  "off",
] as const;
export type FlowConfigName = (typeof FLOW_CONFIGS)[number];

const FAIRNESS_PLUGIN: Record<Exclude<FlowConfigName, "off">, string> = {
  vtc: "vtc-fairness-policy",
  "vtc-no-reserve": "vtc-fairness-policy",
  "vtc-no-holdback": "vtc-fairness-policy",
  "round-robin": "round-robin-fairness-policy",
  "global-strict": "global-strict-fairness-policy",
};
const FLOW_PLUGIN_TYPES = new Set([
  "concurrency-detector",
  "vtc-fairness-policy",
  "round-robin-fairness-policy",
  "global-strict-fairness-policy",
  "fcfs-ordering-policy",
  "slo-deadline-ordering-policy",
]);

type Plugin = { type: string; name?: string; parameters?: Record<string, unknown> };
type Band = { priority: number; fairnessPolicyRef?: string };

/**
 * The flow-control example turned into one of the bench's configs: concurrency-detector's
 * maxConcurrency set, and the priority-0 band's fairness policy replaced; vtc-fairness-policy's
 * holdback set to `holdback` when given (vtc-no-holdback: removed), its prefillReserve removed for
 * vtc-no-reserve; "off" drops the feature
 * gate, the flowControl section and its plugins (llm-d's legacy admission then applies). The
 * InferenceObjective documents are kept as they are.
 */
export function flowConfigVariant(
  exampleYaml: string,
  name: FlowConfigName,
  maxConcurrency: number,
  holdback?: number,
): string {
  const docs = parseAllDocuments(exampleYaml);
  if (!Array.isArray(docs) || docs.length === 0) throw new Error("flow-control example: no YAML documents");
  const epc = docs[0].toJS() as {
    featureGates?: string[];
    plugins: Plugin[];
    flowControl?: { priorityBands: Band[] };
  };
  const detector = epc.plugins.find((p) => p.type === "concurrency-detector");
  const standard = epc.flowControl?.priorityBands.find((b) => b.priority === 0);
  if (detector === undefined || standard === undefined)
    throw new Error("flow-control example: expected a concurrency-detector plugin and a priority-0 band");
  if (name === "off") {
    delete epc.featureGates;
    delete epc.flowControl;
    epc.plugins = epc.plugins.filter((p) => !FLOW_PLUGIN_TYPES.has(p.type));
  } else {
    detector.parameters = { ...detector.parameters, maxConcurrency };
    const vtc = epc.plugins.find((p) => p.type === "vtc-fairness-policy");
    if (vtc !== undefined) {
      const { holdback: old, prefillReserve, ...rest } = vtc.parameters ?? {};
      const h = name === "vtc-no-holdback" ? undefined : (holdback ?? old);
      vtc.parameters = {
        ...rest,
        ...(h !== undefined ? { holdback: h } : {}),
        ...(prefillReserve !== undefined && name !== "vtc-no-reserve" ? { prefillReserve } : {}),
      };
    }
    const type = FAIRNESS_PLUGIN[name];
    if (!epc.plugins.some((p) => p.type === type)) epc.plugins.push({ type });
    standard.fairnessPolicyRef = type;
  }
  return [stringify(epc), ...docs.slice(1).map((d) => d.toString())].join("---\n");
}

/** `n` space-led 5-letter words: exactly n tokens for the simulator's tokenizer, unique per seed. */
export function seededPrompt(n: number, seed: number): string {
  const rng = createRng(seed);
  const letters = "abcdefghijklmnopqrstuvwxyz";
  let s = "";
  for (let i = 0; i < n; i++) {
    s += " ";
    for (let j = 0; j < 5; j++) s += letters[Math.floor(rng.next() * 26)];
  }
  return s;
}

/** Nearest-rank quantile (the smallest value with at least q of the sample at or below it); null if empty. */
export function quantile(xs: readonly number[], q: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

/** One request as the client saw it; times in simulated seconds from the scenario's start. */
export interface Timed {
  cls: string;
  sentAt: number;
  status: number;
  /** x-llm-d-request-dropped-reason, if any. */
  reason: string | null;
  /** First streamed token, null if none came. */
  firstTokenAt: number | null;
  doneAt: number;
  outputTokens: number;
}

export interface ClassSummary {
  sent: number;
  served: number;
  /** "429 rejected-saturated" → count. */
  rejected: Record<string, number>;
  ttftP50: number | null;
  ttftP90: number | null;
  latencyP50: number | null;
  latencyP90: number | null;
  /** Output tokens per simulated second, first send to last completion of the class. */
  outputTokensPerS: number | null;
  /** First send to last completion, simulated seconds. */
  makespan: number | null;
}

export function summarize(rs: readonly Timed[]): ClassSummary {
  const ok = rs.filter((r) => r.status === 200 && r.firstTokenAt !== null);
  const rejected: Record<string, number> = {};
  for (const r of rs)
    if (!ok.includes(r)) {
      const k = `${r.status} ${r.reason ?? "-"}`;
      rejected[k] = (rejected[k] ?? 0) + 1;
    }
  const ttft = ok.map((r) => (r.firstTokenAt as number) - r.sentAt);
  const lat = ok.map((r) => r.doneAt - r.sentAt);
  const makespan = ok.length
    ? Math.max(...ok.map((r) => r.doneAt)) - Math.min(...rs.map((r) => r.sentAt))
    : null;
  const tokens = ok.reduce((a, r) => a + r.outputTokens, 0);
  return {
    sent: rs.length,
    served: ok.length,
    rejected,
    ttftP50: quantile(ttft, 0.5),
    ttftP90: quantile(ttft, 0.9),
    latencyP50: quantile(lat, 0.5),
    latencyP90: quantile(lat, 0.9),
    outputTokensPerS: makespan ? tokens / makespan : null,
    makespan,
  };
}

/**
 * How many served requests of other classes got their first token before the last served `first`
 * request got its own: with strict priority, only those already dispatched when `first` arrived.
 */
export function overtook(rs: readonly Timed[], first: string): number {
  const top = rs.filter((r) => r.cls === first && r.status === 200 && r.firstTokenAt !== null);
  if (top.length === 0) return 0;
  const lastTop = Math.max(...top.map((r) => r.firstTokenAt as number));
  return rs.filter(
    (r) => r.cls !== first && r.status === 200 && r.firstTokenAt !== null && r.firstTokenAt < lastTop,
  ).length;
}

export function fmtS(x: number | null, digits = 2): string {
  return x === null ? "-" : x.toFixed(digits);
}
