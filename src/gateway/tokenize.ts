/**
 * Optional tokenization in the gateway (`--tokenizer`): with real token ids the prefix index hashes
 * the same token blocks the replicas cache instead of 4-byte pseudo-tokens (reference §3.1; llm-d's
 * token-producer). "sim" selects the simulated replicas' tokenizer; anything else is a directory
 * with a Hugging Face tokenizer.json, loaded offline. Tokenization never fails a request: when it
 * cannot be done (multi-prompt input, template error) the scheduler falls back to pseudo-tokens.
 * Precise mode needs these ids to equal the engine's, so this follows vLLM's rules: chat goes through
 * the tokenizer's chat template (add_generation_prompt, default true) and is encoded without special
 * tokens; a text prompt gets them (BOS); each unless the request says otherwise (add_special_tokens).
 * Not modelled: tools and chat_template_kwargs, which a real template may render into the prompt.
 */
import { loadHfTokenizer } from "../datalayer/hf-tokenizer.ts";
import { createSimTokenizer } from "../engine/sim-tokenizer.ts";
import type { ChatMessage as EngineChatMessage, Tokenizer } from "../engine/tokenizer.ts";
import type { PromptInput } from "../scheduler/types.ts";

export async function loadGatewayTokenizer(spec: string | Tokenizer): Promise<Tokenizer> {
  if (typeof spec !== "string") return spec;
  if (spec === "sim") return createSimTokenizer();
  return loadHfTokenizer(spec);
}

/** The request's flags that change its token ids (vLLM: add_generation_prompt, add_special_tokens). */
export interface TokenizeFlags {
  addGenerationPrompt?: boolean;
  addSpecialTokens?: boolean;
}

/** Token ids vLLM would see for `prompt`, or undefined when the gateway should not guess. */
export function promptTokenIds(
  tok: Tokenizer,
  prompt: PromptInput,
  flags: TokenizeFlags = {},
): number[] | undefined {
  try {
    if (prompt.kind === "chat") {
      // The chat template adds BOS itself (vLLM: add_special_tokens false for chat).
      const text = tok.applyChatTemplate(prompt.messages as EngineChatMessage[], {
        addGenerationPrompt: flags.addGenerationPrompt ?? true,
      });
      return tok.encode(text, flags.addSpecialTokens ?? false);
    }
    const p = prompt.prompt;
    if (typeof p === "string") return tok.encode(p, flags.addSpecialTokens ?? true);
    if (p.length > 0 && typeof p[0] === "number") return p as number[];
    return undefined; // several prompts: hashed per prompt from their text
  } catch {
    return undefined;
  }
}
