/**
 * The ext_proc stream's protocol details, through a client built from the upstream Envoy protos:
 * a body over 62,000 bytes re-sent in ≤ 62,000-byte chunks byte for byte, a repeated end_of_stream
 * ignored, BUFFERED mode answered with one BodyResponse, a bodiless GET routed at once, the proxy's
 * subset hint obeyed, prefix affinity learned from the picks, in-flight load back to zero after the
 * response's end and after a cancelled stream, and messages out of order or undecodable ending only
 * their stream with a gRPC error that says what went wrong.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, credentials, status } from "@grpc/grpc-js";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import type { ProcessingResponse } from "../src/gateway/ext-proc/proto.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  inFlight,
  type Req,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  setHeaders,
  startPool,
  startTestEpp,
  structOf,
  upstreamRoot,
} from "./helpers/ext-proc-client.ts";
import { type FakeServer, waitFor } from "./helpers/gateway-fakes.ts";

const ctor = clientCtor(upstreamRoot());
let pool: FakeServer[];
let epp: EppHandle;
const open = () => new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate));
const dest = (r: ProcessingResponse | undefined) =>
  setHeaders(r?.request_headers?.response.header_mutation)["x-gateway-destination-endpoint"];
const bodyParts = (rs: ProcessingResponse[], kind: "request_body" | "response_body") =>
  rs.flatMap((r) => {
    const s = r[kind]?.response.body_mutation?.streamed_response;
    return s ? [s] : [];
  });

before(async () => {
  // Distinct loopback addresses: the subset hint matches endpoints by IP, as llm-d does.
  pool = await startPool(3, {}, ["m"], true, ["127.0.0.1", "127.0.0.2", "127.0.0.3"]);
  epp = await startTestEpp(pool);
});
after(async () => {
  await epp?.close();
  await Promise.all(pool.map((f) => f.close()));
});

test("a 150 KB body is re-sent in ≤ 62,000-byte chunks, byte for byte, end_of_stream on the last", async () => {
  const body = Buffer.from(chatBody(`big ${"x".repeat(150_000)} é`));
  const c = open().send(requestHeaders(CHAT_PATH));
  for (let off = 0; off < body.length; off += 40_000)
    c.send(requestBody(body.subarray(off, off + 40_000), off + 40_000 >= body.length));
  const need = 1 + Math.ceil(body.length / 62_000);
  const parts = bodyParts(await c.waitFor(need), "request_body");
  assert.equal(parts.length, need - 1);
  for (const p of parts) assert.ok(p.body.length <= 62_000, `chunk of ${p.body.length} bytes`);
  assert.ok(Buffer.concat(parts.map((p) => p.body)).equals(body));
  assert.deepEqual(
    parts.map((p) => p.end_of_stream === true),
    parts.map((_, i) => i === parts.length - 1),
  );
  c.call.cancel();
});

test("a body message after the first end_of_stream is ignored (Envoy can repeat it)", async () => {
  const body = chatBody("dup eos");
  const c = open().send(requestHeaders(CHAT_PATH), requestBody(body, true), requestBody("garbage", true));
  await c.waitFor(2);
  c.send(responseHeaders({ ":status": "200" }), responseBody("{}", true), responseBody("again", true));
  const rs = await c.waitFor(4);
  c.end();
  assert.equal((await c.status).code, status.OK);
  assert.equal(rs.length, 4, JSON.stringify(rs.map((r) => Object.keys(r))));
  assert.equal(bodyParts(rs, "request_body")[0].body.toString(), body);
});

test("BUFFERED: headers answered at once, the pick in one BodyResponse with envoy.lb metadata", async () => {
  const modes = { protocol_config: { request_body_mode: 2, response_body_mode: 2 } };
  const c = open().send({
    ...requestHeaders({ ...CHAT_PATH, "x-gateway-destination-endpoint": "1.1.1.1:1" }),
    ...modes,
  });
  const [h] = await c.waitFor(1);
  assert.deepEqual(Object.keys(h.request_headers?.response ?? {}), [], "an empty CONTINUE");
  c.send(requestBody(chatBody("buffered"), true));
  const rs = await c.waitFor(2);
  const br = rs[1].request_body?.response;
  assert.equal(br?.clear_route_cache, true);
  assert.equal(br?.body_mutation, undefined, "an unchanged body is not re-sent");
  const d = setHeaders(br?.header_mutation)["x-gateway-destination-endpoint"];
  assert.ok(pool.some((f) => f.id === d));
  assert.deepEqual(br?.header_mutation?.remove_headers, ["x-gateway-destination-endpoint"]);
  assert.equal(
    rs[1].dynamic_metadata?.fields?.["envoy.lb"]?.structValue?.fields?.["x-gateway-destination-endpoint"]
      ?.stringValue,
    d,
  );
  c.send(responseHeaders({ ":status": "200" }), responseBody('{"ok":1}', true));
  const all = await c.waitFor(4);
  assert.deepEqual(all[3].response_body?.response, {}, "the buffered response passes unchanged");
  assert.equal(inFlight(epp, d), 0);
  c.end();
});

test("a bodiless GET is routed at once to a ready endpoint, with a generated x-request-id", async () => {
  const c = open().send(requestHeaders({ ":method": "GET", ":path": "/v1/models" }, true));
  const [r] = await c.waitFor(1);
  assert.ok(pool.some((f) => f.id === dest(r)));
  assert.match(setHeaders(r.request_headers?.response.header_mutation)["x-request-id"], /^[0-9a-f-]{36}$/);
  c.send(responseHeaders({ ":status": "200" }), responseBody('{"data":[]}', true));
  await c.waitFor(3);
  c.end();
  assert.equal((await c.status).code, status.OK);
});

test("the proxy's subset hint restricts the pick; an empty one is a 503", async () => {
  const only = pool[2].id;
  const hint = (subset: string[]): Req => ({
    metadata_context: {
      filter_metadata: {
        "envoy.lb.subset_hint": structOf({ "x-gateway-destination-endpoint-subset": subset }),
      },
    },
  });
  for (let i = 0; i < 4; i++) {
    const c = open().send(requestHeaders(CHAT_PATH), {
      ...requestBody(chatBody(`subset ${i}`), true),
      ...hint([only]),
    });
    assert.equal(dest((await c.waitFor(1))[0]), only);
    c.call.cancel();
  }
  const c = open().send(requestHeaders(CHAT_PATH), { ...requestBody(chatBody("none"), true), ...hint([]) });
  const [r] = await c.waitFor(1);
  assert.equal(r.immediate_response?.status.code, 503);
});

test("prefix affinity and in-flight load learn from ext_proc picks as from serve's", async () => {
  const prompt = `affinity ${"shared system prompt words ".repeat(80)}`;
  const first = open().send(requestHeaders(CHAT_PATH), requestBody(chatBody(prompt), true));
  const picked = dest((await first.waitFor(2))[0]);
  assert.equal(inFlight(epp, picked), 1, "counted from the pick");
  first.send(responseHeaders({ ":status": "200", "content-type": "text/event-stream" }, picked));
  first.send(responseBody('data: {"choices":[]}\n\n', false));
  await first.waitFor(4);
  assert.equal(inFlight(epp, picked), 1, "still running while the stream flows");
  first.send(responseBody("data: [DONE]\n\n", true));
  await first.waitFor(5);
  assert.equal(inFlight(epp, picked), 0, "released at the response's end_of_stream");
  first.end();

  const second = open().send(requestHeaders(CHAT_PATH), requestBody(chatBody(prompt), true));
  assert.equal(dest((await second.waitFor(2))[0]), picked, "the same prefix goes where it was cached");
  assert.equal(inFlight(epp, picked), 1);
  second.call.cancel(); // the client went away mid-request
  await waitFor(() => inFlight(epp, picked) === 0, "in-flight released after the cancel");
});

test("a stream's prompt tokens stay in flight past its response headers, until its first body byte", async () => {
  // vLLM sends a streaming response's headers before its prefill ends; releasing the prompt at the
  // headers would make a replica still prefilling look idle to token-load and prefill-wait.
  const call = open().send(
    requestHeaders(CHAT_PATH),
    requestBody(chatBody(`held ${"words ".repeat(300)}`), true),
  );
  const picked = dest((await call.waitFor(2))[0]);
  const tokens = () =>
    Number(epp.gateway.routing.scheduler.endpointViews(picked)["inflight-load-producer"]?.inFlightTokens);
  const held = tokens();
  assert.ok(held > 250, `the prompt's tokens are counted from the pick (${held})`);
  call.send(responseHeaders({ ":status": "200", "content-type": "text/event-stream" }, picked));
  await call.waitFor(3);
  assert.equal(tokens(), held, "headers alone release nothing");
  call.send(responseBody('data: {"choices":[]}\n\n', false));
  await call.waitFor(4);
  assert.equal(tokens(), 0, "the first body byte releases the prompt tokens");
  assert.equal(inFlight(epp, picked), 1, "the request itself is still running");
  call.send(responseBody("data: [DONE]\n\n", true));
  await call.waitFor(5);
  assert.equal(inFlight(epp, picked), 0);
  call.end();
});

test("out-of-order or undecodable messages end that stream with a gRPC error, and the server carries on", async () => {
  const early = open().send(requestBody("{}", true));
  const s1 = await early.status;
  assert.equal(s1.code, status.FAILED_PRECONDITION);
  assert.match(s1.details, /request_body arrived before request_headers/);

  const twice = open().send(requestHeaders(CHAT_PATH), requestHeaders(CHAT_PATH));
  assert.match((await twice.status).details, /request_headers arrived twice/);

  const tooSoon = open().send(requestHeaders(CHAT_PATH), responseHeaders({ ":status": "200" }));
  assert.match((await tooSoon.status).details, /before kvgate answered the request/);

  const empty = open().send({});
  assert.match((await empty.status).details, /carried none of request_headers/);

  const raw = new Client(
    `127.0.0.1:${epp.grpc.port}`,
    credentials.createSsl(Buffer.from(epp.certificate ?? "")),
    {
      "grpc.ssl_target_name_override": "localhost",
    },
  );
  const garbage = raw.makeBidiStreamRequest(
    "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    (b: Buffer) => b,
    (b: Buffer) => b,
  );
  const s2 = await new Promise<{ code: number }>((resolve) => {
    garbage.on("status", resolve);
    garbage.on("error", () => {});
    garbage.on("data", () => {});
    garbage.write(Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f, 0x12]));
  });
  assert.notEqual(s2.code, status.OK);
  raw.close();

  const fine = open().send(requestHeaders(CHAT_PATH), requestBody(chatBody("still up"), true));
  const ok = dest((await fine.waitFor(2))[0]);
  assert.ok(pool.some((f) => f.id === ok));
  fine.call.cancel();
  assert.match(
    await epp.gateway.metrics.text(),
    /kvgate_ext_proc_streams_total\{outcome="protocol-error"\} 4/,
  );
});
