/**
 * `kvgate epp` interoperates with ext_proc clients built from the upstream Envoy protos (the copy in
 * @grpc/grpc-js-xds, with the newer streamed-body pieces added by reflection) and from kvgate's own,
 * over TLS with the self-signed certificate, in FULL_DUPLEX_STREAMED: a pick with fallbacks (header
 * and envoy.lb metadata agree), a forged destination header removed and ignored, 400 for a malformed
 * body, 404 for an unknown model, 429 for a sheddable request when saturated, 503 when no replica is
 * ready, and a model rewrite on the way in and back out.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import type { ProcessingResponse } from "../src/gateway/ext-proc/proto.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  type InteropFixture,
  kvgateRoot,
  lbDestination,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  setHeaders,
  startInteropFixture,
  startTestEpp,
  upstreamRoot,
} from "./helpers/ext-proc-client.ts";
import type { FakeServer } from "./helpers/gateway-fakes.ts";

function streamed(rs: ProcessingResponse[]): { body: Buffer; ends: boolean[] } {
  const parts = rs.flatMap((r) => {
    const s = r.request_body?.response.body_mutation?.streamed_response;
    return s ? [s] : [];
  });
  return { body: Buffer.concat(parts.map((p) => p.body)), ends: parts.map((p) => p.end_of_stream === true) };
}

function immediate(rs: ProcessingResponse[]) {
  const ir = rs.find((r) => r.immediate_response)?.immediate_response;
  assert.ok(ir, `expected an ImmediateResponse, got ${JSON.stringify(rs)}`);
  const body = JSON.parse(ir.body?.toString() ?? "{}");
  return { code: ir.status.code, headers: setHeaders(ir.headers), error: body.error };
}

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

for (const [name, root] of [
  ["upstream Envoy protos", upstreamRoot()],
  ["kvgate's protos", kvgateRoot()],
] as const) {
  describe(`a client built from ${name}`, () => {
    const ctor = clientCtor(root);
    const open = (e: EppHandle) => new ExtProcCall(connect(ctor, e.grpc.port, e.certificate));
    const ids = () => new Set(pool.map((f) => f.id));

    test("a pick with fallbacks: header and envoy.lb metadata name the same list; the body comes back unchanged", async () => {
      // A prompt no earlier request sent: the affinity filter keeps every replica for a cold prompt.
      const body = chatBody(`hello from ${name}`);
      const c = open(epp).send(
        requestHeaders({ ...CHAT_PATH, "x-request-id": "req-1" }),
        requestBody(body.slice(0, 7), false),
        requestBody(body.slice(7), true),
      );
      const rs = await c.waitFor(2);
      const hr = rs[0].request_headers?.response;
      assert.ok(hr, "the first answer is the request_headers response");
      assert.equal(hr.clear_route_cache, true);
      const set = setHeaders(hr.header_mutation);
      const dest = set["x-gateway-destination-endpoint"].split(",");
      assert.equal(dest.length, 2, "maxNumOfEndpoints: 2 lists the pick and one fallback");
      assert.equal(new Set(dest).size, 2);
      for (const d of dest) assert.ok(ids().has(d), `${d} is a pool endpoint`);
      assert.equal(lbDestination(rs[0]), dest.join(","));
      assert.equal(set["x-request-id"], undefined, "a client's x-request-id is kept, not replaced");
      assert.equal(set["content-length"], String(Buffer.byteLength(body)), "the length of the body sent on");
      const sb = streamed(rs.slice(1));
      assert.equal(sb.body.toString(), body);
      assert.deepEqual(sb.ends, [true]);
      c.send(responseHeaders({ ":status": "200" }, dest[0]), responseBody('{"ok":true}', true));
      await c.waitFor(4);
      c.end();
      assert.equal((await c.status).code, 0);
    });

    test("a forged destination header is removed and never steers the pick", async () => {
      const forged = {
        ...CHAT_PATH,
        "x-gateway-destination-endpoint": "203.0.113.9:80",
        "x-prefiller-host-port": "203.0.113.9:81",
        "x-llm-d-anything": "1",
      };
      const c = open(epp).send(requestHeaders(forged), requestBody(chatBody("steer me"), true));
      const rs = await c.waitFor(2);
      const m = rs[0].request_headers?.response.header_mutation;
      const dest = setHeaders(m)["x-gateway-destination-endpoint"];
      assert.ok(!dest.includes("203.0.113.9"), dest);
      assert.equal(setHeaders(m)["x-prefiller-host-port"], undefined, "no prefill was chosen");
      assert.deepEqual([...(m?.remove_headers ?? [])].sort(), [
        "x-gateway-destination-endpoint",
        "x-llm-d-anything",
        "x-prefiller-host-port",
      ]);
      assert.ok(!(m?.remove_headers ?? []).includes("content-type"));
      c.call.cancel();
    });

    test("a malformed body gets 400 and a missing model 400, as OpenAI errors", async () => {
      for (const [bad, param] of [
        ['{"model": "m", "messages": [', null],
        ['{"messages": [{"role": "user", "content": "x"}]}', "model"],
      ] as const) {
        const c = open(epp).send(requestHeaders(CHAT_PATH), requestBody(bad, true));
        const ir = immediate(await c.waitFor(1));
        assert.equal(ir.code, 400);
        assert.equal(ir.headers["content-type"], "application/json");
        assert.equal(ir.error.code, 400);
        assert.equal(ir.error.param, param);
        assert.equal((await c.status).code, 0, "the stream ends cleanly after an ImmediateResponse");
      }
    });

    test("an unknown model gets 404", async () => {
      const c = open(epp).send(requestHeaders(CHAT_PATH), requestBody(chatBody("x", "nope"), true));
      const ir = immediate(await c.waitFor(1));
      assert.equal(ir.code, 404);
      assert.equal(ir.error.param, "model");
    });

    test("a sheddable request gets 429 rejected-saturated when the pool is saturated; others pass", async () => {
      const shed = open(busyEpp).send(
        requestHeaders({ ...CHAT_PATH, "x-llm-d-inference-objective": "batch" }),
        requestBody(chatBody("x"), true),
      );
      const ir = immediate(await shed.waitFor(1));
      assert.equal(ir.code, 429);
      assert.equal(ir.headers["x-llm-d-request-dropped-reason"], "rejected-saturated");
      assert.equal(ir.error.type, "RateLimitError");
      const kept = open(busyEpp).send(requestHeaders(CHAT_PATH), requestBody(chatBody("x"), true));
      const rs = await kept.waitFor(2);
      assert.equal(
        setHeaders(rs[0].request_headers?.response.header_mutation)["x-gateway-destination-endpoint"],
        busy[0].id,
      );
      kept.call.cancel();
    });

    test("no ready replica gets 503 rejected-no-endpoints", async () => {
      const c = open(sickEpp).send(requestHeaders(CHAT_PATH), requestBody(chatBody("x"), true));
      const ir = immediate(await c.waitFor(1));
      assert.equal(ir.code, 503);
      assert.equal(ir.headers["x-llm-d-request-dropped-reason"], "rejected-no-endpoints");
      // It names the model and says where to look: the admin API's endpoint list.
      assert.match(
        ir.error.message,
        /^no healthy endpoint serves model `m` \(1 unhealthy\): GET \/endpoints on the admin port/,
      );
    });

    test("a body past --max-body-bytes gets 413 naming the limit and the flag to raise it", async (t) => {
      const small = await startTestEpp(pool, { maxBodyBytes: 64 });
      t.after(() => small.close());
      const body = chatBody("a question longer than the sixty-four bytes this EPP accepts");
      assert.ok(Buffer.byteLength(body) > 64);
      const ir = immediate(
        await open(small).send(requestHeaders(CHAT_PATH), requestBody(body, true)).waitFor(1),
      );
      assert.equal(ir.code, 413);
      assert.match(
        ir.error.message,
        /^Request body too large: the limit is 64 bytes; send a smaller body, or restart kvgate with a larger --max-body-bytes$/,
      );
    });

    test("a model rewrite: the replica gets the target model, the client gets its own name back", async () => {
      const body = chatBody("rewrite me", "friendly");
      const c = open(epp).send(requestHeaders(CHAT_PATH), requestBody(body, true));
      const rs = await c.waitFor(2);
      const set = setHeaders(rs[0].request_headers?.response.header_mutation);
      const sent = streamed(rs.slice(1)).body;
      assert.equal(JSON.parse(sent.toString()).model, "m");
      assert.deepEqual(JSON.parse(sent.toString()).messages, JSON.parse(body).messages);
      assert.equal(set["content-length"], String(sent.length));
      c.send(
        responseHeaders({ ":status": "200", "content-type": "application/json", "content-length": "40" }),
        responseBody('{"id":"x","model":"m","choices":[]}', true),
      );
      const all = await c.waitFor(4);
      assert.deepEqual(all[2].response_headers?.response.header_mutation?.remove_headers, ["content-length"]);
      const back = all[3].response_body?.response.body_mutation?.streamed_response;
      assert.equal(back?.body.toString(), '{"id":"x","model":"friendly","choices":[]}');
      assert.equal(back?.end_of_stream, true);
      c.end();
      assert.match(
        await epp.gateway.metrics.text(),
        /llm_d_epp_model_rewrite_decisions_total\{model_rewrite_name="alias",model_name="friendly",target_model="m"\} [1-9]/,
      );
    });
  });
}
