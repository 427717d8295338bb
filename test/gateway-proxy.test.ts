/**
 * The gateway's forwarding path against small scripted upstreams: bytes forwarded unchanged,
 * SSE passed through event by event, client disconnects aborting the upstream, control headers
 * stripped and ignored, failover before the first byte, clean failure after it, empty bodies, and
 * backpressure from a client that stops reading.
 */
import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { test } from "node:test";
import { request } from "undici";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { CONTROL_HEADERS, isControlHeader } from "../src/gateway/headers.ts";
import {
  type FakeServer,
  type Handler,
  modelList,
  startFake,
  vllmMetrics,
  waitFor,
} from "./helpers/gateway-fakes.ts";

/** Scores only scraped load, so a test decides the pick by the metrics it serves. */
const LOAD_ONLY = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
`;

const OK_JSON = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}';
const okHandler: Handler = (_q, res) =>
  void res.writeHead(200, { "content-type": "application/json" }).end(OK_JSON);

/** A fake replica: /metrics with the given load, /v1/models with "m", completions by `gen`. */
function replica(load: { waiting: number; kv: number }, gen: Handler = okHandler): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics(load)),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": gen,
    "POST /v1/chat/completions": gen,
  });
}

const IDLE = { waiting: 0, kv: 0.1 };
const BUSY = { waiting: 50, kv: 0.9 };

async function gateway(
  fakes: FakeServer[],
  extra: Parameters<typeof startGateway>[0] = {},
): Promise<GatewayHandle> {
  const gw = await startGateway({
    endpoints: fakes.map((f) => f.id).join(","),
    config: LOAD_ONLY,
    scrapeIntervalMs: 20,
    log: () => {},
    ...extra,
  });
  await waitFor(
    () => gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
    "first scrape of every endpoint",
  );
  return gw;
}

async function post(url: string, body: string | Buffer, headers: Record<string, string> = {}) {
  const r = await request(url, {
    method: "POST",
    body,
    headers: { "content-type": "application/json", ...headers },
  });
  return { status: r.statusCode, headers: r.headers, text: await r.body.text() };
}

const completion = (extra: object = {}) =>
  JSON.stringify({ model: "m", prompt: "hello", max_tokens: 3, ...extra });

test("the original request bytes reach the replica unchanged, with a request id", {
  timeout: 20_000,
}, async () => {
  const up = await replica(IDLE);
  const gw = await gateway([up]);
  try {
    // Odd spacing, escapes, key order and unknown fields: a re-serialised body would differ.
    const raw = Buffer.from(
      '{ "zzz" : [1,2,  3],\n "model":"m", "prompt" : "caf\\u00e9 \u00e9 \ud83d\ude00", "max_tokens":3,' +
        ' "nested": {"b":1,"a":2.50}, "cache_salt": "s" }',
    );
    const r = await post(`${gw.url}/v1/completions?x=1`, raw, { "x-request-id": "client-id-7" });
    assert.equal(r.status, 200);
    assert.equal(r.text, OK_JSON);
    const got = up.requests.find((q) => q.method === "POST");
    assert.ok(got);
    assert.ok(got.body.equals(raw), "body forwarded byte for byte");
    assert.equal(got.url, "/v1/completions?x=1");
    assert.equal(got.headers["content-length"], String(raw.length));
    assert.equal(got.headers["x-request-id"], "client-id-7");
    await post(`${gw.url}/v1/completions`, completion());
    const second = up.requests.filter((q) => q.method === "POST")[1];
    assert.match(
      String(second.headers["x-request-id"]),
      /^[0-9a-f-]{36}$/,
      "a missing request id is generated",
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test("SSE passes through event by event: the client sees the first before the last is sent", {
  timeout: 20_000,
}, async () => {
  let release!: () => void;
  const clientSawFirst = new Promise<void>((r) => (release = r));
  let secondSent = false;
  const up = await replica(IDLE, async (_q, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    await clientSawFirst; // without pass-through this never resolves and the test times out
    secondSent = true;
    res.write('data: {"n":2}\n\n');
    res.end("data: [DONE]\n\n");
  });
  const gw = await gateway([up]);
  try {
    const r = await request(`${gw.url}/v1/completions`, {
      method: "POST",
      body: completion({ stream: true }),
    });
    assert.equal(r.statusCode, 200);
    assert.match(String(r.headers["content-type"]), /^text\/event-stream/);
    let text = "";
    for await (const chunk of r.body) {
      text += chunk.toString();
      if (text.includes('{"n":1}') && !secondSent) {
        assert.ok(!text.includes('{"n":2}'));
        release();
      }
    }
    assert.equal(text, 'data: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n');
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a client disconnect aborts the upstream request", { timeout: 20_000 }, async () => {
  let upstreamClosed!: () => void;
  const closed = new Promise<void>((r) => (upstreamClosed = r));
  const up = await replica(IDLE, (_q, res: ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    res.on("close", () => upstreamClosed()); // the stream is never ended by the upstream itself
  });
  const gw = await gateway([up]);
  try {
    const ac = new AbortController();
    const r = await request(`${gw.url}/v1/completions`, {
      method: "POST",
      body: completion({ stream: true }),
      signal: ac.signal,
    });
    for await (const chunk of r.body) {
      assert.match(chunk.toString(), /"n":1/);
      ac.abort();
      break;
    }
    await closed;
    await waitFor(() => gw.gateway.active === 0, "request released");
    const text = await gw.gateway.metrics.text();
    assert.match(
      text,
      /kvgate_http_requests_total\{route="completions",status="499",outcome="client-disconnect"\} 1/,
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test("routing-control headers are stripped before forwarding and never change the pick", {
  timeout: 20_000,
}, async () => {
  const busy = await replica(BUSY);
  const idle = await replica(IDLE);
  const gw = await gateway([busy, idle]);
  try {
    const hostile: Record<string, string> = {};
    for (const h of CONTROL_HEADERS) hostile[h] = busy.id;
    Object.assign(hostile, {
      "X-Prefiller-Host-Port": busy.id,
      "x-llm-d-video-frames": "1",
      "x-gateway-anything": busy.id,
      "x-kvgate-debug": "1",
      "x-custom-app-header": "kept",
    });
    for (let i = 0; i < 3; i++) {
      const r = await post(`${gw.url}/v1/completions`, completion({ prompt: `p${i}` }), hostile);
      assert.equal(r.status, 200);
    }
    assert.equal(
      busy.requests.filter((q) => q.method === "POST").length,
      0,
      "the named endpoint was not obeyed",
    );
    const got = idle.requests.filter((q) => q.method === "POST");
    assert.equal(got.length, 3);
    for (const q of got) {
      const leaked = Object.keys(q.headers).filter(isControlHeader);
      assert.deepEqual(leaked, []);
      assert.equal(q.headers["x-custom-app-header"], "kept");
    }
  } finally {
    await gw.close();
    await busy.close();
    await idle.close();
  }
});

const FAILURES: Array<[string, Handler]> = [
  ["a 5xx answer", (_q, res) => void res.writeHead(503).end('{"error":{"message":"engine dead"}}')],
  ["a reset before any response", (q) => void q.socket.destroy()],
  [
    "death after the headers, before the first body byte",
    (q, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.flushHeaders();
      setImmediate(() => q.socket.destroy());
    },
  ],
];

for (const [what, failing] of FAILURES) {
  test(`failover: ${what} goes to the next endpoint, which then serves; the failed one is on probation`, {
    timeout: 20_000,
  }, async () => {
    const bad = await replica(IDLE, failing); // preferred: idle
    const good = await replica(BUSY);
    const gw = await gateway([bad, good], { probationBaseMs: 60_000 }); // outlasts any test delay
    try {
      const r = await post(`${gw.url}/v1/completions`, completion());
      assert.equal(r.status, 200);
      assert.equal(r.text, OK_JSON);
      assert.equal(bad.requests.filter((q) => q.method === "POST").length, 1);
      const snap = (await (await fetch(`${gw.adminUrl}/endpoints`)).json()) as {
        endpoints: Array<{ address: string; eligible: boolean; probationRemainingMs: number }>;
      };
      const b = snap.endpoints.find((e) => e.address === bad.id);
      assert.ok(b && !b.eligible && b.probationRemainingMs > 0);
      // On probation: the next request goes straight to the good endpoint.
      assert.equal((await post(`${gw.url}/v1/completions`, completion())).status, 200);
      assert.equal(bad.requests.filter((q) => q.method === "POST").length, 1);
      assert.equal(good.requests.filter((q) => q.method === "POST").length, 2);
      assert.match(
        await gw.gateway.metrics.text(),
        new RegExp(`kvgate_upstream_failures_total\\{endpoint="${bad.id}"`),
      );
    } finally {
      await gw.close();
      await bad.close();
      await good.close();
    }
  });
}

test("failover: a refused connection marks the endpoint unhealthy at once", { timeout: 20_000 }, async () => {
  const dead = await replica(IDLE);
  const good = await replica(BUSY);
  const gw = await gateway([dead, good], { scrapeIntervalMs: 60_000 }); // no scrape notices the death
  try {
    await dead.close();
    const r = await post(`${gw.url}/v1/completions`, completion());
    assert.equal(r.status, 200);
    assert.equal(gw.gateway.data.store.get(dead.id)?.health, "unhealthy");
  } finally {
    await gw.close();
    await good.close();
  }
});

test("when every attempt fails before the first byte the client gets a 503 error", {
  timeout: 20_000,
}, async () => {
  const fail: Handler = (_q, res) => void res.writeHead(500).end('{"error":{"message":"boom"}}');
  const a = await replica(IDLE, fail);
  const b = await replica(BUSY, fail);
  const gw = await gateway([a, b]);
  try {
    const r = await post(`${gw.url}/v1/completions`, completion());
    assert.equal(r.status, 503);
    const e = JSON.parse(r.text).error;
    assert.equal(e.type, "ServiceUnavailableError");
    assert.equal(e.code, 503);
    assert.match(e.message, /all 2 endpoint attempt\(s\) failed/);
    assert.match(e.message, /HTTP 500: boom/);
  } finally {
    await gw.close();
    await a.close();
    await b.close();
  }
});

test("a replica's 4xx answer is passed through, not retried", { timeout: 20_000 }, async () => {
  const body = '{"error":{"message":"prompt too long","type":"BadRequestError","param":null,"code":400}}';
  const a = await replica(
    IDLE,
    (_q, res) => void res.writeHead(400, { "content-type": "application/json" }).end(body),
  );
  const b = await replica(BUSY);
  const gw = await gateway([a, b]);
  try {
    const r = await post(`${gw.url}/v1/completions`, completion());
    assert.deepEqual([r.status, r.text], [400, body]);
    assert.equal(b.requests.filter((q) => q.method === "POST").length, 0);
  } finally {
    await gw.close();
    await a.close();
    await b.close();
  }
});

test("an upstream dying mid-stream ends the SSE stream with an error event and [DONE]", {
  timeout: 20_000,
}, async () => {
  const up = await replica(IDLE, (q, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    res.write('data: {"partial": tr'); // an event cut in half
    setTimeout(() => q.socket.destroy(), 20);
  });
  const gw = await gateway([up]);
  try {
    const r = await post(`${gw.url}/v1/completions`, completion({ stream: true }));
    assert.equal(r.status, 200);
    const events = r.text.split("\n\n").filter(Boolean);
    assert.equal(events.length, 3, r.text);
    assert.equal(events[0], 'data: {"n":1}');
    const err = JSON.parse(events[1].slice("data: ".length)).error;
    assert.match(err.message, /failed mid-response/);
    assert.deepEqual(Object.keys(err).sort(), ["code", "message", "param", "type"]);
    assert.equal(events[2], "data: [DONE]");
    assert.ok(!r.text.includes("partial"));
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a non-streaming response cut mid-body reaches the client as an error, not a hang", {
  timeout: 20_000,
}, async () => {
  const up = await replica(IDLE, (q, res) => {
    res.writeHead(200, { "content-type": "application/json", "content-length": "500" });
    res.write('{"id":"cmpl-1","choi');
    setTimeout(() => q.socket.destroy(), 20);
  });
  const gw = await gateway([up]);
  try {
    const r = await request(`${gw.url}/v1/completions`, { method: "POST", body: completion() });
    assert.equal(r.statusCode, 200);
    await assert.rejects(r.body.text());
    assert.equal((await fetch(`${gw.url}/health`)).status, 200, "the gateway is still up");
  } finally {
    await gw.close();
    await up.close();
  }
});

test("an empty response body reaches the client as an empty response, not a hang", {
  timeout: 20_000,
}, async () => {
  const up = await replica(IDLE, (_q, res) => {
    res.writeHead(200, { "content-type": "application/json", "content-length": "0" }).end();
  });
  const gw = await gateway([up]);
  try {
    const r = await post(`${gw.url}/v1/completions`, completion());
    assert.deepEqual([r.status, r.text], [200, ""]);
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a client that stops reading holds the upstream back (backpressure), then gets every byte", {
  timeout: 30_000,
}, async () => {
  const EVENT = `data: ${JSON.stringify({ pad: "x".repeat(64 * 1024) })}\n\n`;
  const COUNT = 1024; // 64 MiB in all
  let sent = 0;
  const up = await replica(IDLE, async (_q, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    for (let i = 0; i < COUNT; i++) {
      sent++;
      if (!res.write(EVENT)) await new Promise((r) => res.once("drain", r));
    }
    res.end("data: [DONE]\n\n");
  });
  const gw = await gateway([up]);
  try {
    const r = await request(`${gw.url}/v1/completions`, {
      method: "POST",
      body: completion({ stream: true }),
    });
    assert.equal(r.statusCode, 200);
    // Unread, the stream stalls once the socket buffers on both hops are full: a relay without
    // backpressure would have taken all 64 MiB into the gateway's memory by now.
    for (let before = -1; sent !== before; ) {
      before = sent;
      await new Promise((res) => setTimeout(res, 300));
    }
    assert.ok(
      sent < COUNT / 2,
      `the upstream sent ${sent} of ${COUNT} events to a client that reads nothing`,
    );
    let bytes = 0;
    let tail = "";
    for await (const c of r.body) {
      bytes += c.length;
      tail = (tail + c.toString("latin1")).slice(-32);
    }
    assert.equal(bytes, EVENT.length * COUNT + "data: [DONE]\n\n".length);
    assert.ok(tail.endsWith("data: [DONE]\n\n"));
  } finally {
    await gw.close();
    await up.close();
  }
});
