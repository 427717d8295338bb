/**
 * The chaos suite (`npm run test:chaos`, loopback only, bounded): replicas that die before the
 * first byte, stall, answer 5xx, serve garbled or stalled /metrics, restart empty; a slow-reading
 * client; a gateway process killed mid-stream. For each, what the client sees (no request lost
 * before its first byte; a clean error after), what the gateway's view does (taken out, readmitted)
 * and the metric that records it. Replicas killed mid-stream with and without migration are in
 * gateway-migrate.test.ts; garbled KV-event frames and precise-index resets after a restart in
 * kv-subscriber.test.ts and gateway-precise-lifecycle.test.ts.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { request } from "node:http";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { GARBLED_METRICS } from "../src/sim/faults.ts";
import { type FakeServer, type Handler, modelList, startFake, vllmMetrics } from "./helpers/gateway-fakes.ts";
import { endpointId } from "./helpers/precise-fleet.ts";
import { KVGATE_BIN, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const ROUND_ROBIN = fileURLToPath(new URL("../config/examples/round-robin.yaml", import.meta.url));
const cleanup: Array<() => Promise<unknown>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c().catch(() => {});
});

async function fake(gen: Handler, metrics?: Handler): Promise<FakeServer> {
  const f = await startFake({
    "GET /metrics": metrics ?? ((_q, res) => void res.end(vllmMetrics({ model: "m" }))),
    "GET /v1/models": (_q, res) => void res.end(modelList("m")),
    "POST /v1/completions": gen,
  });
  cleanup.push(() => f.close());
  return f;
}

async function replica(): Promise<TestReplica> {
  const r = await startTestReplica({ servedModelName: "m" });
  cleanup.push(() => r.close());
  return r;
}

async function gateway(endpoints: string[], extra = {}): Promise<GatewayHandle> {
  const g = await startGateway({
    endpoints: endpoints.join(","),
    configFile: ROUND_ROBIN,
    scrapeIntervalMs: 25,
    log: () => {},
    ...extra,
  });
  cleanup.push(() => g.close());
  return g;
}

async function complete(g: GatewayHandle, maxTokens = 3): Promise<{ status: number; served: string | null }> {
  const r = await fetch(`${g.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt: "chaos", max_tokens: maxTokens }),
  });
  await r.arrayBuffer();
  return { status: r.status, served: r.headers.get("x-gateway-destination-endpoint-served") };
}

const metrics = async (g: GatewayHandle) => (await fetch(`${g.adminUrl}/metrics`)).text();
const value = (text: string, line: RegExp) => Number(line.exec(text)?.[1] ?? Number.NaN);

/** Every one of `n` requests is served (200) by `good`: the faulty endpoint never reaches the client. */
async function allServedBy(g: GatewayHandle, good: string, n = 6): Promise<void> {
  for (let i = 0; i < n; i++) assert.deepEqual(await complete(g), { status: 200, served: good });
}

for (const [what, kind, gen, extra] of [
  ["killed before the first byte", "reset", (q) => q.socket.destroy(), {}],
  ["stalled (accepts, never answers)", "timeout", () => {}, { upstreamHeadersTimeoutMs: 300 }],
  [
    "answering 5xx",
    "status",
    (_q, res) =>
      void res.writeHead(500, { "content-type": "application/json" }).end('{"error":{"message":"boom"}}'),
    {},
  ],
] as Array<[string, string, Handler, object]>)
  test(`a replica ${what}: failover before the first byte, counted as ${kind}`, {
    timeout: 30_000,
  }, async () => {
    const bad = await fake(gen);
    const good = await replica();
    const g = await gateway([bad.id, endpointId(good)], extra);
    await waitFor(() =>
      g.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
    );
    await allServedBy(g, endpointId(good));
    assert.ok(bad.hits("/v1/completions") >= 1, "the faulty replica was tried");
    const m = await metrics(g);
    const failed = value(
      m,
      new RegExp(`kvgate_upstream_failures_total\\{endpoint="${bad.id}",kind="${kind}"\\} (\\d+)`),
    );
    assert.equal(failed, bad.hits("/v1/completions"), "every failed attempt is counted");
    assert.ok(value(m, /llm_d_epp_scheduler_attempts_total\{status="retry"[^}]*\} (\d+)/) >= 1);
  });

for (const [what, metricsHandler] of [
  ["garbled /metrics", (_q, res) => void res.end(GARBLED_METRICS)],
  ["stalled /metrics", () => {}],
] as Array<[string, Handler]>)
  test(`a replica with ${what} is taken out of routing and never tried`, { timeout: 30_000 }, async () => {
    const bad = await fake((_q, res) => void res.writeHead(500).end(), metricsHandler);
    const good = await replica();
    const g = await gateway([bad.id, endpointId(good)], { scrapeTimeoutMs: 200 });
    await waitFor(async () => /kvgate_endpoint_healthy\{[^}]*"\} 0/.test(await metrics(g)), 10_000);
    const m = await metrics(g);
    assert.match(m, new RegExp(`kvgate_endpoint_healthy\\{endpoint="${bad.id}"[^}]*\\} 0`));
    assert.match(m, new RegExp(`kvgate_endpoint_healthy\\{endpoint="${endpointId(good)}"[^}]*\\} 1`));
    await allServedBy(g, endpointId(good));
    assert.equal(bad.hits("/v1/completions"), 0, "no request was sent to the unhealthy replica");
  });

test("a replica restarted (empty cache) is readmitted and served again", { timeout: 30_000 }, async () => {
  const a = await replica();
  let b = await replica();
  const port = b.port;
  const g = await gateway([endpointId(a), endpointId(b)]);
  await waitFor(() =>
    g.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
  await b.close();
  // Down: every request still answered, by a.
  for (let i = 0; i < 4; i++) assert.equal((await complete(g)).status, 200);
  b = await startTestReplica({ servedModelName: "m", port });
  cleanup.push(() => b.close());
  const served = new Set<string | null>();
  await waitFor(async () => {
    served.add((await complete(g)).served);
    return served.has(endpointId(b));
  }, 15_000);
  assert.equal(b.server.engine.stats().numRequestsRunning, 0);
});

test("a slow-reading client gets its whole stream; others are not held up", { timeout: 30_000 }, async () => {
  const r = await replica();
  const g = await gateway([endpointId(r)]);
  await waitFor(() =>
    g.gateway.data.store.all().every((x) => x.state.metrics !== null && x.modelIds !== null),
  );
  const url = new URL(`${g.url}/v1/completions`);
  const body = JSON.stringify({
    model: "m",
    prompt: "slow",
    ignore_eos: true,
    max_tokens: 1500,
    stream: true,
    stream_options: { include_usage: true },
  });
  const slow = new Promise<string>((resolve, reject) => {
    const q = request(
      {
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: "POST",
        headers: { "content-type": "application/json" },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.pause(); // reads nothing for a while: the gateway must hold back, not drop or hang
        setTimeout(() => {
          res.on("data", (d: string) => (text += d));
          res.on("end", () => resolve(text));
          res.resume();
        }, 800);
      },
    );
    q.on("error", reject);
    q.end(body);
  });
  // Meanwhile another client is served.
  assert.equal((await complete(g)).status, 200);
  const text = await slow;
  const evs = text.trim().split("\n\n");
  assert.equal(evs.at(-1), "data: [DONE]");
  assert.ok(!text.includes('"error"'));
  const chunks = evs.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
  assert.equal(chunks.at(-1).usage.completion_tokens, 1500, "the whole stream arrived");
  assert.equal(chunks.filter((c) => c.choices[0]?.finish_reason === "length").length, 1);
});

test("a gateway process killed mid-stream: the client gets a clean error, the replica stops generating", {
  timeout: 150_000,
}, async () => {
  const r = await startTestReplica({ servedModelName: "m", timeScale: 1 });
  cleanup.push(() => r.close());
  const child = spawn(
    process.execPath,
    [
      KVGATE_BIN,
      "serve",
      "--port",
      "0",
      "--admin-port",
      "0",
      "--host",
      "127.0.0.1",
      "--endpoints",
      endpointId(r),
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  cleanup.push(async () => child.kill("SIGKILL"));
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  await waitFor(() => /listening on http:\/\/127\.0\.0\.1:(\d+)/.test(out), 90_000);
  const port = (/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out) as RegExpExecArray)[1];
  // The startup line precedes the first scrape: wait until the gateway routes.
  let res: Response | null = null;
  for (let i = 0; i < 300 && res?.status !== 200; i++) {
    res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", prompt: "stream", max_tokens: 2000, stream: true }),
    });
    if (res.status !== 200) await new Promise((x) => setTimeout(x, 100));
  }
  const stream = res?.body;
  assert.ok(res?.status === 200 && stream, "the gateway answered the stream");
  const reader = stream.getReader();
  await reader.read();
  await waitFor(() => r.server.engine.stats().numRequestsRunning === 1, 30_000);
  child.kill("SIGKILL");
  await assert.rejects(async () => {
    for (;;) if ((await reader.read()).done) throw new Error("ended without an error");
  }, /terminated|other side closed|ECONNRESET|socket/i);
  // The replica sees the connection go and aborts the request instead of generating on.
  await waitFor(() => r.server.engine.stats().numRequestsRunning === 0, 30_000);
});
