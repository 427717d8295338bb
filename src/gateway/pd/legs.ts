/**
 * One request as two legs, prefill on one replica and decode on another, the way llm-d's routing
 * sidecar runs NIXL v2 (llm-d/llm-d-router@ebab6879 `pkg/sidecar/proxy/connector_nixlv2.go`): the
 * prefill body (bodies.ts) to the prefiller (prefill-leg.ts), then the decode body with the prefiller's
 * kv_transfer_params to the decoder, its answer streamed back with cached_tokens rewritten. Both legs
 * carry one new x-request-id. `kvgate serve` and `kvgate pd-sidecar` share this code.
 *
 * Where kvgate differs from llm-d, loudly: every response says what happened in `x-kvgate-pd`
 * (`prefill-decode`, `fallback-<reason>`, `failed-<reason>`), and every fallback is counted
 * (kvgate_pd_fallbacks_total{reason}).
 *   - policy `recompute` (default): a prefill that fails (connection refused, reset, timeout, HTTP
 *     error, non-JSON) or answers without kv_transfer_params is served by a local prefill on the
 *     decoder (the decode body without kv_transfer_params), like vLLM's kv_load_failure_policy.
 *   - policy `fail` (llm-d's behaviour): a prefill status ≥ 400 goes to the client verbatim; an
 *     unreachable prefiller is a 502 and a timeout a 504. A 2xx without params still decodes locally,
 *     as llm-d does. Either way only 502/503/504 and lost connections are retried
 *     (--prefill-max-retries, --prefill-retry-backoff), and the prefill leg has a timeout: never a hang.
 *
 * Blocks stranded on the prefiller: vLLM's prefiller holds a length-capped prefill's blocks until a
 * decoder reads them, or its lease (30 s from v0.22) runs out. A client that leaves during the
 * prefill leg aborts it (the prefiller frees the blocks of an aborted request), but once the answer's
 * headers arrived the answer is read anyway. A client gone when the prefiller's kv_transfer_params
 * are in hand gets a one-token, non-streamed decode with them, run to its end: the decoder pulls the
 * blocks and the prefiller frees them once read. Aborting a decode that carries the params also
 * releases them in vLLM (`request_finished` on the decoder notifies the prefiller), but only if the
 * abort reaches an engine that has admitted the request, which an HTTP client cannot know; the
 * one-token decode does not depend on that timing. A client that leaves during the decode leg aborts
 * it, and vLLM's abort path notifies the prefiller.
 */
import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import type { Dispatcher } from "undici";
import { errorJson } from "../errors.ts";
import { responseGone } from "../h2c.ts";
import { forwardResponseHeaders } from "../headers.ts";
import { type AttemptFailure, type ForwardOutcome, type ForwardRequest, forward } from "../proxy.ts";
import {
  decodeBody,
  type JsonObject,
  type PdApi,
  prefillBody,
  readPrefillAnswer,
  releaseBody,
} from "./bodies.ts";
import { CachedTokensRewriter } from "./cached-tokens.ts";
import type { FallbackReason, PdMetrics } from "./metrics.ts";
import { describe, type PrefillResult, prefillLeg } from "./prefill-leg.ts";

export type PrefillFailurePolicy = "recompute" | "fail";

export interface PdLegOptions {
  /** What a failed prefill leg means: a local prefill on the decoder (recompute), or an error (fail). */
  failurePolicy: PrefillFailurePolicy;
  /** Retries of a prefill answered 502/503/504 or cut off (llm-d's --prefill-max-retries). */
  prefillMaxRetries: number;
  /** Between those retries (llm-d's --prefill-retry-backoff). */
  prefillRetryBackoffMs: number;
  /** Each prefill attempt must be answered in full within this. */
  prefillTimeoutMs: number;
}

export const DEFAULT_PD_LEG_OPTIONS: Readonly<PdLegOptions> = {
  failurePolicy: "recompute",
  prefillMaxRetries: 0,
  prefillRetryBackoffMs: 200,
  prefillTimeoutMs: 60_000,
};

/** The response header that says what the P/D path did with a request. */
export const PD_HEADER = "x-kvgate-pd";

/** The decode leg's forward() settings; body, headers and the client side are filled in here. */
export type DecodeLeg = Omit<
  ForwardRequest,
  "path" | "method" | "headers" | "body" | "signal" | "res" | "rewriter"
>;

export interface PdLegsRequest {
  api: PdApi;
  /** The request path (with any query), the same on both legs. */
  path: string;
  /** Headers for both legs (the client's, filtered); content-length and x-request-id are set here. */
  headers: Record<string, string | string[]>;
  /** The client's JSON body, parsed. */
  body: JsonObject;
  prefill: { id: string; pool: Dispatcher };
  decode: DecodeLeg;
  res: ServerResponse;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
  opts: PdLegOptions;
  metrics: PdMetrics;
  log(line: string): void;
  /** The prefiller could not be reached or read (health accounting). */
  onPrefillFailed?(f: AttemptFailure): void;
}

export interface PdLegsOutcome {
  out: ForwardOutcome;
  /** The x-kvgate-pd value sent, or null when the client left first. */
  pd: string | null;
}

const json = (o: JsonObject) => Buffer.from(JSON.stringify(o), "utf8");

/** The client left while the prefiller holds blocks for it: a one-token decode reads and frees them. */
async function release(r: PdLegsRequest, headers: Record<string, string | string[]>, kv: JsonObject) {
  const body = json(releaseBody(r.body, r.api, kv));
  const target = r.decode.targets[0] as string;
  let result = "failed";
  let detail = "";
  try {
    const up = await r.decode.pool(target).request({
      path: r.path,
      method: "POST",
      headers: { ...headers, "content-length": String(body.length) },
      body,
      signal: AbortSignal.timeout(r.opts.prefillTimeoutMs),
      headersTimeout: r.opts.prefillTimeoutMs,
      bodyTimeout: r.opts.prefillTimeoutMs,
    });
    await up.body.dump({ limit: 1 << 20 }).catch(() => {});
    if (up.statusCode < 400) result = "released";
    else detail = `: HTTP ${up.statusCode}`;
  } catch (err) {
    detail = `: ${describe(err)}`;
  }
  r.metrics.releases.inc({ result });
  r.log(
    result === "released"
      ? `kvgate: client left between the P/D legs; ${target} read the prefilled blocks from ${r.prefill.id} with a one-token decode`
      : `kvgate: client left between the P/D legs; releasing the blocks on ${r.prefill.id} through ${target} failed${detail}; the prefiller frees them when its lease expires`,
  );
}

/** Runs both legs and writes the answer (or error) to `r.res`. */
export async function runPdLegs(r: PdLegsRequest): Promise<PdLegsOutcome> {
  const headers: Record<string, string | string[]> = { ...r.headers, "x-request-id": randomUUID() };
  const pbody = json(prefillBody(r.body, r.api));
  const t0 = performance.now();
  const p = await prefillLeg(r, pbody, { ...headers, "content-length": String(pbody.length) });
  r.metrics.prefillDuration.observe((performance.now() - t0) / 1000);
  const m = r.metrics;
  if (p.kind === "client-gone") {
    m.prefillLegs.inc({ outcome: "client-gone" });
    return { out: { kind: "client-gone", endpoint: null }, pd: null };
  }
  let kv: JsonObject | undefined;
  let cached = 0;
  let pd = "prefill-decode";
  const fallback = (reason: FallbackReason, message: string) => {
    m.fallbacks.inc({ reason });
    pd = `fallback-${reason}`;
    r.log(`kvgate: P/D fallback (${reason}): ${message}; the decoder prefills locally`);
  };
  if (p.kind === "answer") {
    const a = readPrefillAnswer(p.json);
    if (a.kind === "params") {
      kv = a.params;
      cached = a.cachedTokens;
    } else if (a.kind === "incomplete") {
      kv = a.params; // verbatim, as llm-d does; vLLM's decoder ignores them and prefills
      fallback(
        "incomplete-kv-transfer-params",
        `${r.prefill.id} returned kv_transfer_params without ${a.missing.join(", ")}`,
      );
    } else {
      fallback(
        "no-kv-transfer-params",
        `${r.prefill.id} answered without kv_transfer_params (its one token ended the request, or it runs without NixlConnector)`,
      );
    }
  } else {
    if (p.failure) r.onPrefillFailed?.({ endpoint: r.prefill.id, kind: p.failure, message: p.message });
    if (r.opts.failurePolicy === "fail") {
      m.prefillFailures.inc({ reason: p.reason });
      m.prefillLegs.inc({ outcome: "failed" });
      pd = `failed-${p.reason}`;
      r.log(`kvgate: P/D prefill failed (${p.reason}): ${p.message}`);
      const bytes = writePrefillError(r.res, p, pd);
      return {
        out: { kind: "completed", endpoint: r.prefill.id, status: p.status, bytes, failures: [] },
        pd,
      };
    }
    fallback(p.reason, p.message);
  }
  if (r.signal.aborted) {
    // With incomplete params no decoder would read the blocks; the prefiller's lease frees them.
    if (kv && pd === "prefill-decode") await release(r, headers, kv);
    m.prefillLegs.inc({ outcome: "client-gone" });
    return { out: { kind: "client-gone", endpoint: null }, pd: null };
  }
  const decodeLeg = (withKv: boolean, passLastError: boolean | undefined) => {
    const dbody = json(decodeBody(r.body, withKv ? kv : undefined));
    if (!r.res.headersSent) r.res.setHeader(PD_HEADER, pd);
    return forward({
      ...r.decode,
      path: r.path,
      method: "POST",
      headers: { ...headers, "content-length": String(dbody.length) },
      body: dbody,
      signal: r.signal,
      res: r.res,
      passLastError,
      rewriter: withKv && pd === "prefill-decode" ? new CachedTokensRewriter(cached) : undefined,
    });
  };
  // recompute: a decoder that answers 5xx to the params before its first byte (vLLM's 500 for a KV
  // load that failed under kv_load_failure_policy "fail", e.g. the prefiller died) is asked once
  // more without them, so the request is still served, by a local prefill.
  const retryLocally = pd === "prefill-decode" && r.opts.failurePolicy === "recompute";
  let out = await decodeLeg(kv !== undefined, retryLocally ? false : r.decode.passLastError);
  if (
    retryLocally &&
    out.kind === "exhausted" &&
    out.failures.some((f) => f.kind === "status") &&
    !r.signal.aborted
  ) {
    const why = out.failures.map((f) => `${f.endpoint}: ${f.message}`).join("; ");
    fallback(
      "decode-kv-load-failed",
      `the decode leg with ${r.prefill.id}'s KV failed before its first byte (${why})`,
    );
    out = await decodeLeg(false, r.decode.passLastError);
  }
  m.prefillLegs.inc({ outcome: pd === "prefill-decode" ? "kv-transfer" : "fallback" });
  return { out, pd };
}

function writePrefillError(
  res: ServerResponse,
  p: Extract<PrefillResult, { kind: "failed" }>,
  pd: string,
): number {
  if (res.headersSent || responseGone(res)) return 0;
  if (p.verbatim) {
    const headers = forwardResponseHeaders(p.verbatim.headers);
    headers["content-length"] = p.verbatim.body.length;
    headers[PD_HEADER] = pd;
    res.writeHead(p.verbatim.status, headers).end(p.verbatim.body);
    return p.verbatim.body.length;
  }
  const body = errorJson(
    p.status,
    `${p.message}; the request was not sent to the decoder (prefill failure policy "fail"; use "recompute" to prefill on the decoder instead)`,
  );
  res
    .writeHead(p.status, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      [PD_HEADER]: pd,
    })
    .end(body);
  return Buffer.byteLength(body);
}
