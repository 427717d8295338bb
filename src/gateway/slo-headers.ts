/**
 * The request's latency SLOs from llm-d's headers (llm-d/llm-d-router pkg/epp/metadata: current
 * name first, then the deprecated alias): `x-llm-d-slo-ttft-ms` / `x-slo-ttft-ms` and
 * `x-llm-d-slo-tpot-ms` / `x-slo-tpot-ms`, milliseconds. A value that is not a positive finite
 * number is ignored, as llm-d's predicted-latency-producer ignores a value it cannot parse (it logs
 * it and schedules as if no SLO were set); kvgate also ignores 0, negatives and infinities, which
 * llm-d would take as an SLO no endpoint meets, and says so on /explain.
 */
import type { IncomingHttpHeaders } from "node:http";
import type { RequestFacts } from "../scheduler/types.ts";
import { headerValue } from "./headers.ts";

export const SLO_HEADERS = {
  ttft: ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"],
  tpot: ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"],
} as const;

export interface SloHeaders {
  sloTtftMs?: number;
  sloTpotMs?: number;
  /** Values ignored, each saying which header, what it held and what to send instead. */
  notes: string[];
}

export function parseSloHeaders(headers: IncomingHttpHeaders): SloHeaders {
  const out: SloHeaders = { notes: [] };
  for (const which of ["ttft", "tpot"] as const) {
    for (const name of SLO_HEADERS[which]) {
      const raw = headerValue(headers, name);
      if (raw === undefined) continue;
      const t = raw.trim();
      const v = t === "" ? Number.NaN : Number(t);
      if (Number.isFinite(v) && v > 0) {
        if (which === "ttft") out.sloTtftMs = v;
        else out.sloTpotMs = v;
      } else {
        out.notes.push(
          `${name}: ${JSON.stringify(raw.slice(0, 64))} ignored (send a positive number of milliseconds, e.g. 500)`,
        );
      }
      break; // the current name wins over its alias, as llm-d's GetLowerCaseHeaderValue
    }
  }
  return out;
}

/** Sets the parsed SLOs (and the notes on ignored values) on the request's facts. */
export function applySloHeaders(facts: RequestFacts, headers: IncomingHttpHeaders): void {
  const s = parseSloHeaders(headers);
  if (s.sloTtftMs !== undefined) facts.sloTtftMs = s.sloTtftMs;
  if (s.sloTpotMs !== undefined) facts.sloTpotMs = s.sloTpotMs;
  if (s.notes.length > 0) facts.sloHeaderNotes = s.notes;
}
