/**
 * bench:ext-proc's demonstration of the ext_proc stream cap users hit behind Envoy: `requests`
 * simultaneous chat requests through the Envoy-like proxy (src/bench/ext-proc/proxy.ts) in front of
 * `kvgate epp`, once with the proxy's stream cap at Envoy's default circuit breaker (1,024
 * `max_requests` on the ext_proc cluster) and once raised as llm-d's reference Envoy raises it
 * (40,000). The fake endpoints hold every reply for a while, so all streams are open at once.
 * Reports how many requests got the proxy's 500 (the overflow, FailClose) and how many were served.
 */
import { Agent, request } from "undici";
import { startEnvoyLikeProxy } from "./proxy.ts";

export interface CapResult {
  cap: number;
  requests: number;
  served: number;
  /** Requests refused because the cap was reached (the proxy's 500s). */
  overflowed: number;
  /** Any other status, by code. */
  other: Record<string, number>;
}

export async function proxyCapDemo(o: {
  target: string;
  secure: boolean;
  requests: number;
  caps: number[];
  body: Buffer;
}): Promise<CapResult[]> {
  const out: CapResult[] = [];
  for (const cap of o.caps) {
    const proxy = await startEnvoyLikeProxy({ extProc: o.target, tls: o.secure, maxStreams: cap });
    const agent = new Agent({ connections: o.requests, keepAliveTimeout: 1_000 });
    const statuses: Record<string, number> = {};
    try {
      await Promise.all(
        Array.from({ length: o.requests }, async () => {
          let status = "error";
          try {
            const res = await request(`${proxy.url}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json" },
              body: o.body,
              dispatcher: agent,
              headersTimeout: 600_000,
              bodyTimeout: 600_000,
            });
            await res.body.text();
            status = String(res.statusCode);
          } catch (e) {
            status = (e as { code?: string }).code ?? "error";
          }
          statuses[status] = (statuses[status] ?? 0) + 1;
        }),
      );
    } finally {
      await agent.close();
      await proxy.close();
    }
    const { 200: ok = 0, ...rest } = statuses;
    const overflowed = proxy.stats.overflows;
    const other = { ...rest };
    if (other["500"] !== undefined) other["500"] -= overflowed;
    if (other["500"] === 0) delete other["500"];
    out.push({ cap, requests: o.requests, served: ok, overflowed, other });
  }
  return out;
}
