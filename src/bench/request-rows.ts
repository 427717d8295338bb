/**
 * One row per request of a run, for reading a run request by request (`kvgate simulate --records
 * FILE`, JSON Lines): which replica served it, when it was sent, its TTFT and E2E as the run's
 * aggregates count them (request-metrics.ts), its prompt, cached and output tokens, and its error.
 * bench:default-verdict pools the rows of several draws to read a router's TTFT percentiles.
 */
import { type RequestRecord, requestMetrics } from "./request-metrics.ts";

export interface RequestRow {
  router: string;
  id: string;
  /** The arrival stage's index and whether it is a warm-up stage (staged workloads only). */
  stage?: number;
  warmup?: boolean;
  endpoint?: string;
  /** Send time, workload seconds from the run's start. */
  start_s: number;
  /** Absent for a failed request, or one that never streamed a token. */
  ttft_s?: number;
  e2e_s?: number;
  prompt_tokens: number;
  cached_tokens?: number;
  output_tokens: number;
  /** The failure's kind (http_429, timeout, …); absent for a success. */
  error?: string;
}

export function requestRows(router: string, records: readonly RequestRecord[]): RequestRow[] {
  return records.map((r) => {
    const m = requestMetrics(r, false);
    return {
      router,
      id: r.id,
      ...(r.stage !== undefined ? { stage: r.stage, warmup: r.warmup === true } : {}),
      ...(r.endpoint !== undefined ? { endpoint: r.endpoint } : {}),
      start_s: r.start,
      ...(m.ttft !== undefined ? { ttft_s: m.ttft } : {}),
      ...(m.e2e !== undefined ? { e2e_s: m.e2e } : {}),
      prompt_tokens: r.promptTokens,
      ...(r.cachedTokens !== undefined ? { cached_tokens: r.cachedTokens } : {}),
      output_tokens: m.tokensOut,
      ...(r.error !== undefined ? { error: r.error.kind } : {}),
    };
  });
}

/** JSON Lines: one row per line, newline-terminated. */
export function rowsJsonl(rows: readonly RequestRow[]): string {
  let out = "";
  for (const r of rows) out += `${JSON.stringify(r)}\n`;
  return out;
}

/** Parses JSON Lines written by rowsJsonl; a line that is not a row says which line and file. */
export function parseRowsJsonl(text: string, source: string): RequestRow[] {
  const rows: RequestRow[] = [];
  const lines = text.split("\n");
  for (const [i, line] of lines.entries()) {
    if (line.trim() === "") continue;
    let r: unknown;
    try {
      r = JSON.parse(line);
    } catch (e) {
      throw new Error(
        `${source}:${i + 1}: not JSON (${(e as Error).message}); expected one request row per line`,
      );
    }
    const row = r as Partial<RequestRow>;
    if (typeof row?.router !== "string" || typeof row.start_s !== "number")
      throw new Error(
        `${source}:${i + 1}: not a request row (needs router and start_s); write it with kvgate simulate --records`,
      );
    rows.push(row as RequestRow);
  }
  return rows;
}
