/**
 * Every bad input gets its status and an OpenAI error body (and llm-d's drop-reason header where
 * llm-d sets one), the process stays up, limits hold, and shutdown drains in-flight requests.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Client, request } from "undici";
import { startGateway } from "../src/gateway/gateway.ts";
import { forwardRequestHeaders, forwardResponseHeaders } from "../src/gateway/headers.ts";
import { parseRequestBody } from "../src/gateway/request-body.ts";
import {
  type FakeServer,
  type Handler,
  modelList,
  startFake,
  vllmMetrics,
  waitFor,
} from "./helpers/gateway-fakes.ts";

const MINIMAL_CONFIG =
  "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n";

function replica(
  load: { waiting: number; kv: number },
  gen?: Handler,
  metricsOk = true,
): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) =>
      void (metricsOk ? res.writeHead(200).end(vllmMetrics(load)) : res.writeHead(500).end()),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions":
      gen ??
      ((_q, res) => void res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}')),
  });
}

async function call(url: string, method: string, body?: string, headers: Record<string, string> = {}) {
  const r = await request(url, { method: method as "POST", body, headers });
  const text = await r.body.text();
  return { status: r.statusCode, headers: r.headers, text };
}

function assertOpenAIError(
  r: { status: number; headers: Record<string, unknown>; text: string },
  status: number,
) {
  assert.equal(r.status, status, r.text);
  assert.match(String(r.headers["content-type"]), /application\/json/);
  const e = JSON.parse(r.text).error;
  assert.deepEqual(Object.keys(e).sort(), ["code", "message", "param", "type"]);
  assert.equal(e.code, status);
  assert.equal(typeof e.message, "string");
  return e as { message: string; type: string; param: string | null; code: number };
}

/** Sends raw bytes on a fresh connection and returns what comes back until the server closes. */
function raw(port: number, data: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(port, "127.0.0.1");
    let out = "";
    s.setEncoding("utf8");
    s.on("data", (d) => (out += d));
    s.on("error", () => resolve(out));
    s.on("close", () => resolve(out));
    s.on("connect", () => s.write(data));
    setTimeout(() => {
      s.destroy();
      reject(new Error(`no close; got: ${out}`));
    }, 10_000).unref();
  });
}

const BAD: Array<[string, string, string, number, RegExp, string | null]> = [
  [
    "/v1/completions",
    "POST",
    "not json",
    400,
    /^Invalid JSON in request body: .*; send one JSON object, e\.g\. \{"model": "<id>", "prompt": "hi"\}$/,
    null,
  ],
  ["/v1/completions", "POST", "", 400, /^Invalid JSON.*; send one JSON object/, null],
  [
    "/v1/chat/completions",
    "POST",
    "{",
    400,
    /^Invalid JSON.*; send one JSON object, e\.g\. \{"model": "<id>", "messages": \[\{"role": "user"/,
    null,
  ],
  ["/v1/completions", "POST", "[1,2]", 400, /^Request body must be a JSON object; send one, e\.g\./, null],
  [
    "/v1/completions",
    "POST",
    '{"prompt":"x"}',
    400,
    /^model is required; set "model" to a served model id \(GET \/v1\/models lists them\)$/,
    "model",
  ],
  ["/v1/completions", "POST", '{"model":5,"prompt":"x"}', 400, /model must be/, "model"],
  ["/v1/completions", "POST", '{"model":"  ","prompt":"x"}', 400, /model must be/, "model"],
  ["/v1/completions", "POST", '{"model":"m","prompt":"x","stream":"yes"}', 400, /stream/, "stream"],
  [
    "/v1/completions",
    "POST",
    '{"model":"m"}',
    400,
    /^prompt is required; set "prompt" to the text to complete: a string/,
    "prompt",
  ],
  ["/v1/completions", "POST", '{"model":"m","prompt":{"a":1}}', 400, /prompt must be/, "prompt"],
  ["/v1/completions", "POST", '{"model":"m","prompt":[1,"a"]}', 400, /prompt must be/, "prompt"],
  ["/v1/completions", "POST", '{"model":"m","prompt":"x","max_tokens":-1}', 400, /max_tokens/, "max_tokens"],
  ["/v1/completions", "POST", '{"model":"m","prompt":"x","max_tokens":1.5}', 400, /max_tokens/, "max_tokens"],
  ["/v1/completions", "POST", '{"model":"m","prompt":"x","cache_salt":5}', 400, /cache_salt/, "cache_salt"],
  ["/v1/chat/completions", "POST", '{"model":"m","messages":[]}', 400, /non-empty array/, "messages"],
  ["/v1/chat/completions", "POST", '{"model":"m","messages":[{"content":"x"}]}', 400, /role/, "messages[0]"],
  [
    "/v1/chat/completions",
    "POST",
    '{"model":"m","messages":[{"role":"user","content":7}]}',
    400,
    /content/,
    "messages[0].content",
  ],
  [
    "/v1/chat/completions",
    "POST",
    '{"model":"m","messages":[{"role":"user"}],"tools":{}}',
    400,
    /tools/,
    "tools",
  ],
  [
    "/v1/embeddings",
    "POST",
    '{"model":"m"}',
    400,
    /^input is required; set "input" to the text to embed: a string/,
    "input",
  ],
  [
    "/v1/completions",
    "POST",
    '{"model":"nope","prompt":"x"}',
    404,
    /^The model `nope` does not exist\. Served models: m; set "model" to one of them\.$/,
    "model",
  ],
  ["/v1/completions", "GET", "", 405, /^Method GET is not allowed on \/v1\/completions; use POST$/, null],
  ["/v1/models", "POST", "{}", 405, /^Method POST is not allowed on \/v1\/models; use GET$/, null],
  ["/health", "POST", "{}", 405, /^Method POST is not allowed on \/health; use GET$/, null],
  [
    "/v2/anything",
    "GET",
    "",
    404,
    /^No route for GET \/v2\/anything; use POST \/v1\/completions, \/v1\/chat\/completions or \/v1\/embeddings, or GET \/v1\/models or \/health/,
    null,
  ],
  ["/endpoints", "GET", "", 404, /No route/, null],
  ["/explain", "POST", '{"model":"m","prompt":"x"}', 404, /No route/, null],
  ["/reload", "POST", "", 404, /No route/, null],
  ["/metrics", "GET", "", 404, /No route/, null],
];

test("every bad input gets its status and an OpenAI error; the admin API is not on the public port", {
  timeout: 30_000,
}, async () => {
  const up = await replica({ waiting: 0, kv: 0 });
  const gw = await startGateway({
    endpoints: up.id,
    scrapeIntervalMs: 20,
    maxBodyBytes: 1024,
    log: () => {},
  });
  try {
    await waitFor(() => gw.gateway.data.store.get(up.id)?.modelIds !== null, "models known");
    for (const [path, method, body, status, msg, param] of BAD) {
      const r = await call(`${gw.url}${path}`, method, method === "GET" ? undefined : body);
      const e = assertOpenAIError(r, status);
      assert.match(e.message, msg, `${method} ${path} ${body}`);
      assert.equal(e.param, param, `${method} ${path} ${body}`);
    }
    assert.equal((await call(`${gw.url}/v1/completions`, "GET")).headers.allow, "POST");
    // 413: declared too large, and a chunked body that grows past the limit.
    const declared = await raw(
      Number(new URL(gw.url).port),
      "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 999999\r\n\r\n",
    );
    assert.match(declared, /^HTTP\/1\.1 413 /);
    assert.match(declared, /"RequestEntityTooLargeError"/);
    const chunk = `258\r\n${"x".repeat(600)}\r\n`;
    const chunked = await raw(
      Number(new URL(gw.url).port),
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n${chunk}${chunk}`,
    );
    assert.match(chunked, /^HTTP\/1\.1 413 /);
    assert.match(
      chunked,
      /limit is 1024 bytes \(body\); send a smaller body, or restart kvgate with a larger --max-body-bytes/,
    );
    // Still up and serving.
    const ok = await call(`${gw.url}/v1/completions`, "POST", '{"model":"m","prompt":"x"}');
    assert.deepEqual([ok.status, ok.text], [200, '{"ok":true}']);
    assert.equal(
      up.requests.filter((q) => q.method === "POST").length,
      1,
      "no bad request reached the replica",
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test("no available endpoint → 503 rejected-no-endpoints; shed sheddable → 429 rejected-saturated", {
  timeout: 30_000,
}, async () => {
  const sick = await replica({ waiting: 0, kv: 0 }, undefined, false);
  const gw1 = await startGateway({
    endpoints: sick.id,
    scrapeIntervalMs: 10,
    failureThreshold: 2,
    log: () => {},
  });
  try {
    await waitFor(() => gw1.gateway.data.store.get(sick.id)?.health === "unhealthy", "unhealthy");
    const r = await call(`${gw1.url}/v1/completions`, "POST", '{"model":"m","prompt":"x"}');
    assertOpenAIError(r, 503);
    assert.equal(r.headers["x-llm-d-request-dropped-reason"], "rejected-no-endpoints");
    const models = await call(`${gw1.url}/v1/models`, "GET");
    assert.match(
      assertOpenAIError(models, 503).message,
      /^no endpoint is available; wait for a replica to become ready \(GET \/endpoints on the admin port/,
    );
  } finally {
    await gw1.close();
    await sick.close();
  }

  const busy = await replica({ waiting: 100, kv: 0.95 });
  const objectives = join(tmpdir(), `kvgate-objectives-${process.pid}.yaml`);
  writeFileSync(objectives, "models:\n  m: -1\n");
  const config = `${MINIMAL_CONFIG}---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: premium}\nspec: {priority: 5}\n`;
  const gw2 = await startGateway({
    endpoints: busy.id,
    config,
    modelObjectivesFile: objectives,
    scrapeIntervalMs: 10,
    log: () => {},
  });
  try {
    await waitFor(() => gw2.gateway.data.store.get(busy.id)?.state.metrics !== null, "scraped");
    const shed = await call(`${gw2.url}/v1/completions`, "POST", '{"model":"m","prompt":"x"}');
    const e = assertOpenAIError(shed, 429);
    assert.equal(e.type, "RateLimitError");
    assert.match(
      e.message,
      /^system saturated, sheddable request dropped; retry with backoff, or send it under an objective with priority ≥ 0/,
    );
    assert.equal(shed.headers["x-llm-d-request-dropped-reason"], "rejected-saturated");
    // A known objective with priority ≥ 0 is admitted (and the header is not forwarded).
    const kept = await call(`${gw2.url}/v1/completions`, "POST", '{"model":"m","prompt":"x"}', {
      "x-llm-d-inference-objective": "premium",
    });
    assert.equal(kept.status, 200);
    const fwd = busy.requests.filter((q) => q.method === "POST");
    assert.equal(fwd.length, 1);
    assert.equal(fwd[0].headers["x-llm-d-inference-objective"], undefined);
    assert.match(
      await gw2.gateway.metrics.text(),
      /llm_d_epp_request_error_total\{[^}]*error_code="ResourceExhausted"\} 1/,
    );
  } finally {
    await gw2.close();
    await busy.close();
  }
});

test("beyond max concurrent requests → 503; shutdown drains the in-flight request", {
  timeout: 30_000,
}, async () => {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const up = await replica({ waiting: 0, kv: 0 }, async (_q, res) => {
    await gate;
    res.writeHead(200, { "content-type": "application/json" }).end('{"slow":true}');
  });
  const gw = await startGateway({
    endpoints: up.id,
    maxConcurrentRequests: 1,
    scrapeIntervalMs: 20,
    log: () => {},
  });
  try {
    const slow = call(`${gw.url}/v1/completions`, "POST", '{"model":"m","prompt":"x"}');
    await waitFor(() => up.requests.some((q) => q.method === "POST"), "slow request upstream");
    const over = await call(`${gw.url}/v1/completions`, "POST", '{"model":"m","prompt":"y"}');
    assert.match(assertOpenAIError(over, 503).message, /too many concurrent requests/);
    const closing = gw.close();
    await waitFor(() => gw.gateway.draining, "draining");
    release();
    const r = await slow;
    assert.deepEqual([r.status, r.text], [200, '{"slow":true}']);
    await closing;
  } finally {
    release();
    await gw.close();
    await up.close();
  }
});

test("beyond max connections → 503 with connection: close on the extra connection; a freed slot is reused", {
  timeout: 30_000,
}, async () => {
  const up = await replica({ waiting: 0, kv: 0 });
  const gw = await startGateway({ endpoints: up.id, maxConnections: 1, scrapeIntervalMs: 20, log: () => {} });
  const first = new Client(gw.url);
  const second = new Client(gw.url);
  try {
    await waitFor(() => gw.gateway.data.store.get(up.id)?.state.metrics != null, "scraped");
    const body = '{"model":"m","prompt":"x"}';
    const post = (c: Client) =>
      c
        .request({
          path: "/v1/completions",
          method: "POST",
          body,
          headers: { "content-type": "application/json" },
        })
        .then(async (r) => ({ status: r.statusCode, headers: r.headers, text: await r.body.text() }));
    assert.equal((await post(first)).status, 200); // holds the one slot (keep-alive)
    const over = await post(second);
    assert.match(
      assertOpenAIError(over, 503).message,
      /too many open connections \(limit 1\).*--max-connections/,
    );
    assert.equal(over.headers.connection, "close");
    assert.equal((await post(first)).status, 200, "the admitted connection keeps working");
    await first.close();
    await waitFor(() => gw.gateway.connections.open === 0, "slot freed");
    const third = new Client(gw.url);
    assert.equal((await post(third)).status, 200);
    await third.close();
    assert.match(
      await gw.gateway.metrics.text(),
      /kvgate_http_requests_total\{[^}]*status="503",outcome="rejected"\} 1/,
    );
  } finally {
    await first.close().catch(() => {});
    await second.close().catch(() => {});
    await gw.close();
    await up.close();
  }
});

test("header filtering: hop-by-hop and Connection-listed headers are dropped both ways", () => {
  const out = forwardRequestHeaders({
    connection: "keep-alive, x-secret",
    "keep-alive": "timeout=5",
    "x-secret": "1",
    host: "gw",
    "content-length": "10",
    "transfer-encoding": "chunked",
    te: "trailers",
    authorization: "Bearer k",
    "x-gateway-destination-endpoint": "10.0.0.1:8000",
    "x-data-parallel-host-port": "10.0.0.1:8001",
    "x-session-token": "abc",
  });
  assert.deepEqual(out, { authorization: "Bearer k", "x-session-token": "abc" });
  assert.deepEqual(
    forwardResponseHeaders({
      connection: "close",
      "transfer-encoding": "chunked",
      "content-length": "5",
      "x-a": "1",
    }),
    { "content-length": "5", "x-a": "1" },
  );
});

test("request parsing keeps only what scheduling needs", () => {
  const text =
    '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_completion_tokens":9,"max_tokens":4,"tools":[{"type":"function"}],"cache_salt":"s"}';
  const { json, ...chat } = parseRequestBody("chat", Buffer.from(text));
  // The decoded body itself rides along (for a model rewrite without a second decode).
  assert.deepEqual(json, JSON.parse(text));
  assert.deepEqual(parseRequestBody("chat", text).json, json);
  assert.deepEqual(chat, {
    route: "chat",
    model: "m",
    stream: true,
    prompt: { kind: "chat", messages: [{ role: "user", content: "hi" }], tools: [{ type: "function" }] },
    maxTokens: 9,
    cacheSalt: "s",
  });
  const tok = parseRequestBody(
    "completions",
    Buffer.from('{"model":"m","prompt":[[1,2],[3]],"max_tokens":null}'),
  );
  assert.deepEqual(tok.prompt, { kind: "completion", prompt: [[1, 2], [3]] });
  assert.equal(tok.maxTokens, undefined);
  assert.equal(tok.stream, false);
  const emb = parseRequestBody("embeddings", Buffer.from('{"model":"m","input":["a","b"],"max_tokens":3}'));
  assert.deepEqual([emb.prompt, emb.maxTokens], [{ kind: "completion", prompt: ["a", "b"] }, undefined]);
});
