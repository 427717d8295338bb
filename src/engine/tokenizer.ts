/**
 * The tokenizer contract shared by the simulated replica, the gateway and the fleet simulator.
 * Implementations: the deterministic simulator tokenizer (sim-tokenizer.ts, no model files) and a
 * real Hugging Face tokenizer.json loaded offline (src/datalayer/hf-tokenizer.ts).
 */

/** An OpenAI chat message; content parts other than text are ignored for tokenization. */
export interface ChatMessage {
  role: string;
  content?: string | Array<{ type: string; text?: string }> | null;
  name?: string;
}

export interface Tokenizer {
  readonly name: string;
  /** Token ids of `text`; `addSpecialTokens` adds BOS where the model does (vLLM: true for completions). */
  encode(text: string, addSpecialTokens?: boolean): number[];
  /** Text of `ids`; any id in [0, vocabSize) decodes to something. */
  decode(ids: number[]): string;
  /** The prompt text a chat request becomes, as the model's chat template renders it. */
  applyChatTemplate(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): string;
  readonly vocabSize: number;
  /** End-of-sequence token id. */
  readonly eosTokenId: number;
}

/** The text of a chat message's content: strings as is, text parts joined. */
export function messageText(m: ChatMessage): string {
  if (typeof m.content === "string") return m.content;
  if (Array.isArray(m.content))
    return m.content.map((p) => (p.type === "text" ? (p.text ?? "") : "")).join("");
  return "";
}
