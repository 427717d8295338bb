/**
 * End-to-end fuzz properties: arbitrary requests (path, method, headers, body) to a live `kvgate
 * serve` gateway whose one replica answers with arbitrary SSE bytes, cut into arbitrary chunks. Every
 * answer is either the replica's, relayed byte for byte, or the gateway's own refusal in OpenAI's
 * error format with one of the statuses it documents; each request is counted once in
 * kvgate_http_requests_total; the process keeps serving. Used by test/fuzz-e2e.test.ts (bounded)
 * and `npm run fuzz` (long).
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { Client } from "undici";
import { type GatewayHandle, startGateway } from "../../src/gateway/gateway.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "../helpers/gateway-fakes.ts";
import { requestBytes } from "./properties.ts";

export interface HttpFuzzFixture {
  gw: GatewayHandle;
  replica: FakeServer;
  client: Client;
  close(): Promise<void>;
}

/** What the replica streams for the request carrying `x-fuzz-case: n`. */
const answers = new Map<string, Buffer[]>();

export async function startHttpFuzz(): Promise<HttpFuzzFixture> {
  const stream = (req: { headers: Record<string, unknown> }, res: import("node:http").ServerResponse) => {
    const parts = answers.get(String(req.headers["x-fuzz-case"])) ?? [Buffer.from("data: [DONE]\n\n")];
    res.writeHead(200, { "content-type": "text/event-stream" });
    for (const p of parts) res.write(p);
    res.end();
  };
  const replica = await startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting: 0, kv: 0.1 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/chat/completions": stream,
    "POST /v1/completions": stream,
    "POST /v1/embeddings": stream,
  });
  const gw = await startGateway({
    endpoints: replica.id,
    scrapeIntervalMs: 50,
    maxBodyBytes: 4096,
    log: () => {},
  });
  await waitFor(() => gw.gateway.data.store.get(replica.id)?.state.metrics != null, "replica scraped");
  const client = new Client(gw.url, { pipelining: 0 });
  return {
    gw,
    replica,
    client,
    async close() {
      await client.close();
      await gw.close();
      await replica.close();
    },
  };
}

const printable = fc.string({ maxLength: 24 }).map((s) => s.replace(/[^\x20-\x7e]/g, "x"));
const headerName = fc.constantFrom(
  "x-gateway-destination-endpoint",
  "x-gateway-destination-endpoint-served",
  "x-prefiller-host-port",
  "x-llm-d-inference-objective",
  "x-gateway-inference-objective",
  "x-llm-d-inference-fairness-id",
  "x-llm-d-slo-ttft-ms",
  "x-session-token",
  "x-request-id",
  "content-type",
  "accept",
  "x-anything",
);
const path = fc.oneof(
  fc.constantFrom("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health"),
  fc.constantFrom(
    "/",
    "/v1",
    "/v1/chat/completions?x=1",
    "/v1/chat/completions/",
    "/%zz",
    "//v1/completions",
  ),
  printable.map((s) => `/${encodeURIComponent(s)}`),
);
const method = fc.constantFrom("POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH");
const sseAnswer = fc.array(
  fc.oneof(
    fc.string({ unit: "binary", maxLength: 40 }).map((s) => Buffer.from(`data: ${s}\n\n`)),
    fc.uint8Array({ maxLength: 40 }).map((u) => Buffer.from(u)),
    fc.constant(Buffer.from('data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n')),
  ),
  { maxLength: 6 },
);

/** The gateway's own refusals on the public port (README, errors.ts). */
const GATEWAY_STATUSES = new Set([400, 404, 405, 413, 429, 503]);
let caseNo = 0;

export function httpProperty(fx: HttpFuzzFixture): fc.IRawProperty<unknown> {
  return fc.asyncProperty(
    path,
    method,
    fc.array(fc.tuple(headerName, printable), { maxLength: 5 }),
    requestBytes,
    sseAnswer,
    async (p, m, hs, body, answer) => {
      const id = String(++caseNo);
      answers.set(id, answer);
      const headers: Record<string, string> = { "x-fuzz-case": id };
      for (const [k, v] of hs) headers[k] = v;
      const before = await countRequests(fx);
      let r: {
        statusCode: number;
        headers: Record<string, unknown>;
        body: { arrayBuffer(): Promise<ArrayBuffer> };
      };
      try {
        r = await fx.client.request({
          path: p,
          method: m as "POST",
          headers,
          body: m === "GET" ? undefined : body,
        });
      } finally {
        answers.delete(id);
      }
      const bytes = Buffer.from(await r.body.arrayBuffer());
      const fromReplica = r.headers["x-gateway-destination-endpoint-served"] === fx.replica.id;
      if (fromReplica) {
        assert.equal(r.statusCode, 200);
        assert.deepEqual(bytes, Buffer.concat(answer), "the replica's SSE bytes are relayed verbatim");
      } else if ((p === "/health" || p === "/v1/models") && m === "GET") {
        assert.equal(r.statusCode, 200);
      } else {
        assert.ok(GATEWAY_STATUSES.has(r.statusCode), `status ${r.statusCode}: ${bytes}`);
        const e = JSON.parse(bytes.toString("utf8")).error;
        assert.equal(e.code, r.statusCode);
        assert.ok(typeof e.message === "string" && e.message.length > 0);
      }
      // Counted when the gateway's handler finishes, which may be just after the client saw the end.
      const deadline = Date.now() + 2000;
      while ((await countRequests(fx)) === before && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 5));
      assert.equal((await countRequests(fx)) - before, 1, "each request is counted once");
    },
  );
}

async function countRequests(fx: HttpFuzzFixture): Promise<number> {
  let n = 0;
  for (const v of (await fx.gw.gateway.metrics.httpRequests.get()).values) n += v.value;
  return n;
}
