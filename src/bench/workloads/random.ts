/**
 * Random prompts with no shared prefixes, lengths from clipped normal distributions (as
 * inference-perf's `random` data type: mean, std, min, max). Each prompt is a fresh 16-word head,
 * unique within the workload, followed by a slice of a seeded text pool: one unique first block
 * means no block of the prompt is shared, while long prompts cost no generation time.
 */
import type { RequestBody } from "./arrivals.ts";
import { checkLength, type LengthDist, sampleLength, streamRng } from "./sampling.ts";
import { joinText, randomWords, TextPool } from "./text.ts";
import type { RequestKind } from "./types.ts";

export interface RandomOptions {
  inputLen: LengthDist;
  outputLen: LengthDist;
  api: RequestKind;
}

export const RANDOM_DEFAULTS: RandomOptions = {
  inputLen: { mean: 1000, std: 200, min: 32, max: 4000 },
  outputLen: { mean: 200, std: 50, min: 1, max: 1000 },
  api: "completion",
};

/** Words of each prompt's unique head. */
export const RANDOM_HEAD_WORDS = 16;

export function generateRandom(o: RandomOptions, seed: number, n: number): RequestBody[][] {
  checkLength("random.inputLen", o.inputLen);
  checkLength("random.outputLen", o.outputLen);
  const lenRng = streamRng(seed, "random:lengths");
  const headRng = streamRng(seed, "random:heads");
  const offRng = streamRng(seed, "random:offsets");
  const lens: Array<[number, number]> = [];
  let maxLen = 0;
  for (let i = 0; i < n; i++) {
    const inLen = sampleLength(lenRng, o.inputLen);
    lens.push([inLen, sampleLength(lenRng, o.outputLen)]);
    maxLen = Math.max(maxLen, inLen);
  }
  const pool = new TextPool(seed, maxLen + 4096);
  const heads = new Set<string>();
  const units: RequestBody[][] = [];
  for (const [inLen, outLen] of lens) {
    const headLen = Math.min(RANDOM_HEAD_WORDS, inLen);
    let head = randomWords(headRng, headLen);
    for (let tries = 0; heads.has(head) && tries < 1000; tries++) head = randomWords(headRng, headLen);
    heads.add(head);
    const text = joinText(head, pool.slice(offRng.int(pool.words), inLen - headLen));
    const common = { promptTokensApprox: inLen, maxTokens: outLen };
    units.push([
      o.api === "chat"
        ? { kind: "chat", messages: [{ role: "user", content: text }], ...common }
        : { kind: "completion", prompt: text, ...common },
    ]);
  }
  return units;
}
