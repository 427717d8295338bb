/**
 * Flow control in `kvgate serve` with fake replicas and the shipped config/examples/flow-control.yaml
 * (as is, and with utilization-detector): a request waits at the gateway while the pool is saturated (visible on GET /flows and /metrics, not
 * sent to the replica) and is served once the replica's scraped queue drains; its response usage is
 * charged to its tenant; a full sheddable band answers 429 with llm-d's dropped-reason header; a
 * client that disconnects while queued leaves the queue; with concurrency-detector the gate opens when
 * a request in flight completes; a gateway shutting down answers what is queued with 503.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { request } from "undici";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";

const SHIPPED = readFileSync("config/examples/flow-control.yaml", "utf8");
/** The shipped example with utilization-detector, so a fake replica's scraped queue saturates the pool. */
const EXAMPLE = SHIPPED.replace(
  "- type: concurrency-detector\n  parameters: { concurrencyMode: requests, maxConcurrency: 100 }",
  "- type: utilization-detector\n  parameters: { queueDepthThreshold: 2 }",
).replace("pluginRef: concurrency-detector", "pluginRef: utilization-detector");
const USAGE =
  '{"id":"c","object":"text_completion","choices":[{"text":"hi"}],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}}';

async function setup(
  config = EXAMPLE,
): Promise<{ up: FakeServer; gw: GatewayHandle; load: { waiting: number } }> {
  const load = { waiting: 10 };
  const up = await startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting: load.waiting, kv: 0.1 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": (_q, res) =>
      void res.writeHead(200, { "content-type": "application/json" }).end(USAGE),
  });
  const gw = await startGateway({ endpoints: up.id, config, scrapeIntervalMs: 10, log: () => {} });
  // Saturated: 10 waiting / queueDepthThreshold 2 = 5 ≥ 1.
  try {
    await waitFor(
      () =>
        gw.gateway.data.store.get(up.id)?.state.metrics?.waitingQueueSize === 10 &&
        (gw.gateway.data.store.get(up.id)?.models?.length ?? 0) > 0,
      "scraped",
    );
  } catch (err) {
    await gw.close();
    await up.close();
    throw err;
  }
  return { up, gw, load };
}

function complete(gw: GatewayHandle, headers: Record<string, string>, signal?: AbortSignal) {
  return request(`${gw.url}/v1/completions`, {
    method: "POST",
    body: '{"model":"m","prompt":"hello there"}',
    headers: { "content-type": "application/json", ...headers },
    signal,
  });
}

type FlowsJson = {
  enabled: boolean;
  queued: number;
  bands: {
    priority: number;
    depth: number;
    flows: { fairnessId: string; depth: number; servedTokens: number }[];
  }[];
};

async function flows(gw: GatewayHandle): Promise<FlowsJson> {
  const r = await request(`${gw.adminUrl}/flows`);
  return (await r.body.json()) as FlowsJson;
}

async function metrics(gw: GatewayHandle): Promise<string> {
  return (await request(`${gw.adminUrl}/metrics`)).body.text();
}

async function waitQueued(gw: GatewayHandle, n: number): Promise<void> {
  for (let i = 0; i < 2000; i++) {
    if ((await flows(gw)).queued === n) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`queue never held ${n}`);
}

test("a request waits at the gateway while the pool is saturated and is served when the gate opens", {
  timeout: 30_000,
}, async () => {
  const { up, gw, load } = await setup();
  try {
    const pending = complete(gw, {
      "x-gateway-inference-objective": "standard",
      "x-gateway-inference-fairness-id": "tenant-a",
    });
    await waitQueued(gw, 1);
    const f = await flows(gw);
    assert.equal(f.enabled, true);
    const band0 = f.bands.find((b) => b.priority === 0);
    assert.deepEqual(
      band0?.flows.map((x) => [x.fairnessId, x.depth]),
      [["tenant-a", 1]],
    );
    assert.equal(up.hits("/v1/completions"), 0, "a queued request must not reach the replica");
    assert.match(
      await metrics(gw),
      /llm_d_epp_flow_control_queue_size\{inference_pool="kvgate",priority="0",fairness_id="tenant-a"\} 1/,
    );

    load.waiting = 0; // the replica's queue drains: the next scrape opens the gate
    const r = await pending;
    assert.equal(r.statusCode, 200);
    assert.equal(JSON.parse(await r.body.text()).usage.completion_tokens, 5);
    assert.equal(up.hits("/v1/completions"), 1);
    // The response's usage was charged: 7 prompt + 5 output tokens.
    let after: FlowsJson["bands"][number]["flows"][number] | undefined;
    for (let i = 0; i < 2000 && after?.servedTokens !== 12; i++) {
      after = (await flows(gw)).bands.find((b) => b.priority === 0)?.flows[0];
      await new Promise((res) => setTimeout(res, 5));
    }
    assert.deepEqual([after?.fairnessId, after?.depth, after?.servedTokens], ["tenant-a", 0, 12]);
    assert.match(
      await metrics(gw),
      /llm_d_epp_flow_control_requests_total\{outcome="Dispatched",priority="0",fairness_id="tenant-a"\} 1/,
    );
    // The request counter carries the same fairness id, not a fixed "default-flow".
    assert.match(await metrics(gw), /llm_d_epp_request_total\{[^}]*fairness_id="tenant-a"[^}]*\} 1/);
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a full sheddable band answers 429 rejected-saturated in OpenAI JSON; critical is not affected", {
  timeout: 30_000,
}, async () => {
  const { up, gw, load } = await setup(EXAMPLE.replace('maxRequests: "20"', 'maxRequests: "1"'));
  try {
    const first = complete(gw, { "x-gateway-inference-objective": "sheddable" });
    await waitQueued(gw, 1);
    const shed = await complete(gw, { "x-llm-d-inference-objective": "sheddable" });
    assert.equal(shed.statusCode, 429);
    assert.equal(shed.headers["x-llm-d-request-dropped-reason"], "rejected-saturated");
    const err = JSON.parse(await shed.body.text()).error;
    assert.equal(err.code, 429);
    assert.match(err.message, /priority band -10 maxRequests 1/);
    const crit = complete(gw, { "x-gateway-inference-objective": "critical" });
    await waitQueued(gw, 2);
    const f = await flows(gw);
    assert.deepEqual(
      f.bands.map((b) => [b.priority, b.depth]),
      [
        [100, 1],
        [0, 0],
        [-10, 1],
      ],
    );
    load.waiting = 0;
    assert.equal((await crit).statusCode, 200);
    assert.equal((await first).statusCode, 200);
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a client that disconnects while queued leaves the queue at once", { timeout: 30_000 }, async () => {
  const { up, gw, load } = await setup();
  try {
    const ac = new AbortController();
    const pending = complete(gw, { "x-gateway-inference-fairness-id": "tenant-b" }, ac.signal).catch(
      (e: Error) => e,
    );
    await waitQueued(gw, 1);
    ac.abort();
    assert.ok((await pending) instanceof Error);
    await waitQueued(gw, 0);
    assert.match(
      await metrics(gw),
      /llm_d_epp_flow_control_requests_total\{outcome="EvictedContextCancelled",priority="0",fairness_id="tenant-b"\} 1/,
    );
    load.waiting = 0;
    const r = await complete(gw, { "x-gateway-inference-fairness-id": "tenant-b" });
    assert.equal(r.statusCode, 200);
    await r.body.text();
    assert.equal(up.hits("/v1/completions"), 1, "the abandoned request was never sent");
  } finally {
    await gw.close();
    await up.close();
  }
});

test("concurrency-detector: a request waits while the pool's in-flight limit is reached, and goes when one completes", {
  timeout: 30_000,
}, async () => {
  const held: Array<() => void> = [];
  const up = await startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting: 0, kv: 0.1 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": (_q, res) =>
      void held.push(() => {
        if (!res.headersSent) res.writeHead(200, { "content-type": "application/json" }).end(USAGE);
      }),
  });
  const config = SHIPPED.replace("maxConcurrency: 100", "maxConcurrency: 1");
  const gw = await startGateway({ endpoints: up.id, config, scrapeIntervalMs: 10, log: () => {} });
  try {
    await waitFor(() => (gw.gateway.data.store.get(up.id)?.models?.length ?? 0) > 0, "models");
    const first = complete(gw, { "x-gateway-inference-fairness-id": "t1" });
    await waitFor(() => held.length === 1, "first request at the replica");
    const second = complete(gw, { "x-gateway-inference-fairness-id": "t2" });
    await waitQueued(gw, 1); // 1 in flight / (1 endpoint · maxConcurrency 1) = 1: saturated
    assert.equal(up.hits("/v1/completions"), 1);
    held[0]();
    assert.equal((await first).statusCode, 200);
    await waitFor(() => held.length === 2, "second request dispatched after the first completed");
    await waitQueued(gw, 0);
    held[1]();
    const r = await second;
    assert.equal(r.statusCode, 200);
    await r.body.text();
  } finally {
    for (const h of held.splice(0)) h();
    await gw.close();
    await up.close();
  }
});

test("a gateway that shuts down answers what is queued with 503 rejected-shutting-down", {
  timeout: 30_000,
}, async () => {
  const { up, gw } = await setup();
  try {
    const pending = complete(gw, { "x-gateway-inference-fairness-id": "tenant-c" });
    await waitQueued(gw, 1);
    const closing = gw.close();
    const r = await pending;
    assert.equal(r.statusCode, 503);
    assert.equal(r.headers["x-llm-d-request-dropped-reason"], "rejected-shutting-down");
    assert.equal(JSON.parse(await r.body.text()).error.code, 503);
    await closing;
    assert.equal(up.hits("/v1/completions"), 0);
  } finally {
    await gw.close();
    await up.close();
  }
});

test("prefill reserve: a tenant's second long prompt waits for its first one's first token; another tenant's short one goes at once", {
  timeout: 30_000,
}, async () => {
  // Each replica holds a request until told: first() sends its first SSE chunk, end() finishes it.
  type Held = { body: string; first(): void; end(): void };
  const held: Held[] = [];
  const replica = () =>
    startFake({
      "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting: 0, kv: 0.1 })),
      "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
      "POST /v1/completions": (_q, res, body) =>
        void held.push({
          body: body.toString(),
          first: () => {
            res.writeHead(200, { "content-type": "text/event-stream" });
            res.write('data: {"id":"c","object":"text_completion","choices":[{"text":"a"}]}\n\n');
          },
          end: () => {
            if (!res.headersSent) res.writeHead(200, { "content-type": "text/event-stream" });
            res.end("data: [DONE]\n\n");
          },
        }),
    });
  const [up1, up2] = [await replica(), await replica()];
  // Without a tokenizer a prompt counts bytes / 4 tokens: "long" bodies are ~100 tokens, short ~12.
  const config = SHIPPED.replace("prefillReserve: 1 }", "prefillReserve: 1, longPrefillTokens: 40 }");
  assert.notEqual(config, SHIPPED);
  const gw = await startGateway({
    endpoints: `${up1.id},${up2.id}`,
    config,
    scrapeIntervalMs: 10,
    log: () => {},
  });
  const send = (tenant: string, prompt: string, signal?: AbortSignal) =>
    request(`${gw.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ model: "m", prompt, stream: true }),
      headers: { "content-type": "application/json", "x-gateway-inference-fairness-id": tenant },
      signal,
    });
  const LONG = "x".repeat(360);
  const hits = () => up1.hits("/v1/completions") + up2.hits("/v1/completions");
  const pendingOf = async (tenant: string) =>
    ((await flows(gw)).bands.find((b) => b.priority === 0)?.flows ?? []).find(
      (f) => f.fairnessId === tenant,
    ) as (FlowsJson["bands"][number]["flows"][number] & { longPrefillsPending?: number }) | undefined;
  try {
    await waitFor(
      () => [up1, up2].every((u) => (gw.gateway.data.store.get(u.id)?.models?.length ?? 0) > 0),
      "models",
    );
    // tenant-b has been seen: the band knows two flows.
    const b0 = send("tenant-b", "hi");
    await waitFor(() => held.length === 1, "b0 at a replica");
    held[0].first();
    held[0].end();
    await (await b0).body.text();
    // tenant-a floods three long prompts: the first goes, the others wait for its first token.
    const ac = new AbortController();
    const a0 = send("tenant-a", LONG);
    await waitFor(() => held.length === 2, "a0 at a replica");
    const a1 = send("tenant-a", LONG, ac.signal).catch((e: Error) => e);
    await waitQueued(gw, 1);
    const a2 = send("tenant-a", LONG);
    await waitQueued(gw, 2);
    assert.equal(hits(), 2, "only one of tenant-a's long prompts is at a replica");
    assert.equal((await pendingOf("tenant-a"))?.longPrefillsPending, 1);
    // tenant-b's short request is dispatched at once, to the replica kept free.
    const b1 = send("tenant-b", "hi");
    await waitFor(() => held.length === 3, "b1 at a replica");
    await waitQueued(gw, 2);
    held[2].first();
    held[2].end();
    await (await b1).body.text();
    // a0 sends its first token: a1 goes, and only a1.
    held[1].first();
    await waitFor(() => held.length === 4, "a1 dispatched");
    await waitQueued(gw, 1);
    assert.equal(hits(), 4);
    // a1's client disconnects before its first token: that releases its prefill too, and a2 goes.
    ac.abort();
    assert.ok((await a1) instanceof Error);
    await waitFor(() => held.length === 5, "a2 dispatched");
    await waitQueued(gw, 0);
    for (const h of held.slice(1)) h.end();
    for (const r of [a0, a2]) await (await r).body.text();
    assert.equal((await pendingOf("tenant-a"))?.longPrefillsPending, 0);
  } finally {
    for (const h of held) h.end();
    await gw.close();
    await up1.close();
    await up2.close();
  }
});
