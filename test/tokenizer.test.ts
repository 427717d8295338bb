// Tests for the two Tokenizer implementations: the deterministic simulator tokenizer
// (src/engine/sim-tokenizer.ts) and the offline Hugging Face loader (src/datalayer/hf-tokenizer.ts).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { loadHfTokenizer } from "../src/datalayer/hf-tokenizer.ts";
import {
  createSimTokenizer,
  SIM_BOS_ID,
  SIM_RESERVED_IDS,
  SIM_SPECIAL_TOKENS,
  simPieces,
} from "../src/engine/sim-tokenizer.ts";
import { rng } from "./helpers/rng.ts";
import { addedTokens, BOS_POST_PROCESSOR, bpeModel, SPECIAL_TOKENS } from "./helpers/tokenizer-fixtures.ts";

const PROSE = `The gateway routes each request to the replica that already holds its prefix in the KV cache,
unless that replica is saturated. In that case it picks the least loaded one, and the prefix is computed
again. Prefix caching in vLLM works on blocks of sixteen tokens: a request whose first blocks match blocks
already in the cache skips their prefill. It was the best of times, it was the worst of times, it was the
age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.`;

// Atoms for random texts: words, spacing, punctuation, non-ASCII, markers and marker fragments.
const ATOMS = [
  "the", " cat", "sat", "extraordinarily", " on", "mat", "x", "42", "_id", " ", "  ", "\n", "\t", "\r\n",
  ".", ",", "!?", "()", "<", "|", ">", "<|", "é", "漢字", "😀", "naïve", "<|im_start|>", "<|im_end|>",
  "<|endoftext|>", "{\"k\": [1, 2]}",
]; // biome-ignore format: one table

function randomText(r: () => number, maxAtoms: number): string {
  let s = "";
  const n = Math.floor(r() * maxAtoms);
  for (let i = 0; i < n; i++) s += ATOMS[Math.floor(r() * ATOMS.length)];
  return s;
}

const MARKERS = Object.keys(SIM_SPECIAL_TOKENS);
/** True if a special marker in A+B straddles the end of A (the documented exception). */
function markerStraddles(a: string, b: string): boolean {
  const ab = a + b;
  return MARKERS.some((m) => {
    for (let i = ab.indexOf(m); i >= 0; i = ab.indexOf(m, i + 1))
      if (i < a.length && i + m.length > a.length) return true;
    return false;
  });
}

// FNV-1a 32-bit reference vectors (http://www.isthe.com/chongo/tech/comp/fnv/): "a", "foobar".
test("sim: ids are FNV-1a of the piece, the same in a fresh instance and in another process", () => {
  const t = createSimTokenizer();
  const span = 128256 - SIM_RESERVED_IDS;
  assert.deepEqual(t.encode("a", false), [SIM_RESERVED_IDS + (0xe40c292c % span)]);
  assert.deepEqual(t.encode("foobar", false), [SIM_RESERVED_IDS + (0xbf9cf968 % span)]);
  assert.equal(t.vocabSize, 128256);
  const texts = [PROSE, "漢字 😀 naïve <|im_start|>user\nhi", ""];
  const fresh = createSimTokenizer();
  for (const x of texts) assert.deepEqual(fresh.encode(x), t.encode(x));
  const script = `import { createSimTokenizer } from "./src/engine/sim-tokenizer.ts";
    const t = createSimTokenizer();
    process.stdout.write(JSON.stringify(${JSON.stringify(texts)}.map((x) => t.encode(x))));`;
  const out = execFileSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
    cwd: join(import.meta.dirname, ".."),
    encoding: "utf8",
  });
  assert.deepEqual(
    JSON.parse(out),
    texts.map((x) => t.encode(x)),
  );
});

test("sim: about 4 characters per token on English prose, 32k characters at once included", () => {
  const t = createSimTokenizer();
  const ratio = PROSE.length / t.encode(PROSE, false).length;
  assert.ok(ratio >= 3.5 && ratio <= 5, `chars/token ${ratio}`);
  const big = PROSE.repeat(Math.ceil(32768 / PROSE.length)).slice(0, 32768);
  // 32k characters of the same prose encode at the same ratio.
  const bigRatio = big.length / t.encode(big, false).length;
  assert.ok(Math.abs(bigRatio - ratio) < 0.1, `chars/token ${bigRatio} against ${ratio}`);
});

test("property: ids(A) is a prefix of ids(A+B) except possibly A's last token", () => {
  const t = createSimTokenizer();
  let checked = 0;
  for (let seed = 1; seed <= 3000; seed++) {
    const r = rng(seed);
    const a = randomText(r, 12);
    const b = randomText(r, 12);
    if (markerStraddles(a, b)) continue;
    checked++;
    const ia = t.encode(a);
    const iab = t.encode(a + b);
    const keep = Math.max(1, ia.length - 1); // BOS always stays
    assert.deepEqual(iab.slice(0, keep), ia.slice(0, keep), `seed ${seed}: ${JSON.stringify([a, b])}`);
    // Cutting at an arbitrary code unit, not only at atom boundaries.
    const ab = a + b;
    const cut = Math.floor(r() * (ab.length + 1));
    const [p, q] = [ab.slice(0, cut), ab.slice(cut)];
    if (markerStraddles(p, q)) continue;
    const ip = t.encode(p, false);
    assert.deepEqual(
      iab.slice(1, ip.length),
      ip.slice(0, -1),
      `seed ${seed} cut ${cut}: ${JSON.stringify(ab)}`,
    );
  }
  assert.ok(checked > 2500);
});

test("sim: ids in range, segmentation lossless, decode(encode(x)) === x", () => {
  const small = createSimTokenizer({ vocabSize: 1000 });
  const wide = createSimTokenizer({ vocabSize: 2 ** 32, bos: false }); // collisions practically impossible
  for (let seed = 1; seed <= 500; seed++) {
    const r = rng(seed);
    let x = randomText(r, 40);
    for (let k = Math.floor(r() * 10); k > 0; k--) x += String.fromCodePoint(Math.floor(r() * 0x2ffff));
    assert.equal(simPieces(x).join(""), x);
    for (const id of small.encode(x)) assert.ok(Number.isInteger(id) && id >= 0 && id < 1000, `${id}`);
    assert.equal(wide.decode(wide.encode(x)), x, `seed ${seed}`);
  }
  const t = createSimTokenizer();
  assert.equal(t.decode(t.encode(PROSE, false)), PROSE);
  assert.equal(t.decode(t.encode("hi", true)), "<|begin_of_text|>hi");
  assert.ok(simPieces(PROSE).every((p) => p.length <= 7));
});

test("sim: decode of arbitrary ids never throws; unseen ids give readable pseudo-words", () => {
  const t = createSimTokenizer();
  const r = rng(99);
  for (let k = 0; k < 5000; k++) {
    const ids = Array.from(
      { length: Math.floor(r() * 8) },
      () => [Math.floor(r() * 128256), -1, 128256, 2 ** 40, 1.5, Number.NaN][Math.floor(r() ** 4 * 6)],
    ) as number[];
    assert.equal(typeof t.decode(ids), "string");
  }
  const words = t.decode([1000, 2000, 3000]);
  assert.match(words, /^( [a-z]+){3}$/);
  assert.equal(t.decode([1000]), createSimTokenizer().decode([1000]));
  assert.equal(t.decode([-1, 128256, 0.5]), "");
  assert.equal(t.decode([t.eosTokenId]), "<|endoftext|>");
  assert.ok(t.eosTokenId < SIM_RESERVED_IDS);
  assert.equal(t.decode(null as unknown as number[]), "");
});

test("sim: chat template has role markers, the generation prompt, and special ids", () => {
  const t = createSimTokenizer();
  const msgs = [
    { role: "system", content: "Be brief." },
    {
      role: "user",
      content: [{ type: "text", text: "hi " }, { type: "image_url" }, { type: "text", text: "there" }],
    },
  ];
  const p = t.applyChatTemplate(msgs);
  assert.ok(p.startsWith("<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"));
  assert.ok(p.includes("<|im_start|>user\nhi there<|im_end|>\n"));
  assert.ok(p.endsWith("<|im_end|>\n<|im_start|>assistant\n"));
  assert.ok(t.applyChatTemplate(msgs, { addGenerationPrompt: false }).endsWith("there<|im_end|>\n"));
  const ids = t.encode(p, false);
  assert.equal(ids[0], SIM_BOS_ID);
  assert.equal(ids[1], SIM_SPECIAL_TOKENS["<|im_start|>"]);
  assert.equal(ids.filter((id) => id === SIM_SPECIAL_TOKENS["<|im_end|>"]).length, 2);
  assert.equal(ids.filter((id) => id === SIM_SPECIAL_TOKENS["<|im_start|>"]).length, 3);
  assert.equal(t.decode(ids), p);
  // A longer conversation shares the earlier one's prompt ids up to its generation prompt.
  const next = t.encode(t.applyChatTemplate([...msgs, { role: "assistant", content: "Hello." }]), false);
  assert.deepEqual(next.slice(0, ids.length), ids);
  const noBos = createSimTokenizer({ bos: false });
  assert.ok(noBos.applyChatTemplate(msgs).startsWith("<|im_start|>system"));
  assert.notEqual(noBos.encode("hi", true)[0], SIM_BOS_ID);
  assert.throws(() => createSimTokenizer({ vocabSize: 10 }), RangeError);
});

// ---- Hugging Face tokenizer, from a tiny BPE fixture written to a temp dir ----

const CHARS = "abcdefghijklmnopqrstuvwxyz";
const MERGED = ["he", "ll", "hell", "hello", "wo", "wor", "worl", "world"];
const VOCAB: Record<string, number> = {};
for (const tok of [...SPECIAL_TOKENS, ...CHARS, ...MERGED]) VOCAB[tok] = Object.keys(VOCAB).length;
const TOKENIZER_JSON = {
  version: "1.0",
  added_tokens: addedTokens(),
  normalizer: null,
  pre_tokenizer: { type: "Whitespace" },
  post_processor: BOS_POST_PROCESSOR,
  decoder: null,
  model: bpeModel(VOCAB, ["h e", "l l", "he ll", "hell o", "w o", "wo r", "wor l", "worl d"]),
};
const TEMPLATE =
  "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const CONFIG = {
  name_or_path: "tiny-bpe",
  bos_token: "<s>",
  eos_token: { content: "<|im_end|>", special: true },
  chat_template: TEMPLATE,
};

async function fixtureDir(files: Record<string, unknown>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "kvgate-tok-"));
  for (const [name, body] of Object.entries(files)) {
    await writeFile(join(dir, name), typeof body === "string" ? body : JSON.stringify(body));
  }
  return dir;
}

test("hf: loads offline, encodes with and without BOS, decodes, renders the chat template", async (t) => {
  const dir = await fixtureDir({ "tokenizer.json": TOKENIZER_JSON, "tokenizer_config.json": CONFIG });
  t.after(() => rm(dir, { recursive: true, force: true }));
  const tok = await loadHfTokenizer(dir);
  assert.equal(tok.name, "tiny-bpe");
  assert.equal(tok.eosTokenId, 4);
  assert.equal(tok.vocabSize, Object.keys(VOCAB).length);
  const hw = [VOCAB.hello, VOCAB.world];
  assert.deepEqual(tok.encode("hello world"), [1, ...hw]);
  assert.deepEqual(tok.encode("hello world", false), hw);
  assert.deepEqual(tok.encode("held", false), [VOCAB.he, VOCAB.l, VOCAB.d]);
  assert.equal(tok.decode(hw), "hello world");
  assert.equal(tok.decode([]), "");
  assert.equal(tok.decode([99999, -1]), "");

  const prompt = tok.applyChatTemplate([
    { role: "system", content: "be brief" },
    { role: "user", content: [{ type: "text", text: "hello" }] },
  ]);
  assert.equal(
    prompt,
    "<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
  );
  const ids = tok.encode(prompt, false);
  assert.deepEqual(ids.slice(0, 3), [1, 3, VOCAB.s]);
  const assistant = [..."assistant"].map((c) => VOCAB[c]);
  assert.deepEqual(ids.slice(-11), [4, 3, ...assistant]);
  assert.equal(ids.filter((id) => id === 4).length, 2);
  assert.ok(
    tok
      .applyChatTemplate([{ role: "user", content: "hi" }], { addGenerationPrompt: false })
      .endsWith("hi<|im_end|>\n"),
  );

  // Same files through explicit paths.
  const viaPaths = await loadHfTokenizer({
    tokenizerJsonPath: join(dir, "tokenizer.json"),
    tokenizerConfigPath: join(dir, "tokenizer_config.json"),
  });
  assert.deepEqual(viaPaths.encode("hello world"), [1, ...hw]);
});

test("hf: chat_template.jinja and generation_config.json fallbacks; no template is a clear error", async (t) => {
  const { chat_template: _, eos_token: __, ...bare } = CONFIG;
  const dir = await fixtureDir({
    "tokenizer.json": TOKENIZER_JSON,
    "tokenizer_config.json": bare,
    "chat_template.jinja": TEMPLATE,
    "generation_config.json": { eos_token_id: [2, 4] },
  });
  const plain = await fixtureDir({
    "tokenizer.json": TOKENIZER_JSON,
    "generation_config.json": { eos_token_id: 2 },
  });
  t.after(() => Promise.all([rm(dir, { recursive: true }), rm(plain, { recursive: true })]));
  const tok = await loadHfTokenizer(dir);
  assert.equal(tok.eosTokenId, 2);
  assert.ok(tok.applyChatTemplate([{ role: "user", content: "x" }]).endsWith("<|im_start|>assistant\n"));
  await writeFile(join(dir, "custom.jinja"), "custom:{{ messages|length }}");
  const paths = {
    tokenizerJsonPath: join(dir, "tokenizer.json"),
    tokenizerConfigPath: join(dir, "tokenizer_config.json"),
  };
  const custom = await loadHfTokenizer({ ...paths, chatTemplatePath: join(dir, "custom.jinja") });
  assert.equal(custom.applyChatTemplate([{ role: "user", content: "x" }, { role: "user" }]), "custom:2");
  const absent = join(dir, "absent.jinja");
  await assert.rejects(
    loadHfTokenizer({ ...paths, chatTemplatePath: absent }),
    (e: Error) => e.message.includes(absent) && e.message.endsWith("; check the path"),
  );
  const noTemplate = await loadHfTokenizer(plain);
  assert.throws(() => noTemplate.applyChatTemplate([{ role: "user", content: "x" }]), /no chat template/);
});

test("hf: missing or invalid files give errors naming the path", async (t) => {
  const dir = await fixtureDir({ "tokenizer.json": "{ not json", "other.json": { model: 1 } });
  t.after(() => rm(dir, { recursive: true, force: true }));
  const missing = join(dir, "nope");
  await assert.rejects(
    loadHfTokenizer(missing),
    (e: Error) =>
      e.message.includes(join(missing, "tokenizer.json")) &&
      e.message.endsWith("; give --tokenizer a directory holding tokenizer.json, or leave --tokenizer out"),
  );
  await assert.rejects(
    loadHfTokenizer(dir),
    (e: Error) => /not valid JSON/.test(e.message) && e.message.includes(dir),
  );
  await assert.rejects(loadHfTokenizer({ tokenizerJsonPath: join(dir, "other.json") }), (e: Error) =>
    e.message.includes(join(dir, "other.json")),
  );
  const good = await fixtureDir({ "tokenizer.json": TOKENIZER_JSON });
  t.after(() => rm(good, { recursive: true, force: true }));
  const cfg = join(good, "missing_config.json");
  await assert.rejects(
    loadHfTokenizer({ tokenizerJsonPath: join(good, "tokenizer.json"), tokenizerConfigPath: cfg }),
    (e: Error) => e.message.includes(cfg),
  );
  // No eos_token and no generation_config.json.
  await assert.rejects(loadHfTokenizer(good), /no EOS token id/);
});
