/**
 * Predicted latency behind `kvgate serve`: the gateway feeds the model what it relays (TTFT at the
 * first chunk, TPOT from the stream's usage at the end), /explain says when it falls back, SLO
 * headers reach the plugins (a bad one is reported, not obeyed), and latency-slo-admitter's refusal
 * reaches the client as llm-d's 500.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { startGateway } from "../src/gateway/gateway.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";

const CONFIG = readFileSync(
  new URL("../config/examples/predicted-latency.yaml", import.meta.url),
  "utf8",
).replace("    streamingMode: true\n", "    streamingMode: true\n    minSamples: 5\n");

/** A replica streaming 4 chunks 5 ms apart, then usage (4 completion tokens) and [DONE]. */
function replica(): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) =>
      void res.writeHead(200).end(vllmMetrics({ waiting: 0, running: 2, kv: 0.25 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": async (_q, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (let i = 0; i < 4; i++) {
        res.write(`data: {"choices":[{"index":0,"text":"t${i}"}]}\n\n`);
        await new Promise((r) => setTimeout(r, 5));
      }
      res.write(
        'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n',
      );
      res.end("data: [DONE]\n\n");
    },
  });
}

const body = JSON.stringify({ model: "m", prompt: "hello there", stream: true, max_tokens: 4 });

test("predicted latency through kvgate serve: learning, /explain fallback, SLO headers, the admitter's 500", {
  timeout: 30_000,
}, async () => {
  const a = await replica();
  const gw = await startGateway({ endpoints: a.id, config: CONFIG, scrapeIntervalMs: 20, log: () => {} });
  try {
    await waitFor(() => gw.gateway.data.store.get(a.id)?.state.metrics !== null, "scraped");
    const explain = async (headers: Record<string, string> = {}) => {
      const r = await fetch(`${gw.adminUrl}/explain`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body,
      });
      return (await r.json()) as { plugins: Record<string, Record<string, unknown>> };
    };
    const cold = await explain({ "x-llm-d-slo-ttft-ms": "abc" });
    const lp = cold.plugins["predicted-latency-producer"];
    assert.equal(lp.predictions, null);
    assert.match(String(lp.fallback), /latency model not ready \(TTFT 0\/5, TPOT 0\/5 samples\)/);
    assert.deepEqual(lp.ignoredHeaders, [
      'x-llm-d-slo-ttft-ms: "abc" ignored (send a positive number of milliseconds, e.g. 500)',
    ]);

    for (let i = 0; i < 5; i++) {
      const r = await fetch(`${gw.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      });
      assert.equal(r.status, 200);
      await r.text();
    }
    const warm = await explain({ "x-slo-ttft-ms": "900" });
    const lw = warm.plugins["predicted-latency-producer"];
    assert.deepEqual(lw.samples, { "(none)": { ttft: 5, tpot: 5 } });
    assert.deepEqual(lw.slo, { ttftMs: 900, tpotMs: null });
    const p = (lw.predictions as Record<string, { tpotMs: number }>)[a.id];
    assert.ok(p.tpotMs > 3 && p.tpotMs < 60, `TPOT learned from the 5 ms chunks: ${p.tpotMs} ms`);

    // Sheddable, with an SLO no endpoint is predicted to meet, no idle or cold endpoint: llm-d's 500.
    const r = await fetch(`${gw.url}/v1/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-llm-d-inference-objective": "batch",
        "x-llm-d-slo-ttft-ms": "0.001",
      },
      body,
    });
    assert.equal(r.status, 500);
    assert.equal(r.headers.get("x-llm-d-request-dropped-reason"), null);
    const err = (await r.json()) as { error: { message: string; type: string } };
    assert.match(
      err.error.message,
      /^request cannot be admitted: no valid endpoint available to serve the request/,
    );
    assert.equal(err.error.type, "InternalServerError");
    // The same request at priority 0 is served.
    const ok = await fetch(`${gw.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-llm-d-slo-ttft-ms": "0.001" },
      body,
    });
    assert.equal(ok.status, 200);
    await ok.text();
  } finally {
    await gw.close();
    await a.close();
  }
});
