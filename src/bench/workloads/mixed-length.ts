/**
 * Mixed-length traffic: mostly short questions (~40 tokens) with an occasional very long document
 * (~50,000 tokens) followed by a question, the pattern that makes one replica's prefill block its
 * short requests. Documents are unique per request, or drawn from a small pool to make them
 * cacheable.
 */
import type { RequestBody } from "./arrivals.ts";
import { checkLength, type LengthDist, sampleLength, streamRng } from "./sampling.ts";
import { joinText, randomWords } from "./text.ts";
import type { RequestKind } from "./types.ts";

export interface MixedLengthOptions {
  shortLen: LengthDist;
  longLen: LengthDist;
  /** Probability that a request carries a document. */
  longFraction: number;
  outputLen: LengthDist;
  /** Distinct documents to draw from (groupId = document index); 0: a fresh document each time. */
  documentPool: number;
  api: RequestKind;
}

export const MIXED_LENGTH_DEFAULTS: MixedLengthOptions = {
  shortLen: 40,
  longLen: 50000,
  longFraction: 0.02,
  outputLen: 128,
  documentPool: 0,
  api: "chat",
};

function body(api: RequestKind, text: string, tokens: number, maxTokens: number): RequestBody {
  return api === "chat"
    ? { kind: "chat", messages: [{ role: "user", content: text }], promptTokensApprox: tokens, maxTokens }
    : { kind: "completion", prompt: text, promptTokensApprox: tokens, maxTokens };
}

export function generateMixedLength(o: MixedLengthOptions, seed: number, n: number): RequestBody[][] {
  checkLength("mixed-length.shortLen", o.shortLen);
  checkLength("mixed-length.longLen", o.longLen);
  checkLength("mixed-length.outputLen", o.outputLen);
  if (!(o.longFraction >= 0 && o.longFraction <= 1))
    throw new RangeError("mixed-length.longFraction must be in [0, 1]");
  if (!Number.isInteger(o.documentPool) || o.documentPool < 0)
    throw new RangeError("mixed-length.documentPool must be an integer ≥ 0");
  const pickRng = streamRng(seed, "mixed-length:pick");
  const lenRng = streamRng(seed, "mixed-length:lengths");
  const textRng = streamRng(seed, "mixed-length:text");
  const docRng = streamRng(seed, "mixed-length:docs");
  const pool: Array<{ text: string; len: number }> = [];
  for (let d = 0; d < o.documentPool; d++) {
    const len = sampleLength(lenRng, o.longLen);
    pool.push({ text: randomWords(docRng, len), len });
  }
  const units: RequestBody[][] = [];
  for (let i = 0; i < n; i++) {
    const qLen = sampleLength(lenRng, o.shortLen);
    const outLen = sampleLength(lenRng, o.outputLen);
    const question = randomWords(textRng, qLen);
    if (pickRng.next() < o.longFraction) {
      let doc: { text: string; len: number };
      let groupId: number | undefined;
      if (pool.length) {
        groupId = pickRng.int(pool.length);
        doc = pool[groupId];
      } else {
        const len = sampleLength(lenRng, o.longLen);
        doc = { text: randomWords(docRng, len), len };
      }
      const b = body(o.api, joinText(doc.text, question), doc.len + qLen, outLen);
      if (groupId !== undefined) Object.assign(b, { groupId, prefixTokens: doc.len });
      units.push([b]);
    } else units.push([body(o.api, question, qLen, outLen)]);
  }
  return units;
}
