/**
 * `kvgate epp` in BUFFERED body mode, driven by a client built from the upstream Envoy protos: the
 * request_headers message is answered at once with an empty CONTINUE, and the decision rides on the
 * one BodyResponse (header mutation, envoy.lb metadata, a body mutation only when the body changed).
 * The same cases ext-proc-server.test.ts pins in FULL_DUPLEX_STREAMED: a pick with fallbacks, forged
 * control headers removed, 400 for a malformed body, 429 for a sheddable request when saturated, 503
 * when no replica is ready, and a model rewrite in both directions.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import type { ProcessingResponse } from "../src/gateway/ext-proc/proto.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  type InteropFixture,
  lbDestination,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  setHeaders,
  startInteropFixture,
  upstreamRoot,
} from "./helpers/ext-proc-client.ts";
import type { FakeServer } from "./helpers/gateway-fakes.ts";

/** BodySendMode BUFFERED = 2, as current Envoy announces it on a stream's first message. */
const BUFFERED = { protocol_config: { request_body_mode: 2, response_body_mode: 2 } };

const ctor = clientCtor(upstreamRoot());
let fx: InteropFixture;
let pool: FakeServer[];
let busy: FakeServer[];
let epp: EppHandle;
let busyEpp: EppHandle;
let sickEpp: EppHandle;

before(async () => {
  fx = await startInteropFixture();
  ({ pool, busy, epp, busyEpp, sickEpp } = fx);
});

after(() => fx?.close());

/** Sends headers as Envoy does in BUFFERED, checks the empty CONTINUE, then the whole body. */
async function buffered(e: EppHandle, headers: Record<string, string>, body: string) {
  const c = new ExtProcCall(connect(ctor, e.grpc.port, e.certificate));
  c.send({ ...requestHeaders(headers), ...BUFFERED });
  const [h] = await c.waitFor(1);
  assert.deepEqual(Object.keys(h.request_headers?.response ?? {}), [], "headers get an empty CONTINUE");
  c.send(requestBody(body, true));
  return { c, rs: await c.waitFor(2) };
}

function immediate(rs: ProcessingResponse[]) {
  const ir = rs.find((r) => r.immediate_response)?.immediate_response;
  assert.ok(ir, `expected an ImmediateResponse, got ${JSON.stringify(rs)}`);
  return {
    code: ir.status.code,
    headers: setHeaders(ir.headers),
    error: JSON.parse(ir.body?.toString() ?? "{}").error,
  };
}

test("BUFFERED: a pick with fallbacks in the BodyResponse; forged control headers removed", async () => {
  const forged = {
    ...CHAT_PATH,
    "x-gateway-destination-endpoint": "203.0.113.9:80",
    "x-prefiller-host-port": "203.0.113.9:81",
  };
  const { c, rs } = await buffered(epp, forged, chatBody("buffered fallbacks"));
  const br = rs[1].request_body?.response;
  assert.ok(br, "the second answer is the request_body response");
  assert.equal(br.clear_route_cache, true);
  assert.equal(br.body_mutation, undefined, "an unchanged body is not re-sent");
  const set = setHeaders(br.header_mutation);
  const dest = set["x-gateway-destination-endpoint"].split(",");
  assert.equal(dest.length, 2, "maxNumOfEndpoints: 2 lists the pick and one fallback");
  for (const d of dest)
    assert.ok(
      pool.some((f) => f.id === d),
      `${d} is a pool endpoint`,
    );
  assert.equal(lbDestination(rs[1]), dest.join(","), "header and envoy.lb metadata agree");
  assert.equal(set["x-prefiller-host-port"], undefined, "no prefill was chosen");
  assert.deepEqual([...(br.header_mutation?.remove_headers ?? [])].sort(), [
    "x-gateway-destination-endpoint",
    "x-prefiller-host-port",
  ]);
  c.call.cancel();
});

test("BUFFERED: a malformed body gets 400, an unknown model 404", async () => {
  const bad = await buffered(epp, CHAT_PATH, '{"model": "m", "messages": [');
  const ir = immediate(bad.rs);
  assert.equal(ir.code, 400);
  assert.equal(ir.headers["content-type"], "application/json");
  assert.equal((await bad.c.status).code, 0, "the stream ends cleanly after an ImmediateResponse");
  const unknown = await buffered(epp, CHAT_PATH, chatBody("x", "nope"));
  assert.equal(immediate(unknown.rs).code, 404);
});

test("BUFFERED: a sheddable request gets 429 rejected-saturated when saturated; no ready replica 503", async () => {
  const shed = await buffered(
    busyEpp,
    { ...CHAT_PATH, "x-llm-d-inference-objective": "batch" },
    chatBody("x"),
  );
  const ir = immediate(shed.rs);
  assert.equal(ir.code, 429);
  assert.equal(ir.headers["x-llm-d-request-dropped-reason"], "rejected-saturated");
  const kept = await buffered(busyEpp, CHAT_PATH, chatBody("x"));
  assert.equal(
    setHeaders(kept.rs[1].request_body?.response.header_mutation)["x-gateway-destination-endpoint"],
    busy[0].id,
  );
  kept.c.call.cancel();
  const none = immediate((await buffered(sickEpp, CHAT_PATH, chatBody("x"))).rs);
  assert.equal(none.code, 503);
  assert.equal(none.headers["x-llm-d-request-dropped-reason"], "rejected-no-endpoints");
});

test("BUFFERED: a model rewrite replaces the body's model; the response gets the client's name back", async () => {
  const body = chatBody("rewrite me buffered", "friendly");
  const { c, rs } = await buffered(epp, CHAT_PATH, body);
  const br = rs[1].request_body?.response;
  const sent = br?.body_mutation?.body;
  assert.ok(sent, "the rewritten body is sent as a plain body mutation (BUFFERED, not streamed_response)");
  assert.equal(JSON.parse(sent.toString()).model, "m");
  assert.deepEqual(JSON.parse(sent.toString()).messages, JSON.parse(body).messages);
  c.send(
    responseHeaders({ ":status": "200", "content-type": "application/json" }),
    responseBody('{"id":"x","model":"m","choices":[]}', true),
  );
  const all = await c.waitFor(4);
  const back = all[3].response_body?.response.body_mutation?.body;
  assert.equal(back?.toString(), '{"id":"x","model":"friendly","choices":[]}');
  c.end();
});
