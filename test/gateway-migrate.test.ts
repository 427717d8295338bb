/**
 * Mid-stream migration through `kvgate serve --migrate-streams`: a simulated replica is killed
 * while it streams; the gateway resumes the response on the other replica with the prompt's token
 * ids plus those already generated, and the client's stream stays one valid SSE response — one id,
 * one role chunk, the full max_tokens of text, one finish_reason, usage that counts the whole
 * response, `[DONE]` once, no error event. Without migration the same kill ends in a clean SSE
 * error event.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { endpointId } from "./helpers/precise-fleet.ts";
import { type Json, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const MAX = 120;
let replicas: TestReplica[] = [];
let gw: GatewayHandle;

async function fleet(): Promise<void> {
  // Real time (6 ms a token): a stream lasts long enough to be cut in the middle.
  replicas = await Promise.all(
    [1, 2].map((seed) => startTestReplica({ servedModelName: "m", timeScale: 1, seed })),
  );
}

before(async () => {
  await fleet();
  gw = await startGateway({
    endpoints: replicas.map(endpointId).join(","),
    scrapeIntervalMs: 25,
    migrateStreams: true,
    log: () => {},
  });
  await waitFor(() =>
    gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
});

after(async () => {
  await gw?.close();
  await Promise.all(replicas.map((r) => r.close()));
});

/** Streams `body` through `url`, killing the serving replica after `cutAfter` events; the raw body. */
async function streamAndKill(
  url: string,
  body: Json,
  cutAfter: number,
  headers: Record<string, string> = {},
) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  const servedId = r.headers.get("x-gateway-destination-endpoint-served");
  const victim = replicas.find((x) => endpointId(x) === servedId) as TestReplica;
  assert.ok(victim, `served by a known replica: ${servedId}`);
  const reader = (r.body as ReadableStream<Uint8Array>).getReader();
  const dec = new TextDecoder();
  let raw = "";
  let killed = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    raw += dec.decode(value, { stream: true });
    if (!killed && raw.split("\n\n").length > cutAfter) {
      killed = true;
      victim.server.crash();
    }
  }
  assert.ok(killed, "the stream was cut in the middle");
  return { raw, victim };
}

function events(raw: string): string[] {
  assert.ok(raw.endsWith("\n\n"), "the body ends at an event boundary");
  const evs = raw.slice(0, -2).split("\n\n");
  for (const e of evs) assert.match(e, /^data: /, `every event is one data line: ${e.slice(0, 80)}`);
  return evs.map((e) => e.slice(6));
}

const promptTokens = async (r: TestReplica) => {
  const text = await (await fetch(`${r.url}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^vllm:prompt_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$/gm)) n += Number(m[1]);
  return n;
};

test("a chat stream cut mid-way is resumed on the other replica as one valid SSE response", {
  timeout: 60_000,
}, async () => {
  const messages = [{ role: "user", content: "Tell me a long story about a lighthouse keeper." }];
  const { raw, victim } = await streamAndKill(
    `${gw.url}/v1/chat/completions`,
    { model: "m", messages, max_tokens: MAX, stream: true, stream_options: { include_usage: true } },
    12,
  );
  const evs = events(raw);
  assert.equal(evs.at(-1), "[DONE]");
  assert.equal(evs.filter((e) => e === "[DONE]").length, 1);
  const chunks = evs.slice(0, -1).map((e) => JSON.parse(e));
  assert.ok(!chunks.some((c) => c.error), "no error event");
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one response id throughout");
  assert.equal(new Set(chunks.map((c) => c.created)).size, 1);
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === "m"));
  assert.ok(!raw.includes("token_ids"), "the token ids the gateway asked for are not shown to the client");
  const content = chunks.filter((c) => c.choices.length > 0);
  assert.equal(content.filter((c) => c.choices[0].delta.role === "assistant").length, 1, "one role chunk");
  const finals = content.filter((c) => c.choices[0].finish_reason !== null);
  assert.equal(finals.length, 1);
  assert.equal(finals[0].choices[0].finish_reason, "length");
  assert.equal(finals[0], content.at(-1));
  const usage = chunks.at(-1).usage;
  assert.equal(usage.completion_tokens, MAX, "the whole response was generated across both replicas");
  const text = content.map((c) => c.choices[0].delta.content ?? "").join("");
  assert.ok(text.length > 0);
  const other = replicas.find((r) => r !== victim) as TestReplica;
  // The survivor was asked for the prompt plus the tokens generated before the cut: its prompt is
  // longer than the original prompt by exactly the tokens the victim produced.
  const survivorPrompt = await promptTokens(other);
  assert.ok(
    survivorPrompt > usage.prompt_tokens,
    `continuation prompt ${survivorPrompt} > ${usage.prompt_tokens}`,
  );
  assert.ok(survivorPrompt < usage.prompt_tokens + MAX);
  const m = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  assert.match(m, /kvgate_stream_migrations_total\{outcome="resumed"\} 1/);
});

test("with token ids asked for, the client sees the ids of the whole response: prompt + before + after the cut", {
  timeout: 60_000,
}, async () => {
  await Promise.all(replicas.map((r) => r.close()));
  await fleet();
  await gw.close();
  gw = await startGateway({
    endpoints: replicas.map(endpointId).join(","),
    scrapeIntervalMs: 25,
    log: () => {},
  });
  await waitFor(() =>
    gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
  const before = await Promise.all(replicas.map(promptTokens));
  const { raw, victim } = await streamAndKill(
    `${gw.url}/v1/completions`,
    { model: "m", prompt: "Once upon a time", max_tokens: MAX, stream: true, return_token_ids: true },
    15,
    { "x-kvgate-migrate": "on" },
  );
  const chunks = events(raw)
    .slice(0, -1)
    .map((e) => JSON.parse(e));
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
  const promptIds: number[] = chunks[0].choices[0].prompt_token_ids;
  assert.ok(promptIds.length > 0);
  assert.equal(chunks.filter((c) => c.choices[0]?.prompt_token_ids).length, 1, "prompt ids once");
  const ids = chunks.flatMap((c) => c.choices[0]?.token_ids ?? []);
  assert.equal(ids.length, MAX);
  assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
  const i = replicas.indexOf(replicas.find((r) => r !== victim) as TestReplica);
  const grew = (await promptTokens(replicas[i])) - before[i];
  assert.ok(
    grew > promptIds.length && grew < promptIds.length + MAX,
    `the survivor's prompt: ${grew} tokens`,
  );
});

test("without migration the cut ends in a clean SSE error event", { timeout: 60_000 }, async () => {
  await Promise.all(replicas.map((r) => r.close()));
  await fleet();
  await gw.close();
  gw = await startGateway({
    endpoints: replicas.map(endpointId).join(","),
    scrapeIntervalMs: 25,
    log: () => {},
  });
  await waitFor(() =>
    gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
  const { raw } = await streamAndKill(
    `${gw.url}/v1/completions`,
    { model: "m", prompt: "Once upon a time", max_tokens: MAX, stream: true },
    10,
  );
  const evs = events(raw);
  assert.equal(evs.at(-1), "[DONE]");
  const last = JSON.parse(evs.at(-2) as string);
  assert.match(last.error.message, /failed mid-response/);
  assert.ok(!evs.slice(0, -2).some((e) => e.includes('"error"')));
});
