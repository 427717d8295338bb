/**
 * The simulated replica's --stream-interval (vLLM's, vllm/v1/engine/output_processor.py): a stream's
 * first token goes out at once, then each chunk waits until it carries that many new tokens, and the
 * last chunk flushes whatever is held. The text, token ids and usage are those of a per-token stream.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { resolveReplicaOptions } from "../src/sim/replica-options.ts";
import { type Json, parseSse, postJson, startTestReplica, type TestReplica } from "./helpers/replica.ts";

let every: TestReplica;
let byFour: TestReplica;
before(async () => {
  every = await startTestReplica();
  byFour = await startTestReplica({ streamInterval: 4 });
});
after(async () => {
  await every.close();
  await byFour.close();
});

const BODY = {
  prompt: "Tell me about the quick brown fox.",
  max_tokens: 11,
  ignore_eos: true,
  seed: 7,
  stream: true,
  return_token_ids: true,
  stream_options: { include_usage: true },
};

/** The content chunks of a stream (the usage chunk and [DONE] dropped). */
async function chunksOf(r: TestReplica, path: string, body: Record<string, unknown>): Promise<Json[]> {
  const res = await postJson(`${r.url}${path}`, body);
  assert.equal(res.status, 200);
  const ev = parseSse(res.text);
  assert.equal(ev.at(-1), "[DONE]");
  assert.equal(ev.at(-2).usage.completion_tokens, body["max_tokens"]);
  return ev.slice(0, -2);
}

describe("--stream-interval", () => {
  test("completions: the first token alone, then 4 per chunk, the rest in the last", async () => {
    const one = await chunksOf(every, "/v1/completions", BODY);
    const four = await chunksOf(byFour, "/v1/completions", BODY);
    assert.deepEqual(
      one.map((c) => c.choices[0].token_ids.length),
      Array(11).fill(1),
    );
    assert.deepEqual(
      four.map((c) => c.choices[0].token_ids.length),
      [1, 4, 4, 2],
    );
    assert.deepEqual(
      four.map((c) => c.choices[0].finish_reason),
      [null, null, null, "length"],
    );
    const ids = (cs: Json[]) => cs.flatMap((c) => c.choices[0].token_ids);
    const text = (cs: Json[]) => cs.map((c) => c.choices[0].text).join("");
    assert.deepEqual(ids(four), ids(one), "the same tokens, only grouped");
    assert.equal(text(four), text(one));
  });

  test("chat: the role chunk, then the same grouping of the content", async () => {
    const body = { ...BODY, prompt: undefined, messages: [{ role: "user", content: "Hi there" }] };
    const one = await chunksOf(every, "/v1/chat/completions", body);
    const four = await chunksOf(byFour, "/v1/chat/completions", body);
    assert.equal(four[0].choices[0].delta.role, "assistant");
    const content = (cs: Json[]) => cs.slice(1);
    assert.deepEqual(
      content(four).map((c) => c.choices[0].token_ids.length),
      [1, 4, 4, 2],
    );
    const text = (cs: Json[]) =>
      content(cs)
        .map((c) => c.choices[0].delta.content)
        .join("");
    assert.equal(text(four), text(one));
  });

  test("an interval of 0 or a fraction is refused with the flag's name", async () => {
    await assert.rejects(resolveReplicaOptions({ streamInterval: 0 }), /--stream-interval/);
    await assert.rejects(resolveReplicaOptions({ streamInterval: 2.5 }), /--stream-interval/);
  });
});
