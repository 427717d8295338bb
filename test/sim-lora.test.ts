/**
 * LoRA in the simulated engine and replica: a batch uses at most --max-loras adapters (requests for
 * another adapter wait, keeping their order, as vLLM's scheduler skips them), a step that brings an
 * adapter into a GPU slot takes the load time longer, LoRA blocks carry lora_id/lora_name and hash
 * apart from base-model blocks; the replica lists adapters in /v1/models with `parent`, exposes
 * vllm:lora_requests_info in vLLM's shape, and rejects bad LoRA flags naming the flag.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { extractLoraInfo } from "../src/datalayer/lora-info.ts";
import type { KVEvent } from "../src/kv/events.ts";
import { resolveReplicaOptions } from "../src/sim/replica-options.ts";
import { Engine, engineConfig, runToIdle, tokens } from "./helpers/engine-fixtures.ts";
import { type Json, postJson, scrapeMetrics, startTestReplica, waitFor } from "./helpers/replica.ts";

const req = (id: string, loraName?: string, maxTokens = 4) => ({
  id,
  promptTokenIds: tokens(64),
  maxTokens,
  ignoreEos: true,
  ...(loraName !== undefined && { loraName, loraId: loraName === "a" ? 1 : 2 }),
});

describe("engine with --enable-lora", () => {
  it("runs at most max_loras adapters per batch; the others wait in order", () => {
    const e = new Engine(engineConfig({ lora: { maxLoras: 1, loadSeconds: 0 } }));
    e.addRequest(req("a1", "a"), 0);
    e.addRequest(req("b1", "b"), 0);
    e.addRequest(req("a2", "a"), 0);
    e.addRequest(req("base"), 0);
    const first = e.step(0);
    assert.equal(first.numScheduledRequests, 3, "a1, a2 and the base request run; b1 waits");
    assert.deepEqual(e.loraState()?.running, ["a"]);
    assert.deepEqual(e.loraState()?.waiting, ["b"]);
    const results = [first, ...runToIdle(e, first.endTime)];
    const finishedAt = new Map<string, number>();
    for (const r of results) for (const o of r.outputs) if (o.record) finishedAt.set(o.requestId, r.endTime);
    const bStart = results.find((r) => r.outputs.some((o) => o.requestId === "b1"))!.startTime;
    assert.ok(
      bStart >= finishedAt.get("a1")! && bStart >= finishedAt.get("a2")!,
      "b1 starts after a's batch",
    );
  });

  it("with max_loras 2 both adapters share a batch", () => {
    const e = new Engine(engineConfig({ lora: { maxLoras: 2, loadSeconds: 0 } }));
    e.addRequest(req("a1", "a"), 0);
    e.addRequest(req("b1", "b"), 0);
    assert.equal(e.step(0).numScheduledRequests, 2);
    assert.deepEqual(e.loraState()?.running, ["a", "b"]);
  });

  it("a step that loads an adapter into a GPU slot takes the load time longer, once", () => {
    const timed = new Engine(engineConfig({ lora: { maxLoras: 1, loadSeconds: 0.025 } }));
    const free = new Engine(engineConfig({ lora: { maxLoras: 1, loadSeconds: 0 } }));
    for (const e of [timed, free]) e.addRequest(req("a1", "a"), 0);
    const t1 = timed.step(0);
    const f1 = free.step(0);
    assert.ok(Math.abs(t1.endTime - f1.endTime - 0.025) < 1e-9, "first step pays the load");
    const t2 = timed.step(t1.endTime);
    const f2 = free.step(f1.endTime);
    assert.ok(Math.abs(t2.endTime - t2.startTime - (f2.endTime - f2.startTime)) < 1e-9, "resident: no load");
    assert.equal(timed.loraState()?.loads, 1);
    runToIdle(timed, t2.endTime);
    timed.addRequest(req("b1", "b"), 10);
    timed.step(10);
    assert.deepEqual(timed.loraState()?.resident, ["b"], "b evicted a from the single slot");
    assert.equal(timed.loraState()?.loads, 2);
  });

  it("LoRA blocks carry lora_id and lora_name and hash apart from the base model's", () => {
    const e = new Engine(engineConfig({ lora: { maxLoras: 2, loadSeconds: 0 } }));
    e.addRequest(req("base"), 0);
    e.addRequest(req("a1", "a"), 0);
    const stored = runToIdle(e)
      .flatMap((r) => r.kvEvents?.events ?? [])
      .filter((ev): ev is Extract<KVEvent, { type: "BlockStored" }> => ev.type === "BlockStored");
    const lora = stored.filter((ev) => ev.loraName === "a");
    const base = stored.filter((ev) => ev.loraName === null);
    assert.ok(lora.length > 0 && base.length > 0);
    assert.ok(lora.every((ev) => ev.loraId === 1));
    assert.ok(base.every((ev) => ev.loraId === null));
    const baseHashes = new Set(base.flatMap((ev) => ev.blockHashes));
    assert.ok(
      lora.flatMap((ev) => ev.blockHashes).every((h) => !baseHashes.has(h)),
      "same tokens, other hashes",
    );
    // And so a second base request does not hit the LoRA request's blocks (nor the reverse).
    e.addRequest({ ...req("a2", "a"), promptTokenIds: tokens(64) }, 100);
    const hit = runToIdle(e, 100)
      .flatMap((r) => r.outputs.filter((o) => o.record))
      .map((o) => o.record!);
    assert.equal(hit[0]!.cachedTokens, 48, "the same adapter's prefix is reused");
  });
});

describe("engine with --enable-lora, any workload", () => {
  it("never schedules more than max_loras adapters in a step, and finishes every request", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 3 }),
        fc.array(
          fc.record({
            lora: fc.constantFrom(undefined, "a", "b", "c", "d"),
            len: fc.integer({ min: 1, max: 300 }),
            out: fc.integer({ min: 1, max: 20 }),
            at: fc.integer({ min: 0, max: 5 }),
          }),
          { minLength: 1, maxLength: 40 },
        ),
        (maxLoras, reqs) => {
          const e = new Engine(
            engineConfig({
              lora: { maxLoras, loadSeconds: 0.01 },
              maxNumBatchedTokens: 512,
              numGpuBlocks: 400,
              maxModelLen: 1024,
            }),
          );
          for (const [i, r] of reqs.entries())
            e.addRequest(
              {
                id: `r${i}`,
                promptTokenIds: tokens(r.len, r.at * 1000),
                maxTokens: r.out,
                ignoreEos: true,
                ...(r.lora !== undefined && { loraName: r.lora }),
              },
              0,
            );
          let now = 0;
          let done = 0;
          for (let s = 0; e.hasUnfinishedRequests(); s++) {
            assert.ok(s < 100_000, "finishes");
            const step = e.step(now);
            const st = e.loraState()!;
            assert.ok(st.resident.length <= maxLoras, `resident ${st.resident}`);
            assert.ok(st.running.length <= maxLoras, `running ${st.running}`);
            done += step.outputs.filter((o) => o.finishReason !== null).length;
            now = step.endTime;
            e.checkInvariants();
          }
          assert.equal(done, reqs.length);
        },
      ),
      { numRuns: 60, seed: 17 },
    );
  });
});

describe("replica with --enable-lora", () => {
  it("serves adapters by model name, lists them with parent, and reports lora_requests_info", async (t) => {
    const r = await startTestReplica({
      servedModelName: "base",
      timeScale: 20,
      lora: {
        enableLora: true,
        maxLoras: 1,
        loraModules: ["sql-lora=/adapters/sql", '{"name":"chat-lora","path":"/adapters/chat"}'],
      },
    });
    t.after(() => r.close());
    const models = (await (await fetch(`${r.url}/v1/models`)).json()) as Json;
    assert.deepEqual(
      models.data.map((m: Json) => [m.id, m.parent, m.root]),
      [
        ["base", null, r.server.opts.model],
        ["sql-lora", "base", "/adapters/sql"],
        ["chat-lora", "base", "/adapters/chat"],
      ],
    );
    assert.equal(extractLoraInfo(await scrapeMetrics(r.url)), undefined, "no series before a step");

    // A long sql-lora request holds the single slot; a chat-lora request must wait behind it.
    const long = postJson(`${r.url}/v1/completions`, {
      model: "sql-lora",
      prompt: "a b c",
      max_tokens: 2000,
      ignore_eos: true,
    });
    await waitFor(async () => extractLoraInfo(await scrapeMetrics(r.url))?.running[0] === "sql-lora");
    const short = postJson(`${r.url}/v1/completions`, { model: "chat-lora", prompt: "x y", max_tokens: 2 });
    await waitFor(async () =>
      (extractLoraInfo(await scrapeMetrics(r.url))?.waiting ?? []).includes("chat-lora"),
    );
    const info = extractLoraInfo(await scrapeMetrics(r.url));
    assert.deepEqual(info, { running: ["sql-lora"], waiting: ["chat-lora"], maxLora: 1 });
    const [l, s] = await Promise.all([long, short]);
    assert.equal(l.status, 200);
    assert.equal(s.status, 200);
    assert.equal(l.body.model, "sql-lora");
    const text = await (await fetch(`${r.url}/metrics`)).text();
    assert.match(
      text,
      /^vllm:lora_requests_info\{max_lora="1",running_lora_adapters="sql-lora",waiting_lora_adapters="chat-lora"\} \d/m,
    );
    const unknown = await postJson(`${r.url}/v1/completions`, {
      model: "nope-lora",
      prompt: "x",
      max_tokens: 1,
    });
    assert.equal(unknown.status, 404);
  });

  it("loads and unloads adapters at run time only with VLLM_ALLOW_RUNTIME_LORA_UPDATING", async (t) => {
    const r = await startTestReplica({ servedModelName: "base", lora: { enableLora: true } });
    t.after(() => r.close());
    const prev = process.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"];
    t.after(() => {
      if (prev === undefined) delete process.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"];
      else process.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = prev;
    });
    delete process.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"];
    assert.equal(
      (await postJson(`${r.url}/v1/load_lora_adapter`, { lora_name: "x", lora_path: "/x" })).status,
      404,
    );
    process.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True";
    const ok = await postJson(`${r.url}/v1/load_lora_adapter`, { lora_name: "x", lora_path: "/x" });
    assert.equal(ok.status, 200);
    assert.equal(ok.text, "Success: LoRA adapter 'x' added successfully.");
    assert.equal(
      (await postJson(`${r.url}/v1/load_lora_adapter`, { lora_name: "x", lora_path: "/x" })).status,
      400,
    );
    assert.equal((await postJson(`${r.url}/v1/load_lora_adapter`, { lora_name: "y" })).status, 400);
    const gen = await postJson(`${r.url}/v1/completions`, { model: "x", prompt: "hi", max_tokens: 1 });
    assert.equal(gen.status, 200);
    assert.equal((await postJson(`${r.url}/v1/unload_lora_adapter`, { lora_name: "x" })).status, 200);
    assert.equal((await postJson(`${r.url}/v1/unload_lora_adapter`, { lora_name: "x" })).status, 404);
    assert.equal(
      (await postJson(`${r.url}/v1/completions`, { model: "x", prompt: "hi", max_tokens: 1 })).status,
      404,
    );
  });

  it("rejects LoRA flags that need --enable-lora or are out of range, naming the flag", async () => {
    const bad = async (lora: object, flag: string) =>
      assert.rejects(resolveReplicaOptions({ servedModelName: "base", lora }), (e: Error) =>
        e.message.startsWith(flag),
      );
    await bad({ maxLoras: 2 }, "--max-loras");
    await bad({ loraModules: ["a=/a"] }, "--lora-modules");
    await bad({ enableLora: true, maxLoras: 0 }, "--max-loras");
    await bad({ enableLora: true, maxLoraRank: 7 }, "--max-lora-rank");
    await bad({ enableLora: true, loraModules: ["noequals"] }, "--lora-modules");
    await bad({ enableLora: true, loraModules: ["base=/p"] }, "--lora-modules");
    await bad({ enableLora: true, loadTimeMs: -1 }, "--lora-load-time");
    const o = await resolveReplicaOptions({
      servedModelName: "base",
      lora: { enableLora: true, loraModules: ["a=/a", "b=/b"] },
    });
    assert.deepEqual(
      o.lora?.adapters.map((a) => [a.name, a.id]),
      [
        ["a", 1],
        ["b", 2],
      ],
    );
    assert.equal(o.lora?.loadSeconds, 0.025);
  });
});
