/**
 * Goodput service-level objectives: parsing `ttft=2,tpot=0.05` and checking a request against
 * them (vllm bench serve and inference-perf: good = succeeded and within every objective set).
 */
import type { RequestMetrics } from "./request-metrics.ts";

/** Service-level objectives in seconds; a request is good when it succeeded and meets every one set. */
export interface Slo {
  ttft?: number;
  tpot?: number;
  e2e?: number;
}

/** Parses "ttft=2,tpot=0.05" (seconds; "ms" suffix accepted: "ttft=500ms"). */
export function parseSlo(text: string): Slo {
  const slo: Slo = {};
  for (const part of text
    .split(",")
    .map((p) => p.trim())
    .filter(Boolean)) {
    const m = /^(ttft|tpot|e2e)\s*[=:]\s*([0-9.eE+-]+)\s*(ms|s)?$/.exec(part);
    if (!m) throw new RangeError(`bad SLO "${part}" (expected ttft=SECONDS, tpot=SECONDS or e2e=SECONDS)`);
    const v = Number(m[2]) / (m[3] === "ms" ? 1000 : 1);
    if (!(v > 0) || !Number.isFinite(v)) throw new RangeError(`bad SLO value in "${part}"`);
    slo[m[1] as keyof Slo] = v;
  }
  return slo;
}

export function meetsSlo(m: RequestMetrics, slo: Slo): boolean {
  if (!m.ok) return false;
  if (slo.ttft !== undefined && !(m.ttft !== undefined && m.ttft <= slo.ttft)) return false;
  if (slo.tpot !== undefined && m.tpot !== undefined && m.tpot > slo.tpot) return false;
  if (slo.e2e !== undefined && !(m.e2e !== undefined && m.e2e <= slo.e2e)) return false;
  return true;
}
