/**
 * The Envoy-like test proxy (src/bench/ext-proc/) against a scripted ext_proc server: what it sends
 * on the stream and when, how it applies the replies, where it routes, in FULL_DUPLEX_STREAMED and
 * BUFFERED modes. Failures, caps and immediate responses are in ext-proc-proxy-failures.test.ts.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { type EnvoyLikeProxyOptions, startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import {
  bodyOf,
  type FakeBackend,
  type FakeExtProc,
  headersOf,
  type Msg,
  readUntilEos,
  type Stream,
  setHeader,
  startBackend,
  startFakeExtProc,
  streamedReplies,
} from "./helpers/fake-ext-proc.ts";

const DEST = "x-gateway-destination-endpoint";
const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

async function proxyFor(fake: FakeExtProc, opts: Partial<EnvoyLikeProxyOptions> = {}) {
  const proxy = await startEnvoyLikeProxy({ extProc: fake.address, ...opts });
  closers.push(() => proxy.close());
  return proxy;
}

async function backend(...args: Parameters<typeof startBackend>): Promise<FakeBackend> {
  const b = await startBackend(...args);
  closers.push(() => b.close());
  return b;
}

/** An EPP in FULL_DUPLEX_STREAMED: waits for the whole body, picks, re-sends a rewritten body. */
function fullDuplexEpp(target: () => string, rewrite: (body: string) => string) {
  return async (call: Stream, _received: Msg[], next: () => Promise<Msg | null>) => {
    const request = await readUntilEos(next, "request_body");
    const body = Buffer.from(rewrite(bodyOf(request, "request_body").toString()));
    call.write({
      request_headers: {
        response: {
          clear_route_cache: true,
          header_mutation: {
            set_headers: [setHeader(DEST, `${target()},10.9.9.9:1`), setHeader("content-length", "1")],
            remove_headers: ["x-secret"],
          },
        },
      },
    });
    for (const r of streamedReplies("request_body", body, 3)) call.write(r);
    const head = await next();
    if (!head) return;
    call.write({
      response_headers: { response: { header_mutation: { set_headers: [setHeader("x-seen", "1")] } } },
    });
    if (head.response_headers.end_of_stream) return call.end();
    for (let m = await next(); m; m = await next()) {
      const chunk = Buffer.from(m.response_body.body ?? []);
      call.write(
        streamedReplies("response_body", Buffer.from(chunk.toString().toUpperCase()), 1).map((r) => {
          (r.response_body!.response!.body_mutation!.streamed_response!.end_of_stream as boolean) =
            m.response_body.end_of_stream;
          return r;
        })[0]!,
      );
      if (m.response_body.end_of_stream) break;
    }
    call.end();
  };
}

test("FULL_DUPLEX_STREAMED: headers then streamed body before any reply, routed on the header, bodies replaced", async () => {
  const be = await backend();
  const fake = await startFakeExtProc(
    fullDuplexEpp(
      () => be.endpoint,
      (b) => b.replace('"m"', '"m2"'),
    ),
  );
  closers.push(() => fake.close());
  const proxy = await proxyFor(fake);
  const payload = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(200_000) }] });
  const res = await fetch(`${proxy.url}/v1/chat/completions?x=1`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-secret": "s", [DEST]: "10.0.0.1:9" },
    body: payload,
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("x-seen"), "1");
  const upstreamBody = payload.replace('"m"', '"m2"');
  assert.equal(
    await res.text(),
    JSON.stringify({ echo: upstreamBody.length, path: "/v1/chat/completions?x=1" }).toUpperCase(),
  );

  const msgs = fake.streams[0]!;
  assert.equal(msgs[0].request, "request_headers");
  const h = headersOf(msgs[0]);
  assert.deepEqual(
    [h[":method"], h[":path"], h[":scheme"], h[":authority"]],
    ["POST", "/v1/chat/completions?x=1", "http", `127.0.0.1:${proxy.port}`],
  );
  assert.ok(
    msgs[0].request_headers.headers.headers.every((e: Msg) => !e.value),
    "values go in raw_value",
  );
  assert.equal(msgs[0].request_headers.end_of_stream, false);
  assert.deepEqual(
    [msgs[0].protocol_config.request_body_mode, msgs[0].protocol_config.response_body_mode],
    [4, 4],
    "the first message says FULL_DUPLEX_STREAMED, as current Envoy does",
  );
  assert.equal(msgs[1].protocol_config, undefined, "only the first message carries protocol_config");
  assert.equal(h[DEST], "10.0.0.1:9", "the processor sees the client's forged header (and must remove it)");
  const bodies = msgs.filter((m) => m.request === "request_body");
  assert.ok(bodies.length >= 2, `a 200 KB body arrives in several chunks (got ${bodies.length})`);
  assert.deepEqual(
    bodies.map((m) => Boolean(m.request_body.end_of_stream)),
    bodies.map((_, i) => i === bodies.length - 1),
  );
  assert.equal(bodyOf(msgs, "request_body").toString(), payload);

  const seen = be.seen[0]!;
  assert.equal(seen.body, upstreamBody, "upstream gets exactly the streamed_response chunks");
  assert.equal(seen.headers[DEST], `${be.endpoint},10.9.9.9:1`);
  assert.equal(seen.headers["x-secret"], undefined);
  assert.equal(seen.headers["content-length"], undefined, "content-length is not set in streamed mode");
  assert.equal(seen.headers["transfer-encoding"], "chunked");
  assert.match(String(seen.headers["x-request-id"]), /^[0-9a-f-]{36}$/);

  const rh = msgs.find((m) => m.request === "response_headers");
  assert.equal(headersOf(rh)[":status"], "200");
  const lb = rh.metadata_context.filter_metadata["envoy.lb"].fields;
  assert.equal(lb["x-gateway-destination-endpoint-served"].stringValue, be.endpoint);
  const resBodies = msgs.filter((m) => m.request === "response_body");
  assert.equal(resBodies.at(-1).response_body.end_of_stream, true);
});

test("a request without a body: request_headers carries end_of_stream and no body message follows", async () => {
  const be = await backend();
  const fake = await startFakeExtProc(async (call, _r, next) => {
    await next();
    call.write({
      request_headers: { response: { header_mutation: { set_headers: [setHeader(DEST, be.endpoint)] } } },
    });
    await next();
    call.write({ response_headers: {} });
    for (let m = await next(); m; m = await next()) {
      call.write(streamedReplies("response_body", Buffer.from(m.response_body.body ?? []), 1)[0]!);
      if (m.response_body.end_of_stream) break;
    }
    call.end();
  });
  closers.push(() => fake.close());
  const proxy = await proxyFor(fake);
  const res = await fetch(`${proxy.url}/v1/models`);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { echo: 0, path: "/v1/models" });
  const msgs = fake.streams[0]!;
  assert.equal(msgs[0].request_headers.end_of_stream, true);
  assert.equal(msgs.filter((m) => m.request === "request_body").length, 0);
  assert.equal(be.seen[0]!.method, "GET");
});

test("an SSE response streams through ext_proc chunk by chunk, intact", async () => {
  const events = Array.from({ length: 5 }, (_, i) => `data: {"i":${i}}\n\n`);
  const be = await backend((_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    let i = 0;
    const tick = () => {
      if (i < events.length) {
        res.write(events[i++]);
        setTimeout(tick, 5);
      } else res.end("data: [DONE]\n\n");
    };
    tick();
  });
  const fake = await startFakeExtProc(
    fullDuplexEpp(
      () => be.endpoint,
      (b) => b,
    ),
  );
  closers.push(() => fake.close());
  const proxy = await proxyFor(fake);
  const res = await fetch(`${proxy.url}/v1/completions`, { method: "POST", body: '{"stream":true}' });
  assert.equal(res.headers.get("content-type"), "text/event-stream");
  assert.equal(await res.text(), [...events, "data: [DONE]\n\n"].join("").toUpperCase());
  const chunks = fake.streams[0]!.filter((m) => m.request === "response_body");
  assert.ok(chunks.length >= 3, `events arrive as separate response_body messages (got ${chunks.length})`);
});

test("BUFFERED: header reply awaited, then the whole body in one message; the body reply mutates headers and body", async () => {
  const be = await backend();
  const order: string[] = [];
  const fake = await startFakeExtProc(async (call, _r, next) => {
    const headers = await next();
    order.push(headers.request);
    await new Promise((r) => setTimeout(r, 30)); // the client's body has long arrived by now
    order.push("reply headers");
    call.write({ request_headers: {} });
    const body = await next();
    order.push(`${body.request}:${body.request_body.end_of_stream}`);
    const replaced = Buffer.from('{"model":"m2"}');
    call.write({
      request_body: {
        response: {
          header_mutation: {
            set_headers: [setHeader(DEST, be.endpoint), setHeader("content-length", String(replaced.length))],
          },
          body_mutation: { body: replaced },
        },
      },
    });
    await next();
    call.write({ response_headers: {} });
    const rb = await next();
    const wrapped = Buffer.from(`[${rb.response_body.body}]`);
    call.write({
      response_body: {
        response: {
          // Envoy refuses a replaced body whose length disagrees with the held content-length
          header_mutation: { set_headers: [setHeader("content-length", String(wrapped.length))] },
          body_mutation: { body: wrapped },
        },
      },
    });
    call.end();
  });
  closers.push(() => fake.close());
  const proxy = await proxyFor(fake, { mode: "BUFFERED", messageTimeoutMs: 5000 });
  const payload = JSON.stringify({ model: "m", pad: "y".repeat(100_000) });
  const res = await fetch(`${proxy.url}/v1/completions`, { method: "POST", body: payload });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.equal(text, `[${JSON.stringify({ echo: 14, path: "/v1/completions" })}]`);
  assert.deepEqual(order, ["request_headers", "reply headers", "request_body:true"]);
  assert.equal(fake.streams[0]![0].protocol_config.request_body_mode, 2, "BUFFERED");
  assert.equal(bodyOf(fake.streams[0]!, "request_body").toString(), payload);
  assert.equal(be.seen[0]!.body, '{"model":"m2"}');
  assert.equal(be.seen[0]!.headers["content-length"], "14");
});

test("Envoy's default mutation rules: routing and x-envoy headers untouched, `value` without raw_value sets empty", async () => {
  const be = await backend();
  const fake = await startFakeExtProc(async (call, _r, next) => {
    await next();
    call.write({
      request_headers: {
        response: {
          header_mutation: {
            set_headers: [
              setHeader(DEST, be.endpoint),
              setHeader("host", "evil.example"),
              setHeader("x-envoy-original-path", "/x"),
              { header: { key: "x-plain", value: "v" } },
            ],
            remove_headers: [":path", "x-drop"],
          },
        },
      },
    });
    await next();
    call.write({ response_headers: {} });
    for (let m = await next(); m; m = await next()) {
      call.write(streamedReplies("response_body", Buffer.from(m.response_body.body ?? []), 1)[0]!);
      if (m.response_body.end_of_stream) break;
    }
    call.end();
  });
  closers.push(() => fake.close());
  const proxy = await proxyFor(fake);
  const res = await fetch(`${proxy.url}/p`, { headers: { "x-drop": "1" } });
  assert.equal(res.status, 200);
  const seen = be.seen[0]!;
  assert.equal(seen.url, "/p");
  assert.equal(seen.headers.host, `127.0.0.1:${proxy.port}`);
  assert.equal(seen.headers["x-envoy-original-path"], undefined);
  assert.equal(seen.headers["x-plain"], "");
  assert.equal(seen.headers["x-drop"], undefined);
});
