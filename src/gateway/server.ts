/**
 * The public front door (node:http): POST /v1/completions, /v1/chat/completions, /v1/embeddings
 * and GET /v1/models. Per request: bounded body read → the decision shared with `kvgate epp`
 * (decide.ts: one JSON decode, candidates, admission, scheduling) → forwarding of the original bytes
 * with failover, reporting the response to the scheduler. When the scheduler split the request into
 * prefill and decode (a disagg-profile-handler config), the gateway runs both legs itself
 * (pd/legs.ts), or with pdLegs "sidecar" leaves them to the decode pod's sidecar and only names the
 * prefiller in x-prefiller-host-port. Every failure is an OpenAI error
 * with llm-d's status and drop-reason header (llm-d/llm-d-router@ebab6879 `pkg/common/error/error.go`);
 * nothing a client sends can crash
 * the process or steer the pick through llm-d's routing headers.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import { promptTokensOf } from "./autoscale.ts";
import { type DecideOptions, decide, splitId } from "./decide.ts";
import { GatewayError, sendError } from "./errors.ts";
import { prefilledFlow } from "./flow-gate.ts";
import { watchUsage } from "./flow-usage.ts";
import type { Gateway } from "./gateway.ts";
import { closedEarly, closeSessionAfter, isHttp2 } from "./h2c.ts";
import { forwardRequestHeaders, SERVED_ENDPOINT_HEADER } from "./headers.ts";
import type { Outcome } from "./metrics.ts";
import { armMigration, wantsMigration } from "./migrate-wiring.ts";
import type { JsonObject } from "./pd/bodies.ts";
import { pdApiOf } from "./pd/bodies.ts";
import { DEFAULT_PD_LEG_OPTIONS, PD_HEADER, runPdLegs } from "./pd/legs.ts";
import { type AttemptFailure, type ForwardRequest, forward } from "./proxy.ts";
import { type ApiRoute, readBody } from "./request-body.ts";
import { encodeSessionToken } from "./routing.ts";

const ROUTES: Record<string, ApiRoute> = {
  "/v1/completions": "completions",
  "/v1/chat/completions": "chat",
  "/v1/embeddings": "embeddings",
};

/** The public routes, named in a 404 so the client sees what this port serves (here and at the multi-pool front door). */
export const SERVED_ROUTES =
  "use POST /v1/completions, /v1/chat/completions or /v1/embeddings, or GET /v1/models or /health (the admin API is on the admin port)";

export function handlePublic(gw: Gateway, req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? "/").split("?")[0];
  const route = ROUTES[path];
  const done = (status: number, outcome: Outcome) =>
    gw.metrics.httpRequests.inc({
      route: route ?? (path === "/v1/models" || path === "/health" ? path : "other"),
      status: String(status),
      outcome,
    });
  if (gw.connections.rejects(req.socket)) {
    req.resume();
    // HTTP/2 has no `connection: close`: the session gets a GOAWAY once this stream is answered.
    if (isHttp2(res)) closeSessionAfter(res);
    else res.setHeader("connection", "close");
    sendError(
      res,
      new GatewayError(
        503,
        `too many open connections (limit ${gw.connections.max}); retry with backoff, reuse connections, or raise --max-connections`,
      ),
    );
    done(503, "rejected");
    return;
  }
  if (route && req.method === "POST") {
    proxyRequest(gw, route, req, res).catch((err) => {
      gw.log(`kvgate: internal error on ${path}: ${(err as Error).stack ?? err}`);
      sendError(res, new GatewayError(500, "internal gateway error"));
      if (!res.writableEnded) res.destroy();
      done(500, "upstream-error");
    });
    return;
  }
  if ((path === "/v1/models" || path === "/health") && req.method === "GET") {
    res.once("finish", () => done(res.statusCode, res.statusCode < 400 ? "success" : "rejected"));
    if (path === "/health")
      res.writeHead(gw.draining ? 503 : 200, { "content-type": "application/json" }).end("{}");
    else listModels(gw, res).catch(() => sendError(res, new GatewayError(500, "internal gateway error")));
    return;
  }
  const known = route !== undefined || path === "/v1/models" || path === "/health";
  const allow = route ? "POST" : "GET";
  const err = known
    ? new GatewayError(405, `Method ${req.method} is not allowed on ${path}; use ${allow}`, {
        headers: { allow },
      })
    : new GatewayError(404, `No route for ${req.method} ${path}; ${SERVED_ROUTES}`);
  sendError(res, err);
  req.resume();
  done(err.status, err.status === 404 ? "not-found" : "bad-request");
}

/**
 * A request whose body another front door already read and decoded (the multi-pool front,
 * multi-pool/front.ts), handled by this gateway's pool as if it had arrived here.
 */
export interface PrereadRequest {
  body: Buffer;
  pre: NonNullable<DecideOptions["pre"]>;
  /** InferenceObjective priorities from the pool's cluster; default the config's. */
  objectives?: ReadonlyMap<string, number>;
}

/** handlePublic's POST path for a pre-read request; never rejects. */
export function proxyPreread(
  gw: Gateway,
  route: ApiRoute,
  req: IncomingMessage,
  res: ServerResponse,
  pre: PrereadRequest,
): Promise<void> {
  return proxyRequest(gw, route, req, res, pre).catch((err) => {
    gw.log(`kvgate: internal error on ${req.url}: ${(err as Error).stack ?? err}`);
    sendError(res, new GatewayError(500, "internal gateway error"));
    if (!res.writableEnded) res.destroy();
    gw.metrics.httpRequests.inc({ route, status: "500", outcome: "upstream-error" });
  });
}

async function proxyRequest(
  gw: Gateway,
  route: ApiRoute,
  req: IncomingMessage,
  res: ServerResponse,
  preread?: PrereadRequest,
): Promise<void> {
  const t0 = performance.now();
  const count = (status: number, outcome: Outcome) =>
    gw.metrics.httpRequests.inc({ route, status: String(status), outcome });
  const reject = (err: GatewayError, outcome: Outcome) => {
    sendError(res, err);
    count(err.status, outcome);
  };
  if (gw.draining)
    return reject(
      new GatewayError(503, "the gateway is shutting down; retry on another replica", {
        reason: "rejected-shutting-down",
      }),
      "rejected",
    );
  if (gw.active >= gw.opts.maxConcurrentRequests) {
    if (!preread) req.resume();
    return reject(
      new GatewayError(
        503,
        `too many concurrent requests (limit ${gw.opts.maxConcurrentRequests}); retry with backoff or raise --max-concurrent-requests`,
      ),
      "rejected",
    );
  }
  gw.active++;
  res.once("close", () => gw.active--);
  const ac = new AbortController();
  res.once("close", () => {
    if (closedEarly(res)) ac.abort(new Error("client disconnected"));
  });

  let body: Buffer;
  if (preread) body = preread.body;
  else
    try {
      body = await readBody(req, gw.opts.maxBodyBytes);
    } catch (err) {
      if (!(err instanceof GatewayError)) throw err;
      if (ac.signal.aborted) return count(499, "client-disconnect");
      return reject(err, "bad-request");
    }
  const d = await decide(gw, route, body, req.headers, {
    signal: ac.signal,
    pre: preread?.pre,
    objectives: preread?.objectives,
  });
  if (!d.ok) {
    if (ac.signal.aborted) return count(499, "client-disconnect");
    return reject(d.error, d.outcome);
  }
  const { facts, labels, targets, prefillHost, pdDecision, pdFallback, routing } = d.decision;
  const m = gw.metrics;
  const target = { id: targets[0] };
  if (d.decision.body) body = d.decision.body;
  const fail = (err: GatewayError, outcome: Outcome) => {
    m.requestErrorTotal.inc({ ...labels, error_code: err.code });
    reject(err, outcome);
  };
  const headers = forwardRequestHeaders(req.headers);
  if (!headers["x-request-id"]) headers["x-request-id"] = randomUUID();
  headers["content-length"] = String(body.length);
  const sidecarLegs = gw.opts.pdLegs === "sidecar";
  const pdApi = prefillHost !== null && !sidecarLegs ? pdApiOf(req.url ?? "/") : null;
  if (prefillHost !== null && sidecarLegs) headers["x-prefiller-host-port"] = prefillHost;
  // No legs run here: the decision says why (decode-only, aggregated-fallback; an embeddings request
  // the decider split is still decoded on one endpoint).
  else if (pdFallback !== null) res.setHeader(PD_HEADER, `fallback-${pdFallback}`);
  else if (pdDecision !== null && pdApi === null)
    res.setHeader(PD_HEADER, pdDecision === "prefill-decode" ? "decode-only" : pdDecision);

  m.requestRunning.inc(labels);
  const promptTokens = promptTokensOf(facts);
  gw.autoscale?.arrived(promptTokens);
  const usageSeen = watchUsage(gw, routing, facts.requestId, res);
  let served: string | null = null;
  let firstByteAt = 0;
  let out: Awaited<ReturnType<typeof forward>>;
  const reportFailure = (f: AttemptFailure) => {
    gw.traffic.failure(f.endpoint);
    m.upstreamFailures.inc({ endpoint: f.endpoint, kind: f.kind });
    gw.data.store.reportRequestFailure(f.endpoint, f.kind, f.message, monotonicSeconds());
  };
  try {
    const fwd: ForwardRequest = {
      path: req.url ?? "/",
      method: "POST",
      headers,
      body,
      targets,
      maxAttempts: gw.opts.maxAttempts,
      signal: ac.signal,
      res,
      headersTimeoutMs: gw.opts.upstreamHeadersTimeoutMs,
      bodyTimeoutMs: gw.opts.upstreamBodyTimeoutMs,
      pool: (id) => gw.pool(id),
      onAttempt: (id, attempt) => {
        gw.traffic.attempt(id, attempt);
        if (attempt === 0) return; // the pick itself was counted as status "success" above
        const [h, p] = splitId(id);
        m.schedulerAttempts.inc({
          status: "retry",
          target_model_name: labels.target_model_name,
          endpoint_name: h,
          namespace: "",
          port: p,
        });
      },
      onAttemptFailed: reportFailure,
      onStarted: (id, status) => {
        served = id;
        firstByteAt = performance.now();
        if (status < 500) gw.data.store.reportRequestSuccess(id);
        if (gw.opts.servedEndpointHeader) res.setHeader(SERVED_ENDPOINT_HEADER, id);
        if (routing.sessionTokenHeader) res.setHeader(routing.sessionTokenHeader, encodeSessionToken(id));
        routing.scheduler.onResponseStarted(facts, id, monotonicSeconds());
        prefilledFlow(gw, routing, facts.requestId);
      },
    };
    // Mid-stream migration: not for P/D legs (their decode leg's KV came from the prefiller).
    if (prefillHost === null && facts.stream && wantsMigration(gw, req.headers))
      armMigration(gw, route, facts.model, body, fwd, reportFailure, (id) => {
        served = id;
        gw.traffic.attempt(id, 1);
      });
    if (prefillHost !== null && pdApi !== null) {
      const o = gw.opts;
      out = (
        await runPdLegs({
          api: pdApi,
          path: fwd.path,
          headers,
          body: JSON.parse(body.toString("utf8")) as JsonObject,
          prefill: { id: prefillHost, pool: gw.pool(prefillHost) },
          decode: fwd,
          res,
          signal: ac.signal,
          opts: {
            failurePolicy: o.prefillFailurePolicy ?? DEFAULT_PD_LEG_OPTIONS.failurePolicy,
            prefillMaxRetries: o.prefillMaxRetries ?? DEFAULT_PD_LEG_OPTIONS.prefillMaxRetries,
            prefillRetryBackoffMs: o.prefillRetryBackoffMs ?? DEFAULT_PD_LEG_OPTIONS.prefillRetryBackoffMs,
            prefillTimeoutMs: o.prefillTimeoutMs ?? DEFAULT_PD_LEG_OPTIONS.prefillTimeoutMs,
          },
          metrics: m.pd,
          log: gw.log,
          onPrefillFailed: reportFailure,
        })
      ).out;
    } else out = await forward(fwd);
  } finally {
    routing.scheduler.onResponseComplete(facts, served ?? target.id, monotonicSeconds(), {
      outputTokens: usageSeen.outputTokens(),
    });
    m.requestRunning.dec(labels);
    usageSeen.report();
    gw.autoscale?.finished({
      promptTokens,
      outputTokens: usageSeen.outputTokens() ?? null,
      ttft: firstByteAt ? (firstByteAt - t0) / 1000 : null,
      e2e: (performance.now() - t0) / 1000,
    });
  }
  if (firstByteAt) m.ttft.observe({ ...labels, streaming: String(facts.stream) }, (firstByteAt - t0) / 1000);
  switch (out.kind) {
    case "completed":
      m.requestDuration.observe(labels, (performance.now() - t0) / 1000);
      m.responseSize.observe(labels, out.bytes);
      if (out.status >= 400) m.requestErrorTotal.inc({ ...labels, error_code: `upstream-${out.status}` });
      return count(out.status, out.status < 400 ? "success" : "upstream-error");
    case "failed-midstream":
      m.requestErrorTotal.inc({ ...labels, error_code: "Internal" });
      return count(out.status, "midstream-failure");
    case "client-gone":
      return count(499, "client-disconnect");
    case "exhausted": {
      const detail = out.failures.map((f) => `${f.endpoint}: ${f.message}`).join("; ");
      return fail(
        new GatewayError(
          503,
          `all ${out.failures.length} endpoint attempt(s) failed: ${detail}; retry with backoff, and check the replicas with GET /endpoints on the admin port`,
        ),
        "all-attempts-failed",
      );
    }
  }
}

/** The union of every available replica's model cards (fresh if possible), deduped by id. */
export async function servedModelCards(gw: Gateway): Promise<Array<{ id: string }>> {
  const recs = gw.data.store.all().filter((r) => r.health !== "unhealthy");
  await Promise.all(recs.map((r) => gw.data.scraper.refreshModels(r.spec.id)));
  const seen = new Set<string>();
  const data: Array<{ id: string }> = [];
  for (const r of recs)
    for (const card of r.models ?? [])
      if (!seen.has(card.id)) {
        seen.add(card.id);
        data.push(card);
      }
  return data;
}

/** GET /v1/models: the union of every available replica's list (fresh if possible), deduped by id. */
async function listModels(gw: Gateway, res: ServerResponse): Promise<void> {
  const data = await servedModelCards(gw);
  if (data.length === 0 && gw.data.store.readyCount(monotonicSeconds()) === 0) {
    sendError(
      res,
      new GatewayError(
        503,
        "no endpoint is available; wait for a replica to become ready (GET /endpoints on the admin port shows each one's last error)",
        { reason: "rejected-no-endpoints" },
      ),
    );
    return;
  }
  const body = JSON.stringify({ object: "list", data });
  res
    .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    .end(body);
}
