/**
 * Per-request benchmark metrics, pure. Definitions (inference-perf docs/metrics.md, vllm bench
 * serve): TTFT = first non-empty chunk − send; E2E = end of stream − send; TPOT = (E2E − TTFT)/(out − 1),
 * only for out > 1; ITL is chunk-aware: a chunk carrying k tokens Δt after the previous chunk
 * contributes k gaps of Δt/k, and tokens that came in the first chunk beyond the first token
 * contribute gaps of 0, so the gaps sum to last − first token time and number out − 1. Times are
 * workload seconds (simulated seconds under a time scale).
 */

export interface RequestError {
  /** e.g. "http_429", "http_503", "connect", "timeout", "stream", "incomplete", "cutoff". */
  kind: string;
  message: string;
  status?: number;
  /** x-llm-d-request-dropped-reason of a gateway rejection (e.g. rejected-saturated). */
  reason?: string;
}

export interface RequestRecord {
  id: string;
  stage?: number;
  warmup?: boolean;
  /** Send time. */
  start: number;
  /** End of the response stream (or of the failure). */
  end: number;
  /**
   * Arrival time of each content chunk, ascending, and the output tokens it carried. Typed arrays
   * in the driver: a 17k-request sweep of 1,000-token answers is 17M chunks.
   */
  chunkTimes: ArrayLike<number>;
  chunkTokens: ArrayLike<number>;
  promptTokens: number;
  /** usage.completion_tokens, else the sum over chunks. */
  completionTokens: number;
  /** usage.prompt_tokens_details.cached_tokens when the server reports it. */
  cachedTokens?: number;
  error?: RequestError;
  /** The endpoint that served it, when known (the fleet simulator records it). */
  endpoint?: string;
  /**
   * Seconds the response took to travel back to the client after the times above were taken (the
   * simulator's cross-region hop): added to TTFT and E2E, not to inter-token gaps.
   */
  networkDelay?: number;
}

export interface RequestMetrics {
  ok: boolean;
  ttft?: number;
  tpot?: number;
  e2e?: number;
  /** Inter-token gaps (empty unless asked for). */
  itls: number[];
  tokensIn: number;
  tokensOut: number;
}

/** Calls `fn` with each chunk-aware inter-token gap of a successful request (out − 1 of them). */
export function forEachItl(r: RequestRecord, fn: (gap: number) => void): void {
  if (r.error) return;
  const { chunkTimes: ts, chunkTokens: ks } = r;
  let prev = -1;
  for (let i = 0; i < ts.length; i++) {
    const k = ks[i];
    if (k <= 0) continue;
    const gap = prev < 0 ? 0 : (ts[i] - ts[prev]) / k;
    for (let j = prev < 0 ? 1 : 0; j < k; j++) fn(gap);
    prev = i;
  }
}

/** TTFT, TPOT, E2E and token counts of one request; `withItls` also lists its gaps. */
export function requestMetrics(r: RequestRecord, withItls = true): RequestMetrics {
  const ok = r.error === undefined;
  const tokensOut = r.completionTokens;
  const m: RequestMetrics = { ok, itls: [], tokensIn: r.promptTokens, tokensOut };
  if (!ok) return m;
  const back = r.networkDelay ?? 0;
  m.e2e = r.end - r.start + back;
  let first = -1;
  for (let i = 0; i < r.chunkTimes.length && first < 0; i++) if (r.chunkTokens[i] > 0) first = i;
  if (first < 0) return m;
  m.ttft = r.chunkTimes[first] - r.start + back;
  if (withItls) forEachItl(r, (g) => m.itls.push(g));
  if (tokensOut > 1) m.tpot = (m.e2e - m.ttft) / (tokensOut - 1);
  return m;
}
