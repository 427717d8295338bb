/**
 * The `mix` workload: streams merged on one timeline with their tags, ids and dependencies renamed
 * per stream, arrivals shifted by `start`; bad mixes refused with the field named; and the bench
 * sends a tagged request's tags as llm-d's headers, records the dropped reason, and the breakdown
 * groups per tenant and objective.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, describe, it } from "node:test";
import { breakdown, tagHeaders } from "../src/bench/breakdown.ts";
import { runBench } from "../src/bench/driver.ts";
import { generateWorkload, resolveWorkloadSpec } from "../src/bench/workloads/spec.ts";

const streams = [
  {
    name: "flood",
    tenant: "tenant-a",
    start: 10,
    workload: "random",
    numRequests: 3,
    arrival: { type: "constant", rate: 2 },
    options: { inputLen: 100, outputLen: 4 },
  },
  {
    name: "chat",
    tenant: "tenant-b",
    objective: "critical",
    sloTtftMs: 250,
    sloTpotMs: 40,
    workload: "multi-turn",
    numRequests: 2,
    arrival: { type: "constant", rate: 1 },
    options: { turns: 2, thinkTime: 0 },
  },
];

describe("mix workload", () => {
  it("merges streams by time with their tags, ids renamed and starts shifted", () => {
    const w = generateWorkload({ workload: "mix", seed: 5, options: { streams } });
    const flood = w.requests.filter((r) => r.tags?.stream === "flood");
    assert.deepEqual(
      flood.map((r) => [r.id, r.arrivalTime]),
      [
        ["flood-r0", 10],
        ["flood-r1", 10.5],
        ["flood-r2", 11],
      ],
    );
    assert.deepEqual(flood[0].tags, { stream: "flood", tenant: "tenant-a" });
    const chat = w.requests.filter((r) => r.tags?.stream === "chat");
    assert.equal(chat.length, 4, "2 sessions × 2 turns");
    assert.deepEqual(chat[0].tags, {
      stream: "chat",
      tenant: "tenant-b",
      objective: "critical",
      sloTtftMs: 250,
      sloTpotMs: 40,
    });
    // A second turn waits for the first turn of its own session, renamed alike.
    for (const r of chat.filter((x) => x.after))
      assert.ok(chat.some((x) => x.id === r.after?.id && x.sessionId === r.sessionId));
    const times = w.requests.map((r) => r.arrivalTime);
    assert.deepEqual(
      times,
      [...times].sort((a, b) => a - b),
    );
    // Same spec, same text; the streams do not share their seed.
    const again = generateWorkload({ workload: "mix", seed: 5, options: { streams } });
    assert.deepEqual(again.requests, w.requests);
  });

  it("numRequests on a mix keeps the first N by arrival", () => {
    const w = generateWorkload({ workload: "mix", seed: 5, numRequests: 2, options: { streams } });
    assert.equal(w.requests.length, 2);
    assert.ok(w.requests.every((r) => r.tags?.stream === "chat"));
  });

  it("refuses duplicate names, stages arrivals and bad streams, naming the stream", () => {
    const dup = { ...streams[0], name: "chat" };
    assert.throws(
      () => resolveWorkloadSpec({ workload: "mix", options: { streams: [streams[1], dup] } }),
      /"chat" is used twice/,
    );
    const staged = { ...streams[0], arrival: { type: "stages", stages: [{ rate: 1, duration: 2 }] } };
    assert.throws(
      () => resolveWorkloadSpec({ workload: "mix", options: { streams: [staged] } }),
      /streams\[0\] \(flood\): stages arrivals are not supported/,
    );
    const bad = { ...streams[0], options: { inputLen: 100, nope: 1 } };
    assert.throws(
      () => resolveWorkloadSpec({ workload: "mix", options: { streams: [bad] } }),
      /streams\[0\] \(flood\).*unknown key "nope"/,
    );
    assert.throws(
      () =>
        resolveWorkloadSpec({
          workload: "mix",
          options: { streams: [{ ...streams[0], tenant: "a b" }] },
        }),
      /tenant/,
    );
  });
});

describe("bench with tags", () => {
  const servers: Server[] = [];
  after(() => {
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
  });

  it("sends llm-d's headers, records the dropped reason, reports per tenant and objective", async () => {
    const seen: Array<Record<string, string | undefined>> = [];
    const server = createServer(async (req, res) => {
      if (req.url === "/v1/models") {
        res.writeHead(200, { "content-type": "application/json" }).end('{"data":[{"id":"m"}]}');
        return;
      }
      for await (const _ of req);
      const h = (k: string) => req.headers[k] as string | undefined;
      seen.push({
        tenant: h("x-gateway-inference-fairness-id"),
        objective: h("x-gateway-inference-objective"),
        ttft: h("x-llm-d-slo-ttft-ms"),
        tpot: h("x-llm-d-slo-tpot-ms"),
      });
      if (h("x-gateway-inference-fairness-id") === "tenant-a") {
        res
          .writeHead(429, { "x-llm-d-request-dropped-reason": "rejected-saturated" })
          .end('{"error":{"message":"full"}}');
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: " hi" }] })}\n\n`);
      res.write(
        `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 1 } })}\n\n`,
      );
      res.end("data: [DONE]\n\n");
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const mix = [
      { ...streams[0], start: 0, arrival: { type: "constant", rate: 100 } },
      {
        ...streams[1],
        workload: "random",
        options: { inputLen: 10, outputLen: 1 },
        arrival: { type: "constant", rate: 100 },
      },
    ];
    const w = generateWorkload({ workload: "mix", seed: 1, options: { streams: mix } });
    const r = await runBench(w, { targets: [url], metricsEndpoints: [] });
    assert.equal(seen.length, 5);
    assert.deepEqual(seen.filter((s) => s.tenant === "tenant-b")[0], {
      tenant: "tenant-b",
      objective: "critical",
      ttft: "250",
      tpot: "40",
    });
    assert.deepEqual(seen.filter((s) => s.tenant === "tenant-a")[0], {
      tenant: "tenant-a",
      objective: undefined,
      ttft: undefined,
      tpot: undefined,
    });
    const rejected = r.records.filter((x) => x.error);
    assert.equal(rejected.length, 3);
    assert.ok(rejected.every((x) => x.error?.reason === "rejected-saturated" && x.error.status === 429));
    const b = breakdown(r.records, w.requests);
    assert.deepEqual(
      b?.by_tenant.map((g) => [g.group, g.requests, g.completed, g.rejected, g.slo_requests, g.slo_met]),
      [
        ["tenant-a", 3, 0, { "429 rejected-saturated": 3 }, 0, 0],
        ["tenant-b", 2, 2, {}, 2, 2],
      ],
    );
    assert.deepEqual(
      b?.by_priority.map((g) => g.group),
      ["(none)", "critical"],
    );
    assert.deepEqual(tagHeaders({ ...w.requests[0], tags: undefined }), {});
  });
});

describe("groupFigures", () => {
  it("SLO attainment counts misses and failures; throughput over the group's own window", async () => {
    const { groupFigures } = await import("../src/bench/breakdown.ts");
    const rec = (id: string, start: number, first: number, end: number, out: number) => ({
      id,
      start,
      end,
      chunkTimes: [first, end],
      chunkTokens: [1, out - 1],
      promptTokens: 10,
      completionTokens: out,
    });
    const tags = { stream: "s", sloTtftMs: 200, sloTpotMs: 50 };
    const spec = (id: string) => ({
      id,
      arrivalTime: 0,
      kind: "completion" as const,
      promptTokensApprox: 10,
      maxTokens: 5,
      tags,
    });
    const recs = [
      rec("ok", 0, 0.1, 0.2, 5), // TTFT 100 ms, TPOT 25 ms: met
      rec("slow", 1, 1.5, 1.6, 5), // TTFT 500 ms: missed
      rec("choppy", 2, 2.1, 2.9, 5), // TPOT 200 ms: missed
      {
        ...rec("shed", 3, 3, 3, 0),
        chunkTimes: [],
        chunkTokens: [],
        error: { kind: "http_429", status: 429, message: "", reason: "rejected-saturated" },
      },
    ];
    const g = groupFigures(
      "s",
      recs,
      recs.map((r) => spec(r.id)),
    );
    assert.equal(g.slo_requests, 4);
    assert.equal(g.slo_met, 1);
    assert.equal(g.completed, 3);
    assert.deepEqual(g.rejected, { "429 rejected-saturated": 1 });
    // Window: first send 0 → last completed end 2.9; 15 output tokens.
    assert.ok(Math.abs((g.output_tokens_per_s ?? 0) - 15 / 2.9) < 1e-9);
    assert.ok(Math.abs((g.ttft_p50_s ?? 0) - 0.1) < 1e-9);
  });
});
