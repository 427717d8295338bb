/**
 * HTTP/2 with prior knowledge on the public port (h2c.ts): a node:http2 client gets the same
 * answers as an HTTP/1.1 one (JSON, SSE ending in [DONE], OpenAI error JSON for the limits), many
 * streams share one connection, a stream the client resets aborts its upstream request, and
 * HTTP/1.1 still works on the same port.
 */
import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { type ClientHttp2Session, connect, constants } from "node:http2";
import { test } from "node:test";
import { request } from "undici";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import {
  type FakeServer,
  type Handler,
  modelList,
  startFake,
  vllmMetrics,
  waitFor,
} from "./helpers/gateway-fakes.ts";

const CONFIG = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n";

/** Streams `n` chunks then [DONE] when asked to stream, else one JSON body naming the prompt. */
const gen: Handler = (_q, res, body) => {
  const req = JSON.parse(body.toString()) as { stream?: boolean; messages: Array<{ content: string }> };
  const text = req.messages[0]?.content ?? "";
  if (!req.stream) {
    res.writeHead(200, { "content-type": "application/json", connection: "keep-alive" });
    res.end(JSON.stringify({ object: "chat.completion", choices: [{ message: { content: text } }] }));
    return;
  }
  res.writeHead(200, { "content-type": "text/event-stream", connection: "keep-alive" });
  let i = 0;
  const tick = () => {
    if (res.destroyed) return;
    if (i === 3) return void res.end("data: [DONE]\n\n");
    res.write(`data: ${JSON.stringify({ choices: [{ delta: { content: `${text}-${i++}` } }] })}\n\n`);
    setImmediate(tick);
  };
  tick();
};

function replica(handler: Handler = gen): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting: 0, kv: 0.1 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/chat/completions": handler,
  });
}

async function gateway(
  up: FakeServer,
  extra: Parameters<typeof startGateway>[0] = {},
): Promise<GatewayHandle> {
  const gw = await startGateway({
    endpoints: up.id,
    config: CONFIG,
    scrapeIntervalMs: 20,
    log: () => {},
    ...extra,
  });
  await waitFor(() => gw.gateway.data.store.readyCount(performance.now() / 1000) > 0, "replica scraped");
  return gw;
}

const chat = (content: string, stream: boolean) =>
  JSON.stringify({ model: "m", stream, messages: [{ role: "user", content }] });

interface H2Answer {
  status: number;
  headers: Record<string, unknown>;
  text: string;
}

function post(session: ClientHttp2Session, body: string): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const s = session.request({
      ":method": "POST",
      ":path": "/v1/chat/completions",
      "content-type": "application/json",
    });
    let status = 0;
    let headers: Record<string, unknown> = {};
    let text = "";
    s.on("response", (h) => {
      status = Number(h[":status"]);
      headers = h;
    });
    s.setEncoding("utf8");
    s.on("data", (c: string) => (text += c));
    s.on("end", () => resolve({ status, headers, text }));
    s.on("error", reject);
    s.end(body);
  });
}

function contents(sse: string): string[] {
  return sse
    .split("\n\n")
    .filter((e) => e.startsWith("data: {"))
    .map((e) => JSON.parse(e.slice(6)).choices[0].delta.content as string);
}

test("h2c: streaming and non-streaming chat completions, many streams on one connection", async () => {
  const up = await replica();
  const gw = await gateway(up);
  const session = connect(gw.url);
  try {
    const one = await post(session, chat("hello", false));
    assert.equal(one.status, 200, one.text);
    assert.equal(JSON.parse(one.text).choices[0].message.content, "hello");
    assert.equal(one.headers.connection, undefined);
    const answers = await Promise.all(
      Array.from({ length: 50 }, (_, i) => post(session, chat(`p${i}`, true))),
    );
    answers.forEach((a, i) => {
      assert.equal(a.status, 200, a.text);
      assert.match(String(a.headers["content-type"]), /text\/event-stream/);
      assert.deepEqual(contents(a.text), [`p${i}-0`, `p${i}-1`, `p${i}-2`]);
      assert.ok(a.text.endsWith("data: [DONE]\n\n"), a.text);
    });
    const sockets = await new Promise<number>((r) => gw.gateway.publicServer.getConnections((_e, n) => r(n)));
    assert.equal(sockets, 1, "all 51 requests arrived on one client connection");
    // HTTP/1.1 on the same port still works.
    const h1 = await request(`${gw.url}/v1/chat/completions`, { method: "POST", body: chat("h1", false) });
    assert.equal(h1.statusCode, 200);
    assert.equal(JSON.parse(await h1.body.text()).choices[0].message.content, "h1");
  } finally {
    session.close();
    await gw.close();
    await up.close();
  }
});

test("h2c: a stream the client resets aborts its upstream request", { timeout: 20_000 }, async () => {
  let upstreamClosed!: () => void;
  const closed = new Promise<void>((r) => (upstreamClosed = r));
  const up = await replica((_q, res: ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    res.on("close", () => upstreamClosed()); // never ended by the upstream itself
  });
  const gw = await gateway(up);
  const session = connect(gw.url);
  try {
    const s = session.request({ ":method": "POST", ":path": "/v1/chat/completions" });
    s.end(chat("x", true));
    const first = await new Promise<string>((r) => s.once("data", (c: Buffer) => r(c.toString())));
    assert.match(first, /"n":1/);
    s.close(constants.NGHTTP2_CANCEL);
    await closed;
    await waitFor(() => gw.gateway.active === 0, "request released");
    assert.match(
      await gw.gateway.metrics.text(),
      /kvgate_http_requests_total\{route="chat",status="499",outcome="client-disconnect"\} 1/,
    );
    // The session itself is fine: another stream on it is served.
    const up2 = await new Promise<boolean>((r) => {
      const p = session.request({ ":method": "GET", ":path": "/health" });
      p.on("response", (h) => r(h[":status"] === 200));
      p.resume();
    });
    assert.ok(up2, "the session still serves after one of its streams was reset");
  } finally {
    session.close();
    await gw.close();
    await up.close();
  }
});

test("h2c: the stream limit answers 503 with OpenAI error JSON per stream", { timeout: 20_000 }, async () => {
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const up = await replica((_q, res: ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    void held.then(() => res.end("data: [DONE]\n\n"));
  });
  const gw = await gateway(up, { maxConcurrentRequests: 2 });
  const session = connect(gw.url);
  try {
    const long = [post(session, chat("a", true)), post(session, chat("b", true))];
    await waitFor(() => gw.gateway.active === 2, "two streams admitted");
    const over = await Promise.all([post(session, chat("c", true)), post(session, chat("d", false))]);
    for (const r of over) {
      assert.equal(r.status, 503, r.text);
      assert.match(String(r.headers["content-type"]), /application\/json/);
      const e = JSON.parse(r.text).error;
      assert.equal(e.code, 503);
      assert.equal(e.type, "ServiceUnavailableError");
      assert.match(e.message, /too many concurrent requests \(limit 2\).*--max-concurrent-requests/);
    }
    release();
    for (const r of await Promise.all(long)) assert.ok(r.text.endsWith("data: [DONE]\n\n"), r.text);
  } finally {
    release();
    session.close();
    await gw.close();
    await up.close();
  }
});

test("h2c: a connection over --max-connections gets 503 per stream, then GOAWAY", {
  timeout: 20_000,
}, async () => {
  const up = await replica();
  const gw = await gateway(up, { maxConnections: 1 });
  const first = connect(gw.url);
  let second: ClientHttp2Session | null = null;
  try {
    assert.equal((await post(first, chat("ok", false))).status, 200);
    second = connect(gw.url);
    const away = new Promise<void>((res) => second?.once("goaway", () => res()));
    const r = await post(second, chat("no", false));
    assert.equal(r.status, 503, r.text);
    assert.equal(r.headers.connection, undefined);
    assert.match(
      JSON.parse(r.text).error.message,
      /too many open connections \(limit 1\).*--max-connections/,
    );
    await away;
  } finally {
    first.close();
    second?.destroy();
    await gw.close();
    await up.close();
  }
});

test("h2c: shutdown sends GOAWAY and lets the streams in flight finish", { timeout: 20_000 }, async () => {
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const up = await replica((_q, res: ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write('data: {"n":1}\n\n');
    void held.then(() => res.end("data: [DONE]\n\n"));
  });
  const gw = await gateway(up, { drainTimeoutMs: 10_000 });
  const session = connect(gw.url);
  try {
    const inFlight = post(session, chat("a", true));
    await waitFor(() => gw.gateway.active === 1, "stream admitted");
    const away = new Promise<void>((r) => session.once("goaway", () => r()));
    const closing = gw.close();
    await away;
    release();
    const r = await inFlight;
    assert.equal(r.status, 200);
    assert.ok(r.text.endsWith("data: [DONE]\n\n"), r.text);
    await closing;
  } finally {
    release();
    session.destroy();
    await gw.close();
    await up.close();
  }
});
