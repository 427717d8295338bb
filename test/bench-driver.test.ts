// The live driver against small fake OpenAI-compatible SSE servers on loopback: request bodies,
// token counting per chunk, round-robin, closed-loop ordering, time scaling, error kinds,
// bounds (max requests, max duration) and the fleet figures scraped from /metrics.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, describe, test } from "node:test";
import { runBench } from "../src/bench/driver.ts";
import { aggregate } from "../src/bench/metrics.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";

interface FakeOptions {
  /** Tokens per content chunk. */
  perChunk?: number;
  tokenIds?: boolean;
  /** Answer this status instead of streaming for request numbers (1-based) in the set. */
  failWith?: { status: number; on: Set<number> };
  /** Stream never ends. */
  hang?: boolean;
  /** End without [DONE]. */
  noDone?: boolean;
  /** Send an error payload mid-stream. */
  midError?: boolean;
}

interface Fake {
  url: string;
  bodies: Array<Record<string, unknown>>;
  close(): Promise<void>;
}

const servers: Server[] = [];
after(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

async function fakeServer(o: FakeOptions = {}): Promise<Fake> {
  const bodies: Array<Record<string, unknown>> = [];
  let hits = 1000;
  let queries = 2000;
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === "GET" && req.url === "/v1/models") {
      res
        .writeHead(200, { "content-type": "application/json" })
        .end('{"object":"list","data":[{"id":"fake-model"}]}');
      return;
    }
    if (req.method === "GET" && req.url === "/metrics") {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end(
        `# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine="0",model_name="m"} ${hits}\n` +
          `# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine="0",model_name="m"} ${queries}\n` +
          `# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine="0",model_name="m"} ${bodies.length}\n` +
          `# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n`,
      );
      return;
    }
    let raw = "";
    for await (const c of req) raw += c;
    const body = JSON.parse(raw) as Record<string, unknown>;
    bodies.push(body);
    const n = bodies.length;
    if (o.failWith?.on.has(n)) {
      res
        .writeHead(o.failWith.status, { "content-type": "application/json" })
        .end('{"error":{"message":"busy"}}');
      return;
    }
    hits += 10;
    queries += 20;
    const chat = req.url === "/v1/chat/completions";
    const maxTokens = body["max_tokens"] as number;
    res.writeHead(200, { "content-type": "text/event-stream" });
    const send = (v: unknown) => res.write(`data: ${JSON.stringify(v)}\n\n`);
    if (chat) send({ choices: [{ index: 0, delta: { role: "assistant", content: "" } }] });
    if (o.hang) return;
    const per = o.perChunk ?? 1;
    for (let left = maxTokens, i = 0; left > 0; left -= per, i++) {
      const k = Math.min(per, left);
      const text = o.tokenIds ? " t" : " tok".repeat(k);
      const ids = o.tokenIds ? { token_ids: Array.from({ length: k }, () => 7) } : {};
      send({ choices: [chat ? { index: 0, delta: { content: text }, ...ids } : { index: 0, text, ...ids }] });
      if (o.midError && i === 0) send({ error: { message: "engine died", code: 500 } });
      await new Promise((r) => setTimeout(r, 2));
    }
    send({
      choices: [],
      usage: {
        prompt_tokens: 11,
        completion_tokens: maxTokens,
        total_tokens: 11 + maxTokens,
        prompt_tokens_details: { cached_tokens: 4 },
      },
    });
    if (!o.noDone) res.write("data: [DONE]\n\n");
    res.end();
  };
  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    bodies,
    close: () => {
      server.closeAllConnections();
      return new Promise((r) => server.close(() => r()));
    },
  };
}

const smoke = (n: number, extra: Record<string, unknown> = {}) =>
  generateWorkload({
    workload: "shared-prefix",
    numRequests: n,
    arrival: { type: "constant", rate: 1000 },
    options: { numGroups: 2, promptsPerGroup: 2, systemPromptLen: 20, questionLen: 5, outputLen: 6 },
    ...extra,
  });

describe("runBench against fake servers", () => {
  test("streams with usage and ignore_eos; tokens spread over chunks; metrics from usage", async () => {
    const fake = await fakeServer({ perChunk: 2 });
    const w = smoke(5);
    const r = await runBench(w, { targets: [`${fake.url}/v1/`], metricsEndpoints: [] });
    assert.equal(r.model, "fake-model");
    assert.equal(r.records.length, 5);
    assert.equal(r.notSent, 0);
    assert.equal(r.fleet, undefined);
    const b = fake.bodies[0];
    assert.equal(b["stream"], true);
    assert.deepEqual(b["stream_options"], { include_usage: true });
    assert.equal(b["ignore_eos"], true);
    assert.equal(b["max_tokens"], 6);
    assert.equal(b["model"], "fake-model");
    assert.equal(typeof b["prompt"], "string");
    for (const rec of r.records) {
      assert.equal(rec.error, undefined);
      // Three 2-token events; events that happen to arrive in one read merge into one chunk.
      const tokens = Array.from(rec.chunkTokens);
      assert.ok(tokens.length >= 1 && tokens.length <= 3);
      assert.ok(tokens.every((k) => k > 0 && k % 2 === 0));
      assert.equal(
        tokens.reduce((a, k) => a + k, 0),
        6,
      );
      assert.equal(rec.completionTokens, 6);
      assert.equal(rec.promptTokens, 11);
      assert.equal(rec.cachedTokens, 4);
      const times = Array.from(rec.chunkTimes);
      assert.ok(rec.end >= times[times.length - 1] && times[0] >= rec.start);
      assert.deepEqual(
        times,
        [...times].sort((x, y) => x - y),
      );
    }
    const agg = aggregate(r.records);
    assert.equal(agg.output_tokens, 30);
    assert.equal(agg.itl.count, 25, "out − 1 gaps per request");
    assert.equal(agg.usage_cache_hit_rate, 4 / 11);
  });

  test("token_ids win over the usage spread; chat streams skip the role chunk", async () => {
    const fake = await fakeServer({ perChunk: 3, tokenIds: true });
    const w = smoke(2, {
      options: {
        numGroups: 1,
        promptsPerGroup: 1,
        systemPromptLen: 5,
        questionLen: 5,
        outputLen: 7,
        api: "chat",
      },
    });
    const r = await runBench(w, { targets: [fake.url], metricsEndpoints: [], model: "m" });
    assert.ok(Array.isArray(fake.bodies[0]["messages"]));
    // Events carry 3, 3, 1 ids but equal text: a spread by text length would give 3, 2, 2.
    for (const rec of r.records) {
      let sum = 0;
      for (const k of Array.from(rec.chunkTokens))
        assert.ok([3, 6, 7].includes((sum += k)), `cumulative ${sum}`);
      assert.equal(sum, 7);
    }
  });

  test("round-robin alternates targets; the fleet hit rate is Δhits/Δqueries from /metrics", async () => {
    const a = await fakeServer();
    const b = await fakeServer();
    const r = await runBench(smoke(6), { targets: [a.url, b.url], metricsInterval: 0.01 });
    assert.equal(a.bodies.length, 3);
    assert.equal(b.bodies.length, 3);
    assert.ok(r.fleet);
    assert.equal(r.fleet.prefix_cache_hit_rate, 0.5);
    assert.equal(r.fleet.prefix_cache_queries, 120);
    assert.equal(r.fleet.preemptions, 6);
    assert.equal(r.fleet.endpoints.length, 2);
    assert.equal(r.fleet.endpoints[0].prefix_cache_hit_rate, 0.5);
  });

  test("closed-loop users: each request is sent only after the user's previous one ended", async () => {
    const fake = await fakeServer();
    const w = smoke(9, { arrival: { type: "closed", users: 3 } });
    const r = await runBench(w, { targets: [fake.url], metricsEndpoints: [] });
    const byId = new Map(r.records.map((x) => [x.id, x]));
    const chained = w.requests.filter((spec) => spec.after);
    assert.equal(chained.length, 6, "3 users × 3 requests: all but each user's first wait for one");
    for (const spec of chained) assert.ok(byId.get(spec.id)!.start >= byId.get(spec.after!.id)!.end);
    assert.equal(r.records.length, 9);
  });

  test("closed-loop warm-up: each user's first request is sent and recorded, but not measured", async () => {
    const fake = await fakeServer();
    const w = smoke(9, { arrival: { type: "closed", users: 3, warmup: 1 } });
    const r = await runBench(w, { targets: [fake.url], metricsEndpoints: [] });
    const first = new Set(w.requests.filter((spec) => !spec.after).map((spec) => spec.id));
    assert.equal(first.size, 3);
    assert.deepEqual(
      r.records
        .filter((x) => x.warmup)
        .map((x) => x.id)
        .sort(),
      [...first].sort(),
    );
    const agg = aggregate(r.records);
    assert.equal(agg.requests, 6, "the 3 warm-up requests are not in the measured figures");
    assert.equal(agg.completed, 6);
  });

  test("time scale: arrivals are placed in simulated seconds, reported in simulated seconds", async () => {
    const fake = await fakeServer();
    const w = smoke(3, { arrival: { type: "constant", rate: 0.1 } }); // 0, 10, 20 simulated s
    const r = await runBench(w, { targets: [fake.url], metricsEndpoints: [], timeScale: 2000 });
    const starts = r.records.map((x) => x.start).sort((x, y) => x - y);
    assert.ok(starts[1] >= 10 && starts[2] >= 20, `starts ${starts}`);
    // At most 2.5 s of wall-clock lateness (5,000 simulated s at 2000×); a driver that waited in
    // wall seconds, or scaled the reported times twice, would put the third at ≥ 40,000.
    assert.ok(starts[2] < 20 + 2.5 * 2000, `starts ${starts}`);
  });

  test("error kinds: HTTP status, mid-stream error, missing [DONE]", async () => {
    const failing = await fakeServer({ failWith: { status: 429, on: new Set([2]) } });
    const r1 = await runBench(smoke(3), { targets: [failing.url], metricsEndpoints: [] });
    assert.deepEqual(aggregate(r1.records).errors_by_kind, { http_429: 1 });
    const mid = await fakeServer({ midError: true });
    const r2 = await runBench(smoke(1), { targets: [mid.url], metricsEndpoints: [] });
    assert.equal(r2.records[0].error?.kind, "stream");
    const cut = await fakeServer({ noDone: true });
    const r3 = await runBench(smoke(1), { targets: [cut.url], metricsEndpoints: [] });
    assert.equal(r3.records[0].error?.kind, "incomplete");
    const r4 = await runBench(smoke(1), {
      targets: ["http://127.0.0.1:1"],
      metricsEndpoints: [],
      model: "m",
    });
    assert.equal(r4.records[0].error?.kind, "connect");
  });

  test("bounds: max requests stops sending; max duration cuts in-flight requests off", async () => {
    const fake = await fakeServer();
    const r = await runBench(smoke(10), { targets: [fake.url], metricsEndpoints: [], maxRequests: 4 });
    assert.equal(r.records.length, 4);
    assert.equal(r.notSent, 6);
    const hang = await fakeServer({ hang: true });
    const h = await runBench(smoke(3), { targets: [hang.url], metricsEndpoints: [], maxDuration: 0.2 });
    assert.equal(h.records.length, 3);
    assert.ok(h.records.every((x) => x.error?.kind === "cutoff"));
  });

  test("an abort signal stops the run and reports what was not sent", async () => {
    const fake = await fakeServer({ hang: true });
    const ac = new AbortController();
    const w = smoke(4, { arrival: { type: "constant", rate: 0.001 } });
    const p = runBench(w, {
      targets: [fake.url],
      metricsEndpoints: [],
      signal: ac.signal,
      onProgress: () => ac.abort(),
      progressIntervalMs: 5,
    });
    const r = await p;
    assert.equal(r.records.length, 1);
    assert.equal(r.notSent, 3);
    assert.equal(r.records[0].error?.kind, "cutoff");
  });

  test("an abort while waiting for the next arrival ends the run at once", async () => {
    const fake = await fakeServer();
    const ac = new AbortController();
    const w = smoke(2, { arrival: { type: "constant", rate: 0.0001 } });
    const r = await runBench(w, {
      targets: [fake.url],
      metricsEndpoints: [],
      signal: ac.signal,
      onProgress: (p) => {
        if (p.completed === 1) ac.abort();
      },
      progressIntervalMs: 5,
    });
    assert.equal(r.records.length, 1);
    assert.equal(r.records[0].error, undefined);
    assert.equal(r.notSent, 1);
  });
});
