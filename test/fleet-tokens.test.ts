/**
 * The simulator's chunked, cached prompt tokenization equals whole-text encoding by the sim
 * tokenizer, as the replicas do it (completions with BOS, chat via the template without), on every
 * workload generator's prompts and on adversarial text, at chunk sizes that force many splits.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";

const whole = createSimTokenizer();
const CHUNKS = [16, 37, 1024];

const SPECS = [
  { preset: "smoke" },
  {
    workload: "shared-prefix",
    numRequests: 40,
    options: { numGroups: 3, systemPromptLen: 300, api: "chat" },
  },
  {
    workload: "shared-prefix",
    numRequests: 40,
    options: { numGroups: 3, systemPromptLen: 300, api: "completion" },
  },
  { workload: "multi-turn", numRequests: 6, options: { turns: 3, questionLen: 40, outputLen: 8 } },
  { workload: "mixed-length", numRequests: 20, options: { shortLen: 30, longLen: 400, documentPool: 3 } },
  { workload: "random", numRequests: 20, options: { inputLen: { mean: 200, std: 50 } } },
] as const;

const ODD = [
  "plain words and  double  spaces   here",
  " leading space, trailing space ",
  "<|im_start|>user\nhi <|im_end|>\n <|im_start|> x",
  "punctuation!!!??? ... --- ((( ))) a<|b |> c<| d",
  "tabs\tand\nnewlines \n\n words\t \tend",
  "ünïcödé wörds and 😀 emoji 😀😀 pairs",
  "loooooooooooooooooooongword aaaaaaaaaaaaaaaaaaaaaaa b",
  "x",
  "",
];

describe("chunked prompt tokenization", () => {
  for (const spec of SPECS)
    it(`matches whole-text encoding: ${"preset" in spec ? spec.preset : `${spec.workload} ${JSON.stringify(spec.options)}`}`, () => {
      const w = generateWorkload(spec as never);
      for (const chunkChars of CHUNKS) {
        const pt = new PromptTokenizer({ chunkChars, maxChunks: 50 });
        for (const r of w.requests) {
          const got = r.kind === "chat" ? pt.chat(r.messages ?? []) : pt.completion(r.prompt ?? "");
          const want =
            r.kind === "chat"
              ? whole.encode(whole.applyChatTemplate(r.messages ?? [], { addGenerationPrompt: true }), false)
              : whole.encode(r.prompt ?? "", true);
          assert.deepEqual(got, want, `${r.id} at chunkChars ${chunkChars}`);
        }
        assert.ok(pt.hits + pt.misses > 0);
      }
    });

  it("matches on adversarial text (markers, whitespace runs, unicode, long words)", () => {
    for (const chunkChars of CHUNKS) {
      const pt = new PromptTokenizer({ chunkChars });
      for (const a of ODD)
        for (const b of ODD) {
          const text = `${a} ${b}${a}`;
          assert.deepEqual(pt.completion(text), whole.encode(text, true), JSON.stringify(text));
        }
    }
  });

  it("reuses the chunks of a shared prefix", () => {
    const pt = new PromptTokenizer({ chunkChars: 64 });
    const system = Array.from({ length: 400 }, (_, i) => `w${i % 97}`).join(" ");
    pt.completion(`${system} first question`);
    const misses = pt.misses;
    pt.completion(`${system} another question entirely`);
    assert.ok(pt.misses - misses <= 2, `only the tail is new (${pt.misses - misses} misses)`);
  });
});
