/**
 * Multi-turn chat sessions: every turn resends the whole thread (system prompt, then alternating
 * user and assistant messages), so turn k's prompt is a prefix of turn k+1's. The assistant
 * replies are seeded pseudo-words of the turn's max_tokens length, not the model's real output:
 * the workload stays fixed in advance (and runnable in virtual time), and the resent prefix up to
 * the previous user message is still exactly what the replica cached.
 */
import type { ChatMessage } from "../../engine/tokenizer.ts";
import type { RequestBody } from "./arrivals.ts";
import { checkLength, type LengthDist, sampleLength, streamRng } from "./sampling.ts";
import { joinText, randomWords } from "./text.ts";
import type { RequestKind } from "./types.ts";

export interface MultiTurnOptions {
  /** Turns per session. */
  turns: LengthDist;
  /** Tokens of the system prompt (0: none). */
  systemPromptLen: LengthDist;
  /**
   * Number of distinct system prompts shared by the sessions (session i uses prompt i mod N and
   * gets groupId i mod N). 0: every session has its own.
   */
  sharedSystemPrompts: number;
  questionLen: LengthDist;
  /** max_tokens of each turn and length of the canned assistant reply. */
  outputLen: LengthDist;
  /** Seconds between a turn finishing and the next turn being sent. */
  thinkTime: number;
  api: RequestKind;
}

export const MULTI_TURN_DEFAULTS: MultiTurnOptions = {
  turns: 5,
  systemPromptLen: 1000,
  sharedSystemPrompts: 0,
  questionLen: 200,
  outputLen: 200,
  thinkTime: 0,
  api: "chat",
};

export function checkMultiTurn(o: MultiTurnOptions): void {
  checkLength("multi-turn.turns", o.turns);
  checkLength("multi-turn.systemPromptLen", o.systemPromptLen, true);
  checkLength("multi-turn.questionLen", o.questionLen);
  checkLength("multi-turn.outputLen", o.outputLen);
  if (!Number.isInteger(o.sharedSystemPrompts) || o.sharedSystemPrompts < 0)
    throw new RangeError("multi-turn.sharedSystemPrompts must be an integer ≥ 0");
  if (!(o.thinkTime >= 0)) throw new RangeError("multi-turn.thinkTime must be ≥ 0");
}

/** n sessions, each a unit of its turns in order. */
export function generateMultiTurn(o: MultiTurnOptions, seed: number, n: number): RequestBody[][] {
  checkMultiTurn(o);
  const lenRng = streamRng(seed, "multi-turn:lengths");
  const textRng = streamRng(seed, "multi-turn:text");
  const shared: Array<{ text: string; len: number }> = [];
  for (let g = 0; g < o.sharedSystemPrompts; g++) {
    const len = sampleLength(lenRng, o.systemPromptLen);
    shared.push({ text: randomWords(textRng, len), len });
  }
  const sessions: RequestBody[][] = [];
  for (let s = 0; s < n; s++) {
    const sessionId = `s${s}`;
    const groupId = shared.length ? s % shared.length : undefined;
    let sys: { text: string; len: number };
    if (groupId !== undefined) sys = shared[groupId];
    else {
      const len = sampleLength(lenRng, o.systemPromptLen);
      sys = { text: randomWords(textRng, len), len };
    }
    const turns = sampleLength(lenRng, o.turns);
    let messages: ChatMessage[] = sys.text ? [{ role: "system", content: sys.text }] : [];
    let prompt = sys.text;
    let tokens = sys.len;
    const unit: RequestBody[] = [];
    let reply: { text: string; len: number } | undefined;
    for (let t = 1; t <= turns; t++) {
      const qLen = sampleLength(lenRng, o.questionLen);
      const question = randomWords(textRng, qLen);
      const outLen = sampleLength(lenRng, o.outputLen);
      if (reply) {
        messages = [...messages, { role: "assistant", content: reply.text }];
        prompt = joinText(prompt, reply.text);
        tokens += reply.len;
      }
      messages = [...messages, { role: "user", content: question }];
      prompt = joinText(prompt, question);
      tokens += qLen;
      const common = { promptTokensApprox: tokens, maxTokens: outLen, sessionId, turn: t };
      const body: RequestBody =
        o.api === "chat" ? { kind: "chat", messages, ...common } : { kind: "completion", prompt, ...common };
      if (groupId !== undefined) Object.assign(body, { groupId, prefixTokens: sys.len });
      unit.push(body);
      reply = { text: randomWords(textRng, outLen), len: outLen };
    }
    sessions.push(unit);
  }
  return sessions;
}
