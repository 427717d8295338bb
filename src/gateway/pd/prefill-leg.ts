/**
 * The prefill leg of a P/D request (legs.ts): POST the prefill body to the prefiller and read its
 * whole JSON answer, within --prefill-timeout per attempt, retrying 502/503/504 and lost connections
 * up to --prefill-max-retries times with --prefill-retry-backoff between (llm-d/llm-d-router@ebab6879
 * `connector_nixlv2.go` retries the same statuses). A client that leaves before the answer's headers
 * aborts the attempt (vLLM frees an aborted request's blocks); after them the answer is read anyway,
 * so kvgate learns of blocks it must release. Every failure comes back classified for the fallback
 * reason, the health report and, under the fail policy, the client's error.
 */
import type { Dispatcher } from "undici";
import type { RequestFailureKind } from "../../datalayer/datastore.ts";
import { classify } from "../proxy.ts";
import type { JsonObject } from "./bodies.ts";
import type { PdLegsRequest } from "./legs.ts";
import type { FallbackReason } from "./metrics.ts";

export type PrefillResult =
  | { kind: "answer"; json: JsonObject }
  | {
      kind: "failed";
      reason: FallbackReason;
      message: string;
      /** For health accounting; absent when the prefiller answered (an HTTP error). */
      failure?: RequestFailureKind;
      retryable: boolean;
      /** fail policy: the prefiller's error answer, or the status of the error kvgate writes. */
      verbatim?: { status: number; headers: Record<string, string | string[] | undefined>; body: Buffer };
      status: number;
    }
  | { kind: "client-gone" };

/** Larger prefill answers are not JSON kvgate can use (one token and some usage numbers). */
const MAX_PREFILL_ANSWER = 4 * 1024 * 1024;

export const describe = (err: unknown) => {
  const e = err as { code?: string; message?: string };
  return e.code ? `${e.code}: ${e.message}` : String(e.message ?? err);
};

async function readAll(body: Dispatcher.ResponseData["body"], limit: number): Promise<Buffer | null> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of body) {
    n += (c as Buffer).length;
    if (n > limit) {
      body.destroy();
      return null;
    }
    parts.push(c as Buffer);
  }
  return Buffer.concat(parts);
}

async function prefillOnce(
  r: PdLegsRequest,
  body: Buffer,
  headers: Record<string, string | string[]>,
): Promise<PrefillResult> {
  if (r.signal.aborted) return { kind: "client-gone" };
  const ac = new AbortController();
  let answered = false;
  let timedOut = false;
  const onGone = () => {
    if (!answered) ac.abort(new Error("client disconnected"));
  };
  r.signal.addEventListener("abort", onGone, { once: true });
  const timer = setTimeout(() => {
    timedOut = true;
    ac.abort(new Error("prefill timeout"));
  }, r.opts.prefillTimeoutMs);
  const where = `prefill leg to ${r.prefill.id}`;
  try {
    const up = await r.prefill.pool.request({
      path: r.path,
      method: "POST",
      headers,
      body,
      signal: ac.signal,
      headersTimeout: r.opts.prefillTimeoutMs,
      bodyTimeout: r.opts.prefillTimeoutMs,
    });
    answered = true;
    up.body.on("error", () => {});
    const text = await readAll(up.body, MAX_PREFILL_ANSWER);
    const status = up.statusCode;
    if (status >= 400) {
      const excerpt = (text ?? Buffer.alloc(0)).toString("utf8").slice(0, 300);
      return {
        kind: "failed",
        reason: "prefill-error",
        message: `${where}: HTTP ${status}: ${excerpt}`,
        retryable: status === 502 || status === 503 || status === 504,
        failure: status >= 500 ? "status" : undefined,
        verbatim: text ? { status, headers: up.headers, body: text } : undefined,
        status,
      };
    }
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text.toString("utf8")) : undefined;
    } catch {
      parsed = undefined;
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      return {
        kind: "failed",
        reason: "prefill-invalid-response",
        message: `${where}: HTTP ${status} whose body is not a JSON object${text ? "" : " (or larger than 4 MiB)"}`,
        retryable: false,
        status: 502,
      };
    return { kind: "answer", json: parsed as JsonObject };
  } catch (err) {
    if (timedOut || classify(err) === "timeout")
      return {
        kind: "failed",
        reason: "prefill-timeout",
        message: `${where}: no complete answer within ${r.opts.prefillTimeoutMs} ms`,
        failure: "timeout",
        retryable: false,
        status: 504,
      };
    if (r.signal.aborted) return { kind: "client-gone" };
    const kind = classify(err);
    return {
      kind: "failed",
      reason: kind === "connect" ? "prefill-unreachable" : "prefill-error",
      message: `${where}: ${describe(err)}`,
      failure: kind,
      retryable: true,
      status: 502,
    };
  } finally {
    clearTimeout(timer);
    r.signal.removeEventListener("abort", onGone);
  }
}

/** Resolves true after `ms`, or false as soon as the client leaves. */
function pause(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const done = (ok: boolean) => {
      clearTimeout(t);
      signal.removeEventListener("abort", gone);
      resolve(ok);
    };
    const gone = () => done(false);
    const t = setTimeout(() => done(true), ms);
    signal.addEventListener("abort", gone, { once: true });
  });
}

export async function prefillLeg(
  r: PdLegsRequest,
  body: Buffer,
  headers: Record<string, string | string[]>,
): Promise<PrefillResult> {
  for (let attempt = 0; ; attempt++) {
    const p = await prefillOnce(r, body, headers);
    if (p.kind !== "failed" || !p.retryable || attempt >= r.opts.prefillMaxRetries) return p;
    if (p.failure) r.onPrefillFailed?.({ endpoint: r.prefill.id, kind: p.failure, message: p.message });
    r.metrics.prefillRetries.inc();
    r.log(`kvgate: ${p.message}; retry ${attempt + 1} of ${r.opts.prefillMaxRetries}`);
    if (!(await pause(r.opts.prefillRetryBackoffMs, r.signal))) return { kind: "client-gone" };
  }
}
