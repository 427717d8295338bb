/**
 * `kvgate epp` with prefill/decode disaggregation (config/examples/pd.yaml): the decode endpoint is
 * the destination and x-prefiller-host-port names the prefill endpoint only when the decider runs
 * the prefill stage, and a client's own x-prefiller-host-port is always removed (the P/D SSRF,
 * llm-d/llm-d-router#242). Also: the x-llm-d-model-name-rewrite header steers nothing, and
 * request/response trailers get their (empty) answers in order.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { EndpointSource } from "../src/datalayer/endpoints.ts";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  setHeaders,
  startPool,
  startTestEpp,
  upstreamRoot,
} from "./helpers/ext-proc-client.ts";
import { type FakeServer, waitFor } from "./helpers/gateway-fakes.ts";

const PD = readFileSync(new URL("../config/examples/pd.yaml", import.meta.url), "utf8");
const ctor = clientCtor(upstreamRoot());
let pool: FakeServer[];
let epp: EppHandle;
const open = () => new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate));

before(async () => {
  pool = await startPool(2);
  const roles = ["prefill", "decode"];
  const source = EndpointSource.fromList(
    pool.map((f, i) => ({
      id: f.id,
      host: "127.0.0.1",
      port: f.port,
      labels: { "llm-d.ai/role": roles[i] },
      kvEvents: null,
    })),
  );
  epp = await startTestEpp([], { source, config: PD });
  await waitFor(() => epp.gateway.data.store.all().every((r) => r.modelIds !== null), "scraped");
});
after(async () => {
  await epp?.close();
  await Promise.all(pool.map((f) => f.close()));
});

test("a long uncached prompt gets a prefill endpoint in x-prefiller-host-port; a forged one is removed", async () => {
  const [prefill, decode] = pool.map((f) => f.id);
  const forged = { ...CHAT_PATH, "x-prefiller-host-port": "203.0.113.7:8000" };
  const long = chatBody(`pd ${"a long and entirely uncached prompt ".repeat(60)}`);
  const c = open().send(requestHeaders(forged), requestBody(long, true));
  const m = (await c.waitFor(2))[0].request_headers?.response.header_mutation;
  assert.equal(setHeaders(m)["x-gateway-destination-endpoint"], decode);
  assert.equal(setHeaders(m)["x-prefiller-host-port"], prefill);
  assert.ok(m?.remove_headers?.includes("x-prefiller-host-port"));
  c.call.cancel();

  const short = open().send(requestHeaders(forged), requestBody(chatBody("hi"), true));
  const m2 = (await short.waitFor(2))[0].request_headers?.response.header_mutation;
  assert.equal(setHeaders(m2)["x-gateway-destination-endpoint"], decode);
  assert.equal(setHeaders(m2)["x-prefiller-host-port"], undefined, "no prefill stage, no prefiller header");
  assert.deepEqual(m2?.remove_headers, ["x-prefiller-host-port"]);
  short.call.cancel();

  // llm-d's decision counter, one per scheduling (llm-d/llm-d-router profilehandler/disagg/metrics.go)
  const text = await (await fetch(`${epp.metrics.url}/metrics`)).text();
  const count = (type: string) =>
    Number(
      new RegExp(`^llm_d_epp_disagg_decision_total\\{[^}]*decision_type="${type}"[^}]*\\} (\\d+)`, "m").exec(
        text,
      )?.[1],
    );
  assert.deepEqual([count("prefill-decode"), count("decode-only")], [1, 1]);
  assert.match(
    text,
    /llm_d_epp_disagg_decision_total\{plugin_name="disagg-profile-handler",plugin_type="disagg-profile-handler",model_name="[^"]+",decision_type="prefill-decode"\}/,
  );
});

test("x-llm-d-model-name-rewrite steers nothing and is removed; trailers are answered in order", async () => {
  const body = chatBody("keep my model");
  const c = open().send(
    requestHeaders({ ...CHAT_PATH, "x-llm-d-model-name-rewrite": "other-model" }),
    requestBody(body, false),
    { request_trailers: { trailers: { headers: [] } } },
  );
  const rs = await c.waitFor(3);
  const m = rs[0].request_headers?.response.header_mutation;
  assert.deepEqual(m?.remove_headers, ["x-llm-d-model-name-rewrite"]);
  const sb = rs[1].request_body?.response.body_mutation?.streamed_response;
  assert.equal(sb?.body.toString(), body, "the body goes on unchanged");
  assert.equal(sb?.end_of_stream, false, "trailers follow, so the body does not end the stream");
  assert.ok(rs[2].request_trailers, "then the trailers' answer");
  c.send(responseHeaders({ ":status": "200" }), responseBody("{}", false), {
    response_trailers: { trailers: { headers: [] } },
  });
  const all = await c.waitFor(6);
  assert.deepEqual(
    all.slice(3).map((r) => Object.keys(r).find((k) => k !== "response")),
    ["response_headers", "response_body", "response_trailers"],
  );
  c.end();
  assert.equal((await c.status).code, 0);
});
