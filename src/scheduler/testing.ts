/**
 * Builders for hand-made scheduler inputs, shared by the tests and the fleet simulator:
 * endpoint states, requests and a bare CycleState.
 */
import { Cycle } from "./cycle.ts";
import type { PrefixMatchInfo } from "./plugins/data.ts";
import { createRng } from "./rng.ts";
import type { EndpointMetrics, EndpointState, RequestFacts } from "./types.ts";

/** An endpoint with metrics (defaults: idle, fresh at t=0) unless `metrics` is null. */
export function endpoint(
  id: string,
  metrics: Partial<EndpointMetrics> | null = {},
  labels: Record<string, string> = {},
): EndpointState {
  return {
    id,
    address: id.split(":")[0],
    labels,
    metrics:
      metrics === null
        ? null
        : { waitingQueueSize: 0, runningRequestsSize: 0, kvCacheUsagePercent: 0, updateTime: 0, ...metrics },
  };
}

/** A completion request for `prompt`. */
export function completion(
  requestId: string,
  prompt: string,
  extra: Partial<RequestFacts> = {},
): RequestFacts {
  return {
    requestId,
    model: "m",
    prompt: { kind: "completion", prompt },
    stream: true,
    priority: 0,
    ...extra,
  };
}

/** A chat request with one system and one user message. */
export function chat(
  requestId: string,
  system: string,
  user: string,
  extra: Partial<RequestFacts> = {},
): RequestFacts {
  return {
    requestId,
    model: "m",
    prompt: {
      kind: "chat",
      messages: [
        { role: "system", content: system },
        { role: "user", content: user },
      ],
    },
    stream: true,
    priority: 0,
    ...extra,
  };
}

export function cycleFor(req: RequestFacts, candidates: readonly EndpointState[], now = 0, seed = 1): Cycle {
  return new Cycle(req, candidates, now, createRng(seed));
}

/** Hand-made prefix match info: `matches` maps endpoint id → matched blocks. */
export function prefixInfo(
  total: number,
  blockSizeTokens: number,
  matches: Record<string, number>,
): PrefixMatchInfo {
  return {
    totalBlocks: total,
    blockSizeTokens,
    promptTokens: total * blockSizeTokens,
    anyMatch: Object.values(matches).some((m) => m > 0),
    matchBlocks: (id) => matches[id] ?? 0,
    matches: () => new Map(Object.entries(matches).filter(([, m]) => m > 0)),
  };
}
