/**
 * The shared-prefix workload, after inference-perf's `shared_prefix` generator
 * (kubernetes-sigs/inference-perf inference_perf/datagen/synthetic/shared_prefix_datagen.py):
 * num_groups system prompts, num_prompts_per_group questions per group, prompt = system prompt +
 * " " + question; the G·P prompts are permuted once with the seed and then cycled in that order.
 * Differences: text is seeded pseudo-words (no tokenizer needed) and each group's prompt starts
 * with a 4-word head no other group has, so groups never share a first KV block.
 */
import type { RequestBody } from "./arrivals.ts";
import { checkLength, type LengthDist, permutation, type Rng, sampleLength, streamRng } from "./sampling.ts";
import { joinText, randomWords, WORDS } from "./text.ts";
import type { RequestKind } from "./types.ts";

export interface SharedPrefixOptions {
  numGroups: number;
  promptsPerGroup: number;
  /** Tokens of each group's system prompt (0: no shared prefix). */
  systemPromptLen: LengthDist;
  questionLen: LengthDist;
  outputLen: LengthDist;
  /** inference-perf's shared_prefix guide profiles use completions. */
  api: RequestKind;
  /**
   * "permuted": inference-perf's order (prompts permuted once, then cycled). "interleaved": request
   * i uses group i mod G and that group's question ⌊i/G⌋ mod P, so closed-loop user u (who gets
   * requests u, u+U, … with U = G users) always sends group u.
   */
  order: "permuted" | "interleaved";
}

export const SHARED_PREFIX_DEFAULTS: SharedPrefixOptions = {
  numGroups: 10,
  promptsPerGroup: 10,
  systemPromptLen: 1000,
  questionLen: 100,
  outputLen: 100,
  api: "completion",
  order: "permuted",
};

/** Words in the group-unique head of each system prompt. */
export const HEAD_WORDS = 4;

interface Prompt {
  body: RequestBody;
}

/**
 * Draws a head no earlier group used, whose first word is also new while unused words remain
 * (1,620 of them), so groups differ from their very first token.
 */
function uniqueHead(rng: Rng, words: number, seen: Set<string>, firsts: Set<string>): string {
  for (let tries = 0; ; tries++) {
    const head = randomWords(rng, words);
    const first = head.slice(0, 3);
    const freshFirst = !firsts.has(first) || firsts.size >= WORDS.length;
    if ((!seen.has(head) && freshFirst) || tries > 100_000) {
      seen.add(head);
      firsts.add(first);
      return head;
    }
  }
}

/** Builds the G·P distinct prompts in group order (before permutation). */
export function buildSharedPrefixPrompts(o: SharedPrefixOptions, seed: number): Prompt[] {
  for (const [k, v] of [
    ["numGroups", o.numGroups],
    ["promptsPerGroup", o.promptsPerGroup],
  ] as const)
    if (!Number.isInteger(v) || v < 1) throw new RangeError(`shared-prefix.${k} must be an integer ≥ 1`);
  checkLength("shared-prefix.systemPromptLen", o.systemPromptLen, true);
  checkLength("shared-prefix.questionLen", o.questionLen);
  checkLength("shared-prefix.outputLen", o.outputLen);
  const lenRng = streamRng(seed, "shared-prefix:lengths");
  const textRng = streamRng(seed, "shared-prefix:text");
  const heads = new Set<string>();
  const firsts = new Set<string>();
  const prompts: Prompt[] = [];
  for (let g = 0; g < o.numGroups; g++) {
    const sysLen =
      typeof o.systemPromptLen === "number" ? o.systemPromptLen : sampleLength(lenRng, o.systemPromptLen);
    const headLen = Math.min(HEAD_WORDS, sysLen);
    const system = joinText(
      uniqueHead(textRng, headLen, heads, firsts),
      randomWords(textRng, sysLen - headLen),
    );
    for (let p = 0; p < o.promptsPerGroup; p++) {
      const qLen = sampleLength(lenRng, o.questionLen);
      const outLen = sampleLength(lenRng, o.outputLen);
      const question = randomWords(textRng, qLen);
      const common = {
        promptTokensApprox: sysLen + qLen,
        maxTokens: outLen,
        groupId: g,
        prefixTokens: sysLen,
      };
      const body: RequestBody =
        o.api === "chat"
          ? {
              kind: "chat",
              messages: [
                ...(system ? [{ role: "system", content: system }] : []),
                { role: "user", content: question },
              ],
              ...common,
            }
          : { kind: "completion", prompt: joinText(system, question), ...common };
      prompts.push({ body });
    }
  }
  return prompts;
}

/**
 * n requests (one per unit): the prompts permuted once with the seed, then cycled. Cycled
 * requests share their text and message objects; callers must not mutate them.
 */
export function generateSharedPrefix(o: SharedPrefixOptions, seed: number, n: number): RequestBody[][] {
  const prompts = buildSharedPrefixPrompts(o, seed);
  const { numGroups: g, promptsPerGroup: p } = o;
  const order =
    o.order === "interleaved"
      ? Array.from({ length: g * p }, (_, i) => (i % g) * p + (Math.floor(i / g) % p))
      : permutation(streamRng(seed, "shared-prefix:order"), prompts.length);
  const units: RequestBody[][] = new Array(n);
  for (let i = 0; i < n; i++) units[i] = [prompts[order[i % order.length]].body];
  return units;
}
