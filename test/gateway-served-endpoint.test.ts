/**
 * Where a request went: the x-gateway-destination-endpoint-served response header (the endpoint that
 * actually answered, after failover; a client's or a replica's header of that name never reaches the
 * client), per-endpoint traffic on GET /endpoints, and failovers in llm_d_epp_scheduler_attempts_total.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { request } from "undici";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import {
  type FakeServer,
  type Handler,
  modelList,
  startFake,
  vllmMetrics,
  waitFor,
} from "./helpers/gateway-fakes.ts";

const SERVED = "x-gateway-destination-endpoint-served";

/** Scores only scraped load, so the idle replica is always the first choice. */
const LOAD_ONLY = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
`;

/** A replica that answers, and (like a confused sidecar might) sets the served header itself. */
const answers: Handler = (_q, res) =>
  void res
    .writeHead(200, { "content-type": "application/json", [SERVED]: "6.6.6.6:1" })
    .end('{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}');
const fails: Handler = (_q, res) => void res.writeHead(503).end('{"error":{"message":"engine dead"}}');
const streams: Handler = (_q, res) => {
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.end('data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n');
};

function replica(waiting: number, gen: Handler, chat: Handler = gen): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting, kv: 0.1 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": gen,
    "POST /v1/chat/completions": chat,
  });
}

async function gateway(fakes: FakeServer[], extra: Parameters<typeof startGateway>[0] = {}) {
  const gw = await startGateway({
    endpoints: fakes.map((f) => f.id).join(","),
    config: LOAD_ONLY,
    scrapeIntervalMs: 20,
    probationBaseMs: 60_000,
    log: () => {},
    ...extra,
  });
  await waitFor(
    () => gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
    "first scrape of every endpoint",
  );
  return gw;
}

async function post(gw: GatewayHandle, path: string, body: object, headers: Record<string, string> = {}) {
  const r = await request(`${gw.url}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json", ...headers },
  });
  return { status: r.statusCode, headers: r.headers, text: await r.body.text() };
}

interface Traffic {
  requests: number;
  retries: number;
  failures: number;
}
async function traffic(gw: GatewayHandle): Promise<Record<string, Traffic>> {
  const snap = (await (await fetch(`${gw.adminUrl}/endpoints`)).json()) as {
    endpoints: Array<{ address: string; traffic: Traffic }>;
  };
  return Object.fromEntries(snap.endpoints.map((e) => [e.address, e.traffic]));
}

test("after a failover the served header names the endpoint that answered; forged ones are dropped", {
  timeout: 20_000,
}, async () => {
  const bad = await replica(0, fails); // first choice: idle, but failing
  const good = await replica(9, answers, streams);
  const gw = await gateway([bad, good]);
  try {
    const forged = { [SERVED]: bad.id };
    const r = await post(gw, "/v1/completions", { model: "m", prompt: "hello" }, forged);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers[SERVED], good.id, "the endpoint that served, not the first pick or a forgery");
    assert.equal(bad.hits("/v1/completions"), 1, "the first pick was tried");
    const upstream = good.requests.find((q) => q.method === "POST");
    assert.equal(upstream?.headers[SERVED], undefined, "the client's header is not forwarded");

    assert.deepEqual(await traffic(gw), {
      [bad.id]: { requests: 1, retries: 0, failures: 1 },
      [good.id]: { requests: 1, retries: 1, failures: 0 },
    });
    // bad is now on probation: the next request (streamed) goes to good directly, not as a retry.
    const s = await post(gw, "/v1/chat/completions", {
      model: "m",
      stream: true,
      messages: [{ role: "user", content: "hi" }],
    });
    assert.equal(s.status, 200);
    assert.match(String(s.headers["content-type"]), /^text\/event-stream/);
    assert.equal(s.headers[SERVED], good.id);
    assert.deepEqual((await traffic(gw))[good.id], { requests: 2, retries: 1, failures: 0 });

    const fams = parsePromText(await (await fetch(`${gw.adminUrl}/metrics`)).text()).families;
    const attempts = (fams.get("llm_d_epp_scheduler_attempts_total")?.samples ?? []).map((x) => [
      x.labels.status,
      `${x.labels.endpoint_name}:${x.labels.port}`,
      x.value,
    ]);
    assert.deepEqual(
      attempts.sort(),
      [
        ["retry", good.id, 1],
        ["success", bad.id, 1],
        ["success", good.id, 1],
      ].sort(),
    );
  } finally {
    await gw.close();
    await bad.close();
    await good.close();
  }
});

test("with servedEndpointHeader off no served header reaches the client, not even a replica's", {
  timeout: 20_000,
}, async () => {
  const a = await replica(0, answers);
  const gw = await gateway([a], { servedEndpointHeader: false });
  try {
    const r = await post(gw, "/v1/completions", { model: "m", prompt: "hello" }, { [SERVED]: "1.2.3.4:5" });
    assert.equal(r.status, 200);
    assert.equal(r.headers[SERVED], undefined);
    assert.deepEqual((await traffic(gw))[a.id], { requests: 1, retries: 0, failures: 0 });
  } finally {
    await gw.close();
    await a.close();
  }
});

test("a request every endpoint fails counts a failure on each and carries no served header", {
  timeout: 20_000,
}, async () => {
  const a = await replica(0, fails);
  const b = await replica(9, fails);
  const gw = await gateway([a, b]);
  try {
    const r = await post(gw, "/v1/completions", { model: "m", prompt: "hello" });
    assert.equal(r.status, 503);
    assert.equal(r.headers[SERVED], undefined);
    assert.deepEqual(await traffic(gw), {
      [a.id]: { requests: 1, retries: 0, failures: 1 },
      [b.id]: { requests: 1, retries: 1, failures: 1 },
    });
  } finally {
    await gw.close();
    await a.close();
    await b.close();
  }
});
