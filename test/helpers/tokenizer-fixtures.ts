/**
 * Tiny Hugging Face tokenizer.json fixtures (BPE over a handful of pieces) for tests that load a real
 * tokenizer offline: the added special tokens, the BOS post-processor, the ChatML template, and a
 * writer for a tokenizer directory.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";

export const SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];

/** SPECIAL_TOKENS as tokenizer.json added_tokens, ids 0..4. */
export function addedTokens() {
  return SPECIAL_TOKENS.map((content, id) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
}

/** Prepends <s> (id 1) to every encoded sequence. */
export const BOS_POST_PROCESSOR = {
  type: "TemplateProcessing",
  single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
  pair: [
    { SpecialToken: { id: "<s>", type_id: 0 } },
    { Sequence: { id: "A", type_id: 0 } },
    { Sequence: { id: "B", type_id: 1 } },
  ],
  special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
};

export const CHATML_TEMPLATE =
  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/** A BPE model section. */
export function bpeModel(vocab: Record<string, number>, merges: string[], unkToken: string | null = "<unk>") {
  return {
    type: "BPE",
    dropout: null,
    unk_token: unkToken,
    continuing_subword_prefix: null,
    end_of_word_suffix: null,
    fuse_unk: false,
    byte_fallback: false,
    vocab,
    merges,
  };
}

/** Writes tokenizer.json and tokenizer_config.json into `dir`. */
export function writeTokenizerDir(dir: string, tokenizer: unknown, config: unknown): void {
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config));
}
