/**
 * Token usage of a response flow control dispatched, reported back to its gate when it ends, so
 * token-weighted fairness (vtc-fairness-policy) charges what the flow was actually served: the
 * OpenAI `usage` block's prompt and completion tokens, or for a stream without one, one output
 * token per data event. `kvgate serve` watches what it writes to the client; `kvgate epp` passes
 * what its ext_proc response scanner found.
 */
import type { ServerResponse } from "node:http";
import { UsageScanner } from "./ext-proc/response-body.ts";
import { flowGateOf } from "./flow-gate.ts";
import type { Gateway } from "./gateway.ts";
import type { Routing } from "./routing.ts";

/** A decided request's response ended: its usage (scanned from the body) goes to its gate. */
export function reportUsage(
  gw: Gateway,
  routing: Routing,
  requestId: string,
  usage: { promptTokens: number | null; completionTokens: number | null },
  events = 0,
): void {
  const gate = flowGateOf(gw, routing);
  if (gate === null) return;
  gate.finished(requestId, {
    outputTokens: usage.completionTokens ?? events,
    ...(usage.promptTokens === null ? {} : { promptTokens: usage.promptTokens }),
  });
}

/** What watchUsage() saw: the output tokens so far (for the scheduler's hooks) and the gate report. */
export interface UsageWatch {
  /** usage.completion_tokens, else one per data event; undefined when not watched. */
  outputTokens(): number | undefined;
  /** Reports the usage to the request's flow-control gate (a no-op without one). */
  report(): void;
}

/**
 * SSE data lines in `text` other than `data: [DONE]` (a line starts the text or follows a newline):
 * the regex /(^|\n)data: ?(?!\[DONE\])/g, counted without building a match array per write.
 */
export function dataEvents(text: string): number {
  let n = 0;
  for (let i = text.indexOf("data:"); i >= 0; i = text.indexOf("data:", i + 5)) {
    if (i > 0 && text.charCodeAt(i - 1) !== 10) continue;
    const v = text.charCodeAt(i + 5) === 32 ? i + 6 : i + 5;
    if (!text.startsWith("[DONE]", v)) n++;
  }
  return n;
}

const UNWATCHED: UsageWatch = { outputTokens: () => undefined, report: () => {} };

/**
 * Watches what the gateway writes to the client for the response's usage, for the request's
 * flow-control gate and for scheduler plugins that learn from output tokens (the latency
 * predictor's TPOT); neither configured, nothing is watched. A stream without a usage block counts
 * one output token per data event.
 */
export function watchUsage(
  gw: Gateway,
  routing: Routing,
  requestId: string,
  res: ServerResponse,
): UsageWatch {
  if (flowGateOf(gw, routing) === null && !routing.scheduler.wantsResponseUsage) return UNWATCHED;
  const usage = new UsageScanner();
  let events = 0;
  const scan = (chunk: unknown) => {
    if (typeof chunk !== "string" && !(chunk instanceof Uint8Array)) return;
    const b =
      typeof chunk === "string"
        ? Buffer.from(chunk)
        : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length);
    const text = b.toString("latin1");
    usage.pushText(text);
    events += dataEvents(text);
  };
  const write = res.write.bind(res) as (...a: unknown[]) => boolean;
  res.write = ((...a: unknown[]) => {
    scan(a[0]);
    return write(...a);
  }) as typeof res.write;
  const end = res.end.bind(res) as (...a: unknown[]) => ServerResponse;
  res.end = ((...a: unknown[]) => {
    if (typeof a[0] !== "function") scan(a[0]);
    return end(...a);
  }) as typeof res.end;
  return {
    outputTokens: () => usage.completionTokens ?? events,
    report: () => reportUsage(gw, routing, requestId, usage, events),
  };
}
