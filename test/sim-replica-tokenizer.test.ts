/**
 * `--tokenizer DIR`: the replica loads a Hugging Face tokenizer.json offline and uses it for prompts,
 * the chat template, /tokenize and generated text; generated ids stay inside its vocabulary and EOS
 * is the tokenizer's. The fixture is a tiny character-level BPE written to a temp dir.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { postJson, startTestReplica } from "./helpers/replica.ts";
import { addedTokens, bpeModel, SPECIAL_TOKENS, writeTokenizerDir } from "./helpers/tokenizer-fixtures.ts";

const PIECES = [..."abcdefghijklmnopqrstuvwxyz", "he", "hel", "hell", "hello"];
const VOCAB = Object.fromEntries([...SPECIAL_TOKENS, ...PIECES].map((t, i) => [t, i]));

function writeFixture(dir: string): void {
  const tokenizer = {
    version: "1.0",
    added_tokens: addedTokens(),
    normalizer: null,
    pre_tokenizer: { type: "Whitespace" },
    post_processor: null,
    decoder: null,
    model: bpeModel(VOCAB, ["h e", "he l", "hel l", "hell o"]),
  };
  const config = {
    name_or_path: "tiny-chars",
    eos_token: "<|im_end|>",
    chat_template:
      "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}" +
      "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}",
  };
  writeTokenizerDir(dir, tokenizer, config);
}

test("--tokenizer DIR drives tokenization, the chat template and generated ids", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-hf-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFixture(dir);
  const r = await startTestReplica({ tokenizer: dir });
  t.after(() => r.close());
  assert.equal(r.server.opts.tokenizer.name, "tiny-chars");

  const tk = await postJson(`${r.url}/tokenize`, { prompt: "hello ab", add_special_tokens: false });
  assert.deepEqual(tk.body.tokens, [VOCAB.hello, VOCAB.a, VOCAB.b]);
  const chat = await postJson(`${r.url}/tokenize`, { messages: [{ role: "user", content: "hi" }] });
  assert.equal(chat.body.tokens[0], VOCAB["<|im_start|>"]);

  const res = await postJson(`${r.url}/v1/completions`, {
    prompt: "hello",
    max_tokens: 20,
    ignore_eos: true,
    return_token_ids: true,
  });
  assert.equal(res.status, 200);
  const out: number[] = res.body.choices[0].token_ids;
  assert.equal(out.length, 20);
  const vocabSize = Object.keys(VOCAB).length;
  for (const id of out) assert.ok(id >= 0 && id < vocabSize, `id ${id} outside the vocabulary`);
  assert.ok(res.body.choices[0].text.length > 0);

  const natural = await postJson(`${r.url}/v1/completions`, {
    prompt: "hello",
    max_tokens: 2000,
    seed: 5,
    return_token_ids: true,
  });
  const ids: number[] = natural.body.choices[0].token_ids;
  assert.equal(natural.body.choices[0].finish_reason, "stop");
  assert.equal(ids.at(-1), VOCAB["<|im_end|>"], "a natural stop ends on the tokenizer's EOS");
  assert.ok(!natural.body.choices[0].text.includes("<|im_end|>"), "EOS is not in the text");
});

test("--tokenizer with a missing directory is an option error naming the flag", async () => {
  await assert.rejects(startTestReplica({ tokenizer: join(tmpdir(), "kvgate-no-such-dir") }), /--tokenizer/);
});
