/**
 * The prefill reserve through `kvgate epp` (ext_proc, Envoy's messages from a client built from
 * the upstream protos), with config/examples/flow-control.yaml on two replicas: a tenant's second
 * long prompt is held at the gateway until its first long prompt's first response body chunk
 * (response headers alone do not release it: a streaming response starts before its first token),
 * while another tenant's short request is routed at once.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import { flowGateOf } from "../src/gateway/flow-gate.ts";
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

const ctor = clientCtor(upstreamRoot());
// Without a tokenizer a prompt counts bytes / 4 tokens: the long prompt is ~100, the short ~15.
const CONFIG = readFileSync("config/examples/flow-control.yaml", "utf8").replace(
  "prefillReserve: 1 }",
  "prefillReserve: 1, longPrefillTokens: 60 }",
);
const LONG = "x".repeat(360);
let pool: FakeServer[];
let epp: EppHandle;

before(async () => {
  pool = await startPool(2);
  epp = await startTestEpp(pool, { config: CONFIG });
});
after(async () => {
  await epp?.close();
  await Promise.all(pool.map((f) => f.close()));
});

const open = (tenant: string, content: string) =>
  new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate)).send(
    requestHeaders({ ...CHAT_PATH, "x-gateway-inference-fairness-id": tenant }),
    requestBody(chatBody(content), true),
  );
const dest = (c: ExtProcCall) =>
  setHeaders(c.responses[0]?.request_headers?.response.header_mutation)["x-gateway-destination-endpoint"];
const queued = () => flowGateOf(epp.gateway)?.snapshot().queued;

test("a second long prompt of the same tenant waits for the first one's first body chunk", async () => {
  assert.notEqual(CONFIG, readFileSync("config/examples/flow-control.yaml", "utf8"));
  // tenant-b has been seen: the band knows two flows.
  const b0 = open("tenant-b", "hi");
  await b0.waitFor(2);
  b0.send(responseHeaders({ ":status": "200" }, dest(b0)), responseBody("data: [DONE]\n\n", true));
  await b0.waitFor(4);
  b0.end();

  const a0 = open("tenant-a", LONG);
  await a0.waitFor(2);
  const a1 = open("tenant-a", LONG);
  await waitFor(() => queued() === 1, "tenant-a's second long prompt held at the gateway");
  assert.equal(a1.responses.length, 0);

  const b1 = open("tenant-b", "hi again");
  await b1.waitFor(2);
  assert.notEqual(dest(b1), dest(a0), "the short request goes to the replica kept free");

  a0.send(responseHeaders({ ":status": "200", "content-type": "text/event-stream" }, dest(a0)));
  // Answered after the headers were handled: had they released a1, it would be gone from the queue.
  await a0.waitFor(3);
  assert.equal(queued(), 1, "response headers alone do not end the prefill");

  a0.send(responseBody('data: {"choices":[{"delta":{"content":"a"}}]}\n\n', false));
  await a1.waitFor(2);
  assert.equal(queued(), 0, "the first body chunk released tenant-a's next long prompt");

  for (const c of [a0, a1, b1]) c.call.cancel();
});
