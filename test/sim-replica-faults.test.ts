/**
 * Fault injection: error rate (500 with vLLM error JSON), extra latency before the first token (seen
 * in simulated-second metrics), broken /metrics (stall, garbled), and crashes, both in-process (every
 * connection cut, listener gone) and as a real process that dies mid-stream.
 */
import assert from "node:assert/strict";
import { request } from "node:http";
import { test } from "node:test";
import { histogram, parsePromText } from "../src/datalayer/prom-text.ts";
import { postJson, scrapeMetrics, spawnReplica, startTestReplica } from "./helpers/replica.ts";

test("--fault-error-rate 1 answers every generation request 500; other endpoints still work", async (t) => {
  const r = await startTestReplica({ faults: { errorRate: 1 } });
  t.after(() => r.close());
  for (const path of ["/v1/completions", "/v1/chat/completions"]) {
    const res = await postJson(`${r.url}${path}`, {
      prompt: "x",
      messages: [{ role: "user", content: "x" }],
      max_tokens: 2,
    });
    assert.equal(res.status, 500);
    assert.equal(res.body.error.type, "InternalServerError");
    assert.equal(res.body.error.code, 500);
  }
  assert.equal((await fetch(`${r.url}/health`)).status, 200);
  assert.equal((await postJson(`${r.url}/tokenize`, { prompt: "x" })).status, 200);
  assert.equal(r.server.engine.stats().numSteps, 0, "failed requests never reach the engine");
});

test("--fault-error-rate 0.5 fails some requests, reproducibly for a seed", async (t) => {
  const outcomes: number[][] = [];
  for (let run = 0; run < 2; run++) {
    const r = await startTestReplica({ faults: { errorRate: 0.5 }, seed: 11 });
    const statuses: number[] = [];
    for (let i = 0; i < 30; i++)
      statuses.push((await postJson(`${r.url}/v1/completions`, { prompt: "x", max_tokens: 1 })).status);
    await r.close();
    outcomes.push(statuses);
  }
  t.diagnostic(outcomes[0]!.join(","));
  assert.ok(outcomes[0]!.includes(500) && outcomes[0]!.includes(200));
  assert.deepEqual(outcomes[0], outcomes[1]);
});

test("--fault-extra-latency adds simulated seconds before the first token", async (t) => {
  const r = await startTestReplica({ faults: { extraLatency: 3 } });
  t.after(() => r.close());
  const res = await postJson(`${r.url}/v1/completions`, { prompt: "slow", max_tokens: 2, ignore_eos: true });
  assert.equal(res.status, 200);
  const m = await scrapeMetrics(r.url);
  const ttft = histogram(m, "vllm:time_to_first_token_seconds")!;
  const queue = histogram(m, "vllm:request_queue_time_seconds")!;
  assert.equal(ttft.count, 1);
  assert.ok(ttft.sum >= 3 && ttft.sum < 10, `TTFT ${ttft.sum}`);
  assert.ok(queue.sum >= 3, `queue ${queue.sum}`);
});

test("--fault-metrics garbled serves text that is not a Prometheus exposition", async (t) => {
  const r = await startTestReplica({ faults: { metrics: "garbled" } });
  t.after(() => r.close());
  const res = await fetch(`${r.url}/metrics`);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  const text = await res.text();
  assert.throws(() => parsePromText(text), { name: "PromParseError" });
});

test("--fault-metrics stall never answers /metrics, the rest keeps working, close() does not hang", async (t) => {
  const r = await startTestReplica({ faults: { metrics: "stall" } });
  t.after(() => r.close());
  await assert.rejects(fetch(`${r.url}/metrics`, { signal: AbortSignal.timeout(300) }), {
    name: "TimeoutError",
  });
  assert.equal((await postJson(`${r.url}/v1/completions`, { prompt: "x", max_tokens: 1 })).status, 200);
  // A scrape left hanging must not keep close() from finishing.
  void fetch(`${r.url}/metrics`).catch(() => {});
  await r.close();
});

test("--fault-crash-after in-process: the n-th request's stream is cut and the listener is gone", async (t) => {
  const r = await startTestReplica({ faults: { crashAfter: 2 }, timeScale: 20 });
  t.after(() => r.close());
  const ok = await postJson(`${r.url}/v1/completions`, { prompt: "one", max_tokens: 3, ignore_eos: true });
  assert.equal(ok.status, 200);
  const body = await new Promise<{ text: string; error: boolean }>((resolve) => {
    let text = "";
    const req = request(
      `${r.url}/v1/completions`,
      { method: "POST", headers: { "content-type": "application/json" } },
      (res) => {
        res.setEncoding("utf8");
        res.on("data", (d: string) => (text += d));
        res.on("end", () => resolve({ text, error: false }));
        res.on("error", () => resolve({ text, error: true }));
        res.on("aborted", () => resolve({ text, error: true }));
      },
    );
    req.on("error", () => resolve({ text, error: true }));
    req.end(JSON.stringify({ prompt: "two", max_tokens: 500, ignore_eos: true, stream: true }));
  });
  assert.ok(body.text.startsWith("data: "), "the first output went out");
  assert.ok(!body.text.includes("[DONE]"), "the stream was cut");
  await assert.rejects(fetch(`${r.url}/health`), "the listener is gone");
});

test("--fault-crash-after as a process: it dies hard mid-stream", async (t) => {
  const p = await spawnReplica([
    "--fault-crash-after",
    "2",
    "--time-scale",
    "20",
    "--num-gpu-blocks-override",
    "1000",
    "--max-model-len",
    "4096",
  ]);
  t.after(() => p.close());
  const ok = await postJson(`${p.url}/v1/completions`, { prompt: "one", max_tokens: 3, ignore_eos: true });
  assert.equal(ok.status, 200);
  const res = await fetch(`${p.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "two", max_tokens: 2000, ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  await assert.rejects(res.text(), "the stream breaks off");
  const status = await p.exited;
  assert.equal(status.signal, "SIGKILL");
});
