/**
 * The admin API, served only on the admin port (never the public one):
 *   GET  /endpoints  every endpoint: address, labels, health, last metrics, staleness, failures,
 *                    `traffic` (requests sent there, of which failover retries, and failures before
 *                    the first byte: endpoint-traffic.ts); in
 *                    precise mode also `kvEventsStats`, per precise producer: the KV-events subscription
 *                    (address, last seq, batches, events, gaps, replays, resets, garbage, ...) and the
 *                    index entries held for the endpoint
 *   POST /explain    an OpenAI request body → the pick, per-candidate scores and, per prefix producer,
 *                    the blocks each candidate matched; nothing is forwarded
 *   POST /reload     re-read the endpoints file and the config file; a bad one is rejected, old kept
 *   GET  /metrics    the gateway's own Prometheus metrics
 *   GET  /flows      flow control's queue (flowControl gate): per priority band and flow, depth,
 *                    bytes, age of the oldest request, tokens served; and the pool saturation
 *   GET  /config     the effective EndpointPickerConfig
 *   GET  /health
 *   GET  /           the live dashboard (dashboard/page.ts), fed by GET /dashboard/events (SSE)
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import { printConfig } from "../scheduler/defaults.ts";
import { prefixKey } from "../scheduler/plugins/data.ts";
import { PreciseMatchInfo } from "../scheduler/plugins/precise-prefix-cache-producer.ts";
import type { ScheduleResult } from "../scheduler/types.ts";
import { serveDashboardEvents, serveDashboardPage } from "./dashboard/sse.ts";
import { fillEndpointTokenIds, prepare } from "./decide.ts";
import { GatewayError, sendError } from "./errors.ts";
import { fairnessIdOf, flowGateOf } from "./flow-gate.ts";
import { flowMetricsOf } from "./flow-metrics.ts";
import type { Gateway } from "./gateway.ts";
import type { KvEventsEndpointView } from "./kv-events.ts";
import { type ApiRoute, readBody } from "./request-body.ts";
import { tokenizerCacheOf } from "./tokenize.ts";

const EXPLAIN_ROUTES: Record<string, ApiRoute> = {
  "/v1/completions": "completions",
  "/v1/chat/completions": "chat",
  "/v1/embeddings": "embeddings",
};

function json(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value, null, 2);
  res
    .writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    .end(body);
}

export function handleAdmin(gw: Gateway, req: IncomingMessage, res: ServerResponse): void {
  run(gw, req, res).catch((err) => {
    gw.log(`kvgate: admin error on ${req.url}: ${(err as Error).stack ?? err}`);
    if (err instanceof GatewayError) sendError(res, err);
    else sendError(res, new GatewayError(500, `internal error: ${(err as Error).message}`));
  });
}

async function run(gw: Gateway, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? "/", "http://admin");
  const route = `${req.method} ${url.pathname}`;
  switch (route) {
    case "GET /":
      return serveDashboardPage(res);
    case "GET /dashboard/events":
      return serveDashboardEvents(gw, req, res);
    case "GET /health":
      return json(res, 200, { status: gw.draining ? "draining" : "ok" });
    case "GET /endpoints": {
      const now = monotonicSeconds();
      const scheduler = gw.routing.scheduler;
      const snap = gw.data.store.snapshot(now).map((e) => ({
        ...e,
        routing: scheduler.endpointViews(e.address),
        traffic: gw.traffic.get(e.address),
      }));
      if (!gw.kvEvents.active)
        return json(res, 200, { endpoints: snap, ready: gw.data.store.readyCount(now) });
      const feeds = gw.kvEvents.views();
      const endpoints = snap.map((e) => {
        const kvEventsStats: Record<string, KvEventsEndpointView | null> = {};
        for (const f of feeds) kvEventsStats[f.plugin] = f.endpoints[e.address] ?? null;
        return { ...e, kvEventsStats };
      });
      return json(res, 200, { endpoints, ready: gw.data.store.readyCount(now) });
    }
    case "GET /autoscale":
      return json(
        res,
        200,
        gw.autoscale?.view() ?? { enabled: false, hint: "start with --autoscale-config FILE" },
      );
    case "GET /flows": {
      const gate = flowGateOf(gw);
      return json(res, 200, gate ? { enabled: true, ...gate.snapshot() } : { enabled: false });
    }
    case "GET /metrics": {
      if (flowGateOf(gw)) flowMetricsOf(gw);
      updateGauges(gw);
      const text = await gw.metrics.text();
      res.writeHead(200, { "content-type": gw.metrics.registry.contentType }).end(text);
      return;
    }
    case "GET /config":
      res
        .writeHead(200, { "content-type": "application/yaml" })
        .end(printConfig(gw.routing.scheduler.config));
      return;
    case "POST /reload": {
      req.resume();
      const r = await gw.reload();
      return json(res, r.ok ? 200 : 400, r);
    }
    case "POST /explain":
      return explain(gw, req, res, url);
  }
  req.resume();
  sendError(
    res,
    new GatewayError(
      404,
      `No admin route for ${req.method} ${url.pathname}; use GET /, /dashboard/events, /health, /endpoints, /autoscale, /flows, /metrics or /config, or POST /reload or /explain`,
    ),
  );
}

/** Picks the API route: `?path=/v1/...`, else from the body's shape. */
function explainRoute(url: URL, body: Buffer): ApiRoute {
  const p = url.searchParams.get("path");
  if (p) {
    const r = EXPLAIN_ROUTES[p];
    if (!r)
      throw new GatewayError(400, `path must be one of ${Object.keys(EXPLAIN_ROUTES).join(", ")}`, {
        param: "path",
      });
    return r;
  }
  const text = body.toString("utf8");
  if (/"messages"\s*:/.test(text)) return "chat";
  if (/"input"\s*:/.test(text) && !/"prompt"\s*:/.test(text)) return "embeddings";
  return "completions";
}

async function explain(gw: Gateway, req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
  const body = await readBody(req, gw.opts.maxBodyBytes);
  const route = explainRoute(url, body);
  const p = prepare(gw, route, body, req.headers);
  if (gw.endpointTokenizer) await fillEndpointTokenIds(gw, p);
  const gate = flowGateOf(gw, p.routing);
  const admission = gate
    ? {
        flowControl: true,
        fairnessId: fairnessIdOf(req.headers),
        priority: p.facts.priority,
        saturation: gate.saturation(p.now).value,
        queued: gate.controller.size,
      }
    : p.routing.admission.admit(p.facts, p.candidates, p.now);
  const result = p.routing.scheduler.schedule(p.facts, p.candidates, p.now, { explain: true });
  const ex = result.explanation;
  const primary = ex?.profiles[result.primaryProfile];
  json(res, 200, {
    route,
    model: p.facts.model,
    priority: p.facts.priority,
    admission,
    picked: result.target?.id ?? null,
    fallbacks: (result.profiles[result.primaryProfile]?.fallbacks ?? []).map((e) => e.id),
    failure: result.failure,
    primaryProfile: result.primaryProfile,
    profilesRun: ex?.profilesRun ?? [],
    decision: ex?.decision ?? null,
    ...(ex?.denied ? { denied: ex.denied } : {}),
    ...(ex?.plugins ? { plugins: ex.plugins } : {}),
    candidates: (primary?.candidates ?? []).map((c) => ({
      address: c.id,
      total: c.total,
      removedBy: c.removedBy,
      scores: Object.fromEntries(
        c.scores.map((s) => [s.name, { type: s.type, raw: s.raw, weight: s.weight, weighted: s.weighted }]),
      ),
    })),
    prefixMatch: prefixMatch(gw, result),
    profiles: ex?.profiles ?? {},
  });
}

/** Per prefix producer: the request's block count and the blocks each candidate matched (why it scored). */
function prefixMatch(gw: Gateway, result: ScheduleResult): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const ids = (result.explanation?.profiles[result.primaryProfile]?.candidates ?? []).map((c) => c.id);
  for (const p of gw.routing.prefixPlugins) {
    const info = result.cycle.get(prefixKey(p.name));
    if (info === undefined) {
      out[p.name] = { type: p.type, tokenized: false };
      continue;
    }
    out[p.name] = {
      type: p.type,
      totalBlocks: info.totalBlocks,
      blockSizeTokens: info.blockSizeTokens,
      promptTokens: info.promptTokens,
      matchBlocks: Object.fromEntries(ids.map((id) => [id, info.matchBlocks(id)])),
      // Precise: matchBlocks is tier-weighted (gpu 1.0, cpu 0.8); heldBlocks is the plain count.
      ...(info instanceof PreciseMatchInfo
        ? { heldBlocks: Object.fromEntries(ids.map((id) => [id, info.heldBlocks(id)])) }
        : {}),
    };
  }
  return out;
}

function updateGauges(gw: Gateway): void {
  gw.metrics.setTokenizer(
    tokenizerCacheOf(gw.tokenizer)?.stats() ?? null,
    gw.endpointTokenizer?.stats() ?? null,
  );
  const now = monotonicSeconds();
  const snap = gw.data.store.snapshot(now);
  gw.metrics.setPool(
    gw.opts.poolName,
    gw.data.store.readyCount(now),
    snap.map((s) => ({
      id: s.address,
      eligible: s.eligible,
      waiting: s.metrics?.waitingQueueSize,
      running: s.metrics?.runningRequestsSize,
      kv: s.metrics?.kvCacheUsagePercent,
    })),
  );
  const stats = gw.routing.scheduler.stats();
  gw.metrics.prefixSize.reset();
  for (const p of gw.routing.prefixPlugins) {
    const s = stats[p.name];
    if (s)
      gw.metrics.prefixSize.set(
        { plugin_name: p.name, plugin_type: p.type },
        s.indexSize ?? s.indexEntries ?? 0,
      );
  }
  gw.metrics.setKvEvents(gw.kvEvents.views());
}
