/**
 * Whether a finished bench run counts as a failure (`kvgate bench` then exits 1): no request was
 * sent, or the share of requests that failed is above --max-error-rate (default 0.05). Requests
 * cut off by --max-duration or Ctrl-C are not failures of the target and are left out. The
 * message names the commonest error kinds, a sample message and, per kind, what to do. Pure.
 */
import type { RequestRecord } from "./metrics.ts";

export const DEFAULT_MAX_ERROR_RATE = 0.05;

/** What to do about each error kind the driver records (see driver.ts). */
function hint(kind: string, targets: string[]): string {
  const where = targets.join(", ");
  if (kind === "connect")
    return `nothing accepted the connection at ${where}: is the server up, and is the URL right?`;
  if (kind === "timeout") return "requests outlived --request-timeout: raise it, or lower --rate / --users";
  if (kind === "socket") return "connections were dropped mid-request: see the target's log";
  if (kind === "stream") return "the stream carried an error event: see the message";
  if (kind === "incomplete")
    return "streams ended without [DONE]: the target (or a proxy) cut them; see its log";
  if (kind === "http_404")
    return "the target does not serve this model or route: check --model (GET /v1/models lists the names)";
  if (kind === "http_400" || kind === "http_422")
    return "the target rejected the request: see the message (a field from --extra-body, or max_tokens above its max_model_len?)";
  if (kind === "http_401" || kind === "http_403") return "the target wants credentials bench does not send";
  if (kind === "http_429" || kind === "http_503")
    return "the target is shedding load: lower --rate (or --users), or give it more replicas";
  if (kind.startsWith("http_5")) return "the target failed: see its log";
  return "see the message";
}

export interface Verdict {
  failed: boolean;
  /** Requests that count: every record but those cut off by the bench itself. */
  counted: number;
  errors: number;
  message?: string;
}

export function judgeRun(records: RequestRecord[], maxErrorRate: number, targets: string[]): Verdict {
  const counted = records.filter((r) => r.error?.kind !== "cutoff");
  const failed = counted.filter((r) => r.error);
  if (records.length === 0)
    return {
      failed: true,
      counted: 0,
      errors: 0,
      message:
        "no request was sent: --max-duration or --max-requests stopped the run first, or it was interrupted",
    };
  if (counted.length === 0)
    return {
      failed: true,
      counted: 0,
      errors: 0,
      message: `all ${records.length} requests were cut off before they finished: raise --max-duration`,
    };
  const share = failed.length / counted.length;
  if (share <= maxErrorRate) return { failed: false, counted: counted.length, errors: failed.length };
  const byKind = new Map<string, RequestRecord[]>();
  for (const r of failed) {
    const k = r.error?.kind ?? "other";
    byKind.set(k, [...(byKind.get(k) ?? []), r]);
  }
  const kinds = [...byKind.entries()].sort((a, b) => b[1].length - a[1].length);
  const lines = kinds.slice(0, 3).map(([kind, rs]) => {
    const sample = (rs[0].error?.message ?? "").replace(/\s+/g, " ").trim().slice(0, 160);
    return `  ${kind} × ${rs.length}${sample ? `: ${sample}` : ""}\n    → ${hint(kind, targets)}`;
  });
  const pct = (x: number) => `${(x * 100).toFixed(x < 0.1 ? 1 : 0)}%`;
  return {
    failed: true,
    counted: counted.length,
    errors: failed.length,
    message:
      `${failed.length} of ${counted.length} requests failed (${pct(share)}, above --max-error-rate ` +
      `${maxErrorRate}):\n${lines.join("\n")}`,
  };
}
