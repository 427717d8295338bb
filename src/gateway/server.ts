/**
 * The public front door (node:http): POST /v1/completions, /v1/chat/completions, /v1/embeddings
 * and GET /v1/models. Per request: bounded body read → one JSON decode → candidates (404 for a model
 * no replica serves, 503 for none available) → admission (429 for shed sheddable requests) →
 * scheduling → forwarding of the original bytes with failover. Every failure is an OpenAI error
 * with llm-d's status and drop-reason header (llm-d/llm-d-router@ebab6879 `pkg/common/error/error.go`);
 * nothing a client sends can crash
 * the process or steer the pick through llm-d's routing headers.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import type { EndpointState, RequestFacts, ScheduleResult } from "../scheduler/types.ts";
import { withoutPrompt } from "../scheduler/types.ts";
import { GatewayError, sendError } from "./errors.ts";
import type { Gateway } from "./gateway.ts";
import { forwardRequestHeaders, headerValue, SERVED_ENDPOINT_HEADER } from "./headers.ts";
import type { Outcome } from "./metrics.ts";
import { resolvePriority } from "./model-objectives.ts";
import { forward } from "./proxy.ts";
import { type ApiRoute, type ParsedRequest, parseRequestBody, readBody } from "./request-body.ts";
import { decodeSessionToken, encodeSessionToken, type Routing } from "./routing.ts";
import { promptTokenIds } from "./tokenize.ts";

const ROUTES: Record<string, ApiRoute> = {
  "/v1/completions": "completions",
  "/v1/chat/completions": "chat",
  "/v1/embeddings": "embeddings",
};

let nextId = 0;

export interface Prepared {
  parsed: ParsedRequest;
  facts: RequestFacts;
  candidates: EndpointState[];
  routing: Routing;
  now: number;
}

/** Decodes the body and finds candidates; throws GatewayError (400/404/503). Shared with /explain. */
export function prepare(gw: Gateway, route: ApiRoute, body: Buffer, req: IncomingMessage): Prepared {
  const parsed = parseRequestBody(route, body);
  const routing = gw.routing;
  const now = monotonicSeconds();
  const c = gw.data.store.candidates(parsed.model, now);
  if (!c.ok) {
    if (c.kind === "model-not-found") throw new GatewayError(404, c.message, { param: "model" });
    throw new GatewayError(503, c.message, { reason: "rejected-no-endpoints" });
  }
  const objective =
    headerValue(req.headers, "x-llm-d-inference-objective") ??
    headerValue(req.headers, "x-gateway-inference-objective");
  const facts: RequestFacts = {
    // Internal id: a client's x-request-id is forwarded but never keys scheduler state.
    requestId: `kvg-${++nextId}`,
    model: parsed.model,
    prompt: parsed.prompt,
    stream: parsed.stream,
    priority: resolvePriority(routing.objectives, gw.modelObjectives, parsed.model, objective),
  };
  if (parsed.cacheSalt !== undefined) facts.cacheSalt = parsed.cacheSalt;
  if (parsed.maxTokens !== undefined) facts.maxTokens = parsed.maxTokens;
  if (gw.tokenizer) {
    const ids = promptTokenIds(gw.tokenizer, parsed.prompt, parsed);
    if (ids !== undefined) facts.tokenIds = ids;
  }
  if (routing.sessionTokenHeader) {
    const tok = decodeSessionToken(headerValue(req.headers, routing.sessionTokenHeader));
    if (tok !== undefined) facts.sessionToken = tok;
  }
  if (routing.sessionIdHeader) {
    const sid = headerValue(req.headers, routing.sessionIdHeader);
    if (sid) facts.sessionId = sid.slice(0, 256);
  }
  return { parsed, facts, candidates: c.candidates, routing, now };
}

/**
 * With --tokenizer endpoint, asks a candidate replica's /tokenize for the prompt's ids (bounded by
 * its timeout; on failure the request is routed without them). Callers skip it when
 * gw.endpointTokenizer is null, so the local-tokenizer path stays synchronous.
 */
export async function fillEndpointTokenIds(gw: Gateway, p: Prepared): Promise<void> {
  const et = gw.endpointTokenizer;
  if (!et || p.facts.tokenIds !== undefined) return;
  const ids = await et.tokenIds(p.parsed.model, p.parsed.prompt, p.parsed, p.candidates);
  if (ids !== undefined) p.facts.tokenIds = ids;
  p.now = monotonicSeconds();
}

export function handlePublic(gw: Gateway, req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? "/").split("?")[0];
  const route = ROUTES[path];
  const done = (status: number, outcome: Outcome) =>
    gw.metrics.httpRequests.inc({
      route: route ?? (path === "/v1/models" || path === "/health" ? path : "other"),
      status: String(status),
      outcome,
    });
  if (route && req.method === "POST") {
    proxyRequest(gw, route, req, res).catch((err) => {
      gw.log(`kvgate: internal error on ${path}: ${(err as Error).stack ?? err}`);
      sendError(res, new GatewayError(500, "internal gateway error"));
      if (!res.writableEnded) res.destroy();
      done(500, "upstream-error");
    });
    return;
  }
  if (path === "/v1/models" && req.method === "GET") {
    listModels(gw, res).catch(() => sendError(res, new GatewayError(500, "internal gateway error")));
    return;
  }
  if (path === "/health" && req.method === "GET") {
    res.writeHead(gw.draining ? 503 : 200, { "content-type": "application/json" }).end("{}");
    return;
  }
  const known = route !== undefined || path === "/v1/models";
  const err = known
    ? new GatewayError(405, `Method ${req.method} is not allowed on ${path}`, {
        headers: { allow: route ? "POST" : "GET" },
      })
    : new GatewayError(404, `No route for ${req.method} ${path}`);
  sendError(res, err);
  req.resume();
  done(err.status, err.status === 404 ? "not-found" : "bad-request");
}

async function proxyRequest(
  gw: Gateway,
  route: ApiRoute,
  req: IncomingMessage,
  res: ServerResponse,
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
      new GatewayError(503, "the gateway is shutting down", { reason: "rejected-shutting-down" }),
      "rejected",
    );
  if (gw.active >= gw.opts.maxConcurrentRequests) {
    req.resume();
    return reject(
      new GatewayError(503, `too many concurrent requests (limit ${gw.opts.maxConcurrentRequests})`),
      "rejected",
    );
  }
  gw.active++;
  res.once("close", () => gw.active--);
  const ac = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) ac.abort(new Error("client disconnected"));
  });

  let p: Prepared | null;
  let body: Buffer;
  try {
    body = await readBody(req, gw.opts.maxBodyBytes);
    p = prepare(gw, route, body, req);
    if (gw.endpointTokenizer) await fillEndpointTokenIds(gw, p);
  } catch (err) {
    if (!(err instanceof GatewayError)) throw err;
    if (ac.signal.aborted) return count(499, "client-disconnect");
    return reject(err, err.status === 404 ? "not-found" : err.status === 503 ? "rejected" : "bad-request");
  }
  const { routing, now } = p;
  let facts = p.facts;
  const candidates = p.candidates;
  const m = gw.metrics;
  const labels = m.labels(facts.model, facts.priority);
  m.requestTotal.inc(labels);
  m.requestSize.observe(labels, body.length);
  const fail = (err: GatewayError, outcome: Outcome) => {
    m.requestErrorTotal.inc({ ...labels, error_code: err.code });
    reject(err, outcome);
  };

  const adm = routing.admission.admit(facts, candidates, now);
  if (!adm.admitted) return fail(new GatewayError(429, adm.message, { reason: adm.reason }), "rejected");

  const before = prefixCounters(routing);
  const ts = performance.now();
  let result: ScheduleResult | null = routing.scheduler.schedule(facts, candidates, now);
  m.schedulerE2e.observe((performance.now() - ts) / 1000);
  if (result.failure || !result.target) {
    const f = result.failure ?? {
      status: 503 as const,
      reason: "rejected-no-endpoints" as const,
      message: "no target",
    };
    m.schedulerAttempts.inc({
      status: "failure",
      target_model_name: labels.target_model_name,
      endpoint_name: "",
      namespace: "",
      port: "",
    });
    return fail(new GatewayError(f.status, f.message, { reason: f.reason }), "rejected");
  }
  const target = result.target;
  const [host, port] = splitId(target.id);
  m.schedulerAttempts.inc({
    status: "success",
    target_model_name: labels.target_model_name,
    endpoint_name: host,
    namespace: "",
    port,
  });
  routing.scheduler.onPicked(facts, result, now);
  observePrefix(gw, routing, before); // the producers count hits when they learn the pick

  const targets = [target.id];
  for (const f of result.profiles[result.primaryProfile]?.fallbacks ?? [])
    if (!targets.includes(f.id)) targets.push(f.id);
  const prefill = result.profiles.prefill?.target;
  const prefillHost = prefill && result.primaryProfile !== "prefill" ? prefill.id : null;
  // Failover resends the body bytes; nothing after this point needs the parsed prompt, so it is
  // not kept alive for the whole response (tens of KB of strings per request in flight, which
  // every young-generation GC would otherwise copy: bench:picker's decision tail).
  facts = withoutPrompt(facts);
  result = null;
  p = null;
  const headers = forwardRequestHeaders(req.headers);
  if (!headers["x-request-id"]) headers["x-request-id"] = randomUUID();
  headers["content-length"] = String(body.length);
  if (prefillHost !== null) headers["x-prefiller-host-port"] = prefillHost;

  m.requestRunning.inc(labels);
  let served: string | null = null;
  let firstByteAt = 0;
  let out: Awaited<ReturnType<typeof forward>>;
  try {
    out = await forward({
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
      onAttemptFailed: (f) => {
        gw.traffic.failure(f.endpoint);
        m.upstreamFailures.inc({ endpoint: f.endpoint, kind: f.kind });
        gw.data.store.reportRequestFailure(f.endpoint, f.kind, f.message, monotonicSeconds());
      },
      onStarted: (id, status) => {
        served = id;
        firstByteAt = performance.now();
        if (status < 500) gw.data.store.reportRequestSuccess(id);
        if (gw.opts.servedEndpointHeader) res.setHeader(SERVED_ENDPOINT_HEADER, id);
        if (routing.sessionTokenHeader) res.setHeader(routing.sessionTokenHeader, encodeSessionToken(id));
        routing.scheduler.onResponseStarted(facts, id, monotonicSeconds());
      },
    });
  } finally {
    routing.scheduler.onResponseComplete(facts, served ?? target.id, monotonicSeconds());
    m.requestRunning.dec(labels);
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
        new GatewayError(503, `all ${out.failures.length} endpoint attempt(s) failed: ${detail}`),
        "all-attempts-failed",
      );
    }
  }
}

function splitId(id: string): [string, string] {
  const i = id.lastIndexOf(":");
  return [id.slice(0, i), id.slice(i + 1)];
}

type Counters = Map<string, [number, number]>;

function prefixCounters(routing: Routing): Counters | null {
  if (routing.prefixPlugins.length === 0) return null;
  const out: Counters = new Map();
  for (const p of routing.prefixPlugins) {
    const s = routing.scheduler.plugins.get(p.name)?.stats?.();
    if (s) out.set(p.name, [s.hitBlocks ?? 0, s.lookupBlocks ?? 0]);
  }
  return out;
}

/** Per-lookup hit ratio from the producers' counters (llm-d observes one ratio per lookup). */
function observePrefix(gw: Gateway, routing: Routing, before: Counters | null): void {
  if (!before) return;
  const after = prefixCounters(routing) as Counters;
  for (const p of routing.prefixPlugins) {
    const [h0, l0] = before.get(p.name) ?? [0, 0];
    const [h1, l1] = after.get(p.name) ?? [0, 0];
    if (l1 > l0)
      gw.metrics.prefixHitRatio.observe({ plugin_name: p.name, plugin_type: p.type }, (h1 - h0) / (l1 - l0));
  }
}

/** GET /v1/models: the union of every available replica's list (fresh if possible), deduped by id. */
async function listModels(gw: Gateway, res: ServerResponse): Promise<void> {
  const now = monotonicSeconds();
  const recs = gw.data.store.all().filter((r) => r.health !== "unhealthy");
  await Promise.all(recs.map((r) => gw.data.scraper.refreshModels(r.spec.id)));
  const seen = new Set<string>();
  const data: unknown[] = [];
  for (const r of recs)
    for (const card of r.models ?? [])
      if (!seen.has(card.id)) {
        seen.add(card.id);
        data.push(card);
      }
  if (data.length === 0 && gw.data.store.readyCount(now) === 0) {
    sendError(res, new GatewayError(503, "no endpoint is available", { reason: "rejected-no-endpoints" }));
    return;
  }
  const body = JSON.stringify({ object: "list", data });
  res
    .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    .end(body);
}
