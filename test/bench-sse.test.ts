// Reading streamed responses: SSE event splitting across arbitrary byte boundaries (including
// inside a UTF-8 character), and the interpretation of chat, completion, usage and error payloads.
import assert from "node:assert/strict";
import { test } from "node:test";
import { interpretPayload, SseSplitter } from "../src/bench/sse.ts";

test("events split at every possible byte boundary give the same payloads", () => {
  const text =
    'data: {"a":"é"}\n\n: comment\ndata: line1\ndata: line2\r\n\r\nevent: x\ndata: {"b":2}\n\ndata: [DONE]\n\n';
  const bytes = new TextEncoder().encode(text);
  const expected = ['{"a":"é"}', "line1\nline2", '{"b":2}', "[DONE]"];
  for (let cut = 0; cut <= bytes.length; cut++) {
    const s = new SseSplitter();
    const got = [...s.push(bytes.subarray(0, cut)), ...s.push(bytes.subarray(cut)), ...s.end()];
    assert.deepEqual(got, expected, `cut at ${cut}`);
  }
});

test("an unterminated last event is flushed at end of stream", () => {
  const s = new SseSplitter();
  assert.deepEqual(s.push(new TextEncoder().encode("data: x")), []);
  assert.deepEqual(s.end(), ["x"]);
});

test("chat deltas, completion text, usage with cached tokens, token_ids, errors and [DONE]", () => {
  assert.deepEqual(interpretPayload('{"choices":[{"delta":{"role":"assistant","content":""}}]}', "chat"), {
    text: "",
  });
  assert.deepEqual(interpretPayload('{"choices":[{"delta":{"content":"hi"}}],"usage":null}', "chat"), {
    text: "hi",
  });
  assert.deepEqual(interpretPayload('{"choices":[{"text":" yo","token_ids":[5,6]}]}', "completion"), {
    text: " yo",
    tokenIds: 2,
  });
  assert.deepEqual(
    interpretPayload(
      '{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}}',
      "completion",
    ),
    { usage: { promptTokens: 9, completionTokens: 4, cachedTokens: 8 } },
  );
  assert.deepEqual(interpretPayload(" [DONE]", "chat"), { done: true });
  assert.equal(interpretPayload('{"error":{"message":"boom","code":500}}', "chat").error, "boom");
  assert.equal(interpretPayload('{"object":"error","message":"old style"}', "chat").error, "old style");
  assert.match(interpretPayload("{nope", "chat").error!, /unparsable/);
});
