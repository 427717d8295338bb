/**
 * The official `openai` npm client against the simulated replica: streamed and non-streamed chat and
 * completions parse without errors and carry the expected content, finish reasons and usage.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { startTestReplica, type TestReplica } from "./helpers/replica.ts";

let r: TestReplica;
let client: OpenAI;
before(async () => {
  r = await startTestReplica({ servedModelName: "sim-model" });
  client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30_000 });
});
after(() => r.close());

test("chat, non-streamed", async () => {
  const res = await client.chat.completions.create({
    model: "sim-model",
    messages: [{ role: "user", content: "Hello there" }],
    max_completion_tokens: 8,
    // vLLM extra fields go through the client untouched.
    ...({ ignore_eos: true } as object),
  });
  assert.equal(res.object, "chat.completion");
  assert.equal(res.choices[0]!.message.role, "assistant");
  assert.ok((res.choices[0]!.message.content ?? "").length > 0);
  assert.equal(res.choices[0]!.finish_reason, "length");
  assert.equal(res.usage!.completion_tokens, 8);
  assert.equal(typeof res.usage!.prompt_tokens_details!.cached_tokens, "number");
});

test("chat, streamed with usage", async () => {
  const stream = await client.chat.completions.create({
    model: "sim-model",
    messages: [{ role: "user", content: "Stream please" }],
    max_tokens: 6,
    stream: true,
    stream_options: { include_usage: true },
    ...({ ignore_eos: true } as object),
  });
  let text = "";
  let role: string | undefined;
  let finish: string | null = null;
  let usage: OpenAI.CompletionUsage | null | undefined;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.delta.role) role = c.delta.role;
    text += c?.delta.content ?? "";
    if (c?.finish_reason) finish = c.finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(role, "assistant");
  assert.ok(text.length > 0);
  assert.equal(finish, "length");
  assert.equal(usage?.completion_tokens, 6);
});

test("completions, non-streamed and streamed", async () => {
  const res = await client.completions.create({
    model: "sim-model",
    prompt: "Once upon a time",
    max_tokens: 5,
    seed: 9,
    ...({ ignore_eos: true } as object),
  });
  assert.equal(res.object, "text_completion");
  assert.equal(res.choices[0]!.finish_reason, "length");
  assert.equal(res.usage!.completion_tokens, 5);
  const stream = await client.completions.create({
    model: "sim-model",
    prompt: "Once upon a time",
    max_tokens: 5,
    seed: 9,
    stream: true,
    ...({ ignore_eos: true } as object),
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
  assert.equal(text, res.choices[0]!.text, "same seed, same text, streamed or not");
});

test("errors surface as the client's typed errors", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }),
    (e: unknown) => e instanceof OpenAI.NotFoundError && /does not exist/.test(e.message),
  );
  await assert.rejects(
    client.completions.create({ model: "sim-model", prompt: "x", max_tokens: 0 }),
    (e: unknown) => e instanceof OpenAI.BadRequestError,
  );
  const models = await client.models.list();
  assert.deepEqual(
    models.data.map((m) => m.id),
    ["sim-model"],
  );
});
