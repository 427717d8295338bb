/**
 * The one decision path of both front doors, `kvgate serve`'s HTTP proxy and `kvgate epp`'s ext_proc
 * server: the body decoded once → InferenceModelRewrite → candidates (404 for a model no replica
 * serves, 503 for none available, restricted to the proxy's subset hint) → admission (429 for a shed
 * sheddable request) → scheduling → onPicked, with llm-d's request metrics. What comes next
 * (forwarding the bytes, or telling Envoy where to send them) is the caller's; it must end every
 * successful decision with exactly one scheduler.onResponseComplete on `decision.routing`.
 */
import type { IncomingHttpHeaders } from "node:http";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import type { ModelRewrite } from "../datalayer/pool-resources.ts";
import { createRng } from "../scheduler/rng.ts";
import type { EndpointState, RequestFacts, ScheduleResult } from "../scheduler/types.ts";
import { withoutPrompt } from "../scheduler/types.ts";
import { GatewayError } from "./errors.ts";
import { admit, fairnessIdOf, placeFlow, releaseFlow } from "./flow-gate.ts";
import type { Gateway } from "./gateway.ts";
import { headerValue } from "./headers.ts";
import type { Outcome, ReqLabels } from "./metrics.ts";
import { resolvePriority } from "./model-objectives.ts";
import { type RewriteDecision, resolveModelRewrite } from "./model-rewrite.ts";
import { type ApiRoute, type ParsedRequest, parseRequestBody } from "./request-body.ts";
import { decodeSessionToken, type Routing } from "./routing.ts";
import { applySloHeaders } from "./slo-headers.ts";
import { promptTokenIds } from "./tokenize.ts";

let nextId = 0;
const fallbackRng = createRng(1);

export interface DecideOptions {
  /**
   * The proxy's subset hint (GIE endpoint-picker protocol, `x-gateway-destination-endpoint-subset`):
   * only endpoints on these hosts may be picked, matched by IP as llm-d does. Empty = none.
   */
  subset?: readonly string[] | null;
  /** The pool's InferenceModelRewrite resources. */
  rewrites?: readonly ModelRewrite[];
  /** Draws rewrite targets; seeded by the caller. */
  rng?: () => number;
  /** InferenceObjective name → priority; default the config's. */
  objectives?: ReadonlyMap<string, number>;
  /** The body's size in bytes when `body` is its decoded text. */
  bodyBytes?: number;
  /** Aborted when the client goes away: a request queued by flow control leaves the queue at once. */
  signal?: AbortSignal;
  /**
   * The body already decoded (the multi-pool front door decodes it once to choose the pool) and the
   * rewrite it already resolved; `rewrites` is then not consulted.
   */
  pre?: { parsed: ParsedRequest; rewrite: RewriteDecision | null };
}

export interface Prepared {
  parsed: ParsedRequest;
  facts: RequestFacts;
  candidates: EndpointState[];
  routing: Routing;
  rewrite: RewriteDecision | null;
  now: number;
}

/** The host part of `host:port` or `[v6]:port`, or the whole text when it has no port. */
export function hostOf(address: string): string {
  const a = address.trim();
  if (a.startsWith("[")) return a.slice(1, a.indexOf("]"));
  const i = a.lastIndexOf(":");
  return i > 0 && a.indexOf(":") === i ? a.slice(0, i) : a;
}

/** Decodes the body and finds candidates; throws GatewayError (400/404/503). Shared with /explain. */
export function prepare(
  gw: Gateway,
  route: ApiRoute,
  body: Buffer | string,
  headers: IncomingHttpHeaders,
  opts: DecideOptions = {},
): Prepared {
  const parsed = opts.pre?.parsed ?? parseRequestBody(route, body);
  const routing = gw.routing;
  const now = monotonicSeconds();
  const rewrite = opts.pre
    ? opts.pre.rewrite
    : opts.rewrites?.length
      ? resolveModelRewrite(opts.rewrites, parsed.model, opts.rng ?? (() => fallbackRng.next()))
      : null;
  const model = rewrite?.target ?? parsed.model;
  const c = gw.data.store.candidates(model, now);
  if (!c.ok) {
    if (c.kind === "model-not-found") throw new GatewayError(404, c.message, { param: "model" });
    throw new GatewayError(503, c.message, { reason: "rejected-no-endpoints" });
  }
  let candidates = c.candidates;
  if (opts.subset) {
    const hosts = new Set(opts.subset.map(hostOf));
    candidates = candidates.filter((e) => hosts.has(hostOf(e.id)));
    if (candidates.length === 0)
      throw new GatewayError(
        503,
        opts.subset.length === 0
          ? "the proxy's endpoint subset hint (x-gateway-destination-endpoint-subset) is empty; wait for the pool's endpoints to become ready, or fix the proxy's subset"
          : `none of the ${opts.subset.length} endpoint(s) in the proxy's subset hint is a ready candidate for model ${model}; check that the proxy and kvgate see the same pool`,
        { reason: "rejected-no-endpoints" },
      );
  }
  const objective =
    headerValue(headers, "x-llm-d-inference-objective") ??
    headerValue(headers, "x-gateway-inference-objective");
  const facts: RequestFacts = {
    // Internal id: a client's x-request-id is forwarded but never keys scheduler state.
    requestId: `kvg-${++nextId}`,
    model,
    prompt: parsed.prompt,
    stream: parsed.stream,
    priority: resolvePriority(opts.objectives ?? routing.objectives, gw.modelObjectives, model, objective),
  };
  if (parsed.cacheSalt !== undefined) facts.cacheSalt = parsed.cacheSalt;
  if (parsed.maxTokens !== undefined) facts.maxTokens = parsed.maxTokens;
  if (gw.tokenizer) {
    const ids = promptTokenIds(gw.tokenizer, parsed.prompt, parsed);
    if (ids !== undefined) facts.tokenIds = ids;
  }
  if (routing.sessionTokenHeader) {
    const tok = decodeSessionToken(headerValue(headers, routing.sessionTokenHeader));
    if (tok !== undefined) facts.sessionToken = tok;
  }
  if (routing.sessionIdHeader) {
    const sid = headerValue(headers, routing.sessionIdHeader);
    if (sid) facts.sessionId = sid.slice(0, 256);
  }
  applySloHeaders(facts, headers);
  return { parsed, facts, candidates, routing, rewrite, now };
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

export interface Decision {
  /** The request as the scheduler saw it, without its prompt (kept for the response hooks). */
  facts: RequestFacts;
  labels: ReqLabels;
  /** The pick first, then the primary profile's fallbacks (failover order). */
  targets: string[];
  /** How many of `targets` the picker chose (its maxNumOfEndpoints): the destination list. */
  picked: number;
  /** The prefill endpoint when the scheduler chose one for a disaggregated request. */
  prefillHost: string | null;
  /** A P/D profile handler's decision (llm-d's decision_type), or null for other profile handlers. */
  pdDecision: string | null;
  /** Why a request the decider wanted split is prefilled on its decode endpoint, or null. */
  pdFallback: string | null;
  /** The model the client asked for (facts.model is the one sent, after any rewrite). */
  clientModel: string;
  rewrite: RewriteDecision | null;
  /**
   * The body re-serialised (model rewritten, client kv_transfer_params removed), or null when the
   * original bytes go unchanged.
   */
  body: Buffer | null;
  /** The routing that made the pick: its scheduler gets the response hooks, even after a reload. */
  routing: Routing;
}

export type DecideResult =
  | { ok: true; decision: Decision }
  | { ok: false; error: GatewayError; outcome: Outcome };

function outcomeOf(err: GatewayError): Outcome {
  return err.status === 404 ? "not-found" : err.status === 503 ? "rejected" : "bad-request";
}

export async function decide(
  gw: Gateway,
  route: ApiRoute,
  body: Buffer | string,
  headers: IncomingHttpHeaders,
  opts: DecideOptions = {},
): Promise<DecideResult> {
  let p: Prepared;
  try {
    p = prepare(gw, route, body, headers, opts);
    if (gw.endpointTokenizer) await fillEndpointTokenIds(gw, p);
  } catch (err) {
    if (!(err instanceof GatewayError)) throw err;
    return { ok: false, error: err, outcome: outcomeOf(err) };
  }
  const { routing, facts, rewrite, parsed } = p;
  const m = gw.metrics;
  const labels = m.labels(parsed.model, facts.priority, facts.model, fairnessIdOf(headers));
  m.requestTotal.inc(labels);
  const bytes = opts.bodyBytes ?? (typeof body === "string" ? Buffer.byteLength(body) : body.length);
  m.requestSize.observe(labels, bytes);
  if (rewrite)
    m.modelRewrites.inc({
      model_rewrite_name: rewrite.rewriteName,
      model_name: labels.model_name,
      target_model: labels.target_model_name,
    });
  const fail = (err: GatewayError, outcome: Outcome): DecideResult => {
    m.requestErrorTotal.inc({ ...labels, error_code: err.code });
    releaseFlow(gw, p);
    return { ok: false, error: err, outcome };
  };

  // Legacy admission, or waiting in the flow-control queue (which refreshes p.candidates and p.now).
  const denied = await admit(gw, p, headers, { signal: opts.signal, bytes, subset: opts.subset });
  if (denied) return fail(denied, "rejected");
  const { now, candidates } = p;

  const before = prefixCounters(routing);
  const ts = performance.now();
  const result: ScheduleResult = routing.scheduler.schedule(facts, candidates, now);
  m.schedulerE2e.observe((performance.now() - ts) / 1000);
  const attempt = (status: string, id: string | null) => {
    const [host, port] = id ? splitId(id) : ["", ""];
    m.schedulerAttempts.inc({
      status,
      target_model_name: labels.target_model_name,
      endpoint_name: host,
      namespace: "",
      port,
    });
  };
  if (result.failure || !result.target) {
    const f = result.failure ?? {
      status: 503 as const,
      reason: "rejected-no-endpoints" as const,
      message: "no target",
    };
    attempt("failure", null);
    return fail(new GatewayError(f.status, f.message, { reason: f.reason }), "rejected");
  }
  const target = result.target;
  attempt("success", target.id);
  routing.scheduler.onPicked(facts, result, now);
  observePrefix(gw, routing, before); // the producers count hits when they learn the pick

  const primary = result.profiles[result.primaryProfile];
  const targets = [target.id];
  for (const f of primary?.fallbacks ?? []) if (!targets.includes(f.id)) targets.push(f.id);
  const outcome = result.outcome;
  const prefillHost = outcome?.prefillTarget?.id ?? null;
  placeFlow(gw, p, prefillHost ?? target.id);
  const pdDecision = outcome?.decision ?? null;
  // The decider wanted a remote prefill and no prefill endpoint could take it: never a silent
  // decode-only (llm-d-router#2427). "fail" answers 503 as llm-d does since PR #2521; "recompute"
  // (default) prefills on the decode target, counted and marked like any other prefill fallback.
  let pdFallback: string | null = null;
  if (outcome?.prefillUnavailable) {
    if (gw.opts.prefillFailurePolicy === "fail") {
      attempt("failure", null);
      return fail(new GatewayError(503, outcome.reason, { reason: "rejected-no-endpoints" }), "rejected");
    }
    pdFallback = "no-prefill-endpoint";
    m.pd.fallbacks.inc({ reason: pdFallback });
  }
  if (outcome) {
    const h = routing.scheduler.plugins.get(routing.scheduler.config.profileHandler);
    m.disaggDecisions.inc({
      plugin_name: h?.typedName.name ?? "",
      plugin_type: h?.typedName.type ?? "",
      model_name: labels.target_model_name || "unknown",
      decision_type: outcome.decision,
    });
  }
  let reencode = false;
  if (rewrite && rewrite.target !== parsed.model) {
    parsed.json.model = rewrite.target;
    reencode = true;
  }
  // kv_transfer_params is the gateway's to set (the P/D legs): from a client it would make a
  // NixlConnector replica pull KV from any remote_host it names, so it is removed as the routing
  // control headers are.
  if (parsed.json.kv_transfer_params !== undefined) {
    delete parsed.json.kv_transfer_params;
    reencode = true;
  }
  const out = reencode ? Buffer.from(JSON.stringify(parsed.json), "utf8") : null;
  // Nothing after the decision needs the parsed prompt, so it is not kept alive for the whole
  // response (tens of KB of strings per request in flight, which every young-generation GC would
  // otherwise copy: bench:picker's decision tail).
  return {
    ok: true,
    decision: {
      facts: withoutPrompt(facts),
      labels,
      targets,
      picked: Math.max(1, Math.min(primary?.picked ?? 1, targets.length)),
      prefillHost,
      pdDecision,
      pdFallback,
      clientModel: parsed.model,
      rewrite,
      body: out,
      routing,
    },
  };
}

export function splitId(id: string): [string, string] {
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
