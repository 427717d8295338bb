/**
 * Optional tokenization in the gateway (`--tokenizer`): with real token ids the prefix index hashes
 * the same token blocks the replicas cache instead of 4-byte pseudo-tokens (llm-d's token-producer,
 * llm-d/llm-d-router@ebab6879 `pkg/epp/framework/plugins/requestcontrol/dataproducer/`). "sim" selects the
 * simulated replicas' tokenizer; anything else is a directory
 * with a Hugging Face tokenizer.json, loaded offline; both are wrapped in a per-segment id cache
 * (tokenize-cache.ts). "endpoint"/"remote" asks a replica's /tokenize (tokenize-endpoint.ts) and
 * is handled by the gateway, not here. Tokenization never fails a request: when it
 * cannot be done (multi-prompt input, template error) the scheduler falls back to pseudo-tokens.
 * Precise mode needs these ids to equal the engine's, so this follows vLLM's rules: chat goes through
 * the tokenizer's chat template (add_generation_prompt, default true) and is encoded without special
 * tokens; a text prompt gets them (BOS); each unless the request says otherwise (add_special_tokens).
 * Not modelled: tools and chat_template_kwargs, which a real template may render into the prompt.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { loadHfTokenizer } from "../datalayer/hf-tokenizer.ts";
import { createSimTokenizer, SIM_SPECIAL_TOKENS } from "../engine/sim-tokenizer.ts";
import type { ChatMessage as EngineChatMessage, Tokenizer } from "../engine/tokenizer.ts";
import type { PromptInput } from "../scheduler/types.ts";
import {
  type CachingTokenizer,
  createCachingTokenizer,
  type TokenizerCacheOptions,
} from "./tokenize-cache.ts";

/** `--tokenizer` values that make the gateway ask a replica's vLLM `POST /tokenize` instead. */
export const ENDPOINT_TOKENIZER_SPECS: ReadonlySet<string> = new Set(["endpoint", "remote"]);

export function isEndpointTokenizerSpec(spec: unknown): boolean {
  return typeof spec === "string" && ENDPOINT_TOKENIZER_SPECS.has(spec);
}

/**
 * "sim" or a tokenizer.json directory, wrapped in the prefix cache (tokenize-cache.ts); a Tokenizer
 * object is used as given (its safe boundaries are unknown). `cache.maxBytes: 0` disables caching.
 */
export async function loadGatewayTokenizer(
  spec: string | Tokenizer,
  cache: TokenizerCacheOptions = {},
): Promise<Tokenizer> {
  if (typeof spec !== "string") return spec;
  if (isEndpointTokenizerSpec(spec))
    throw new Error(`--tokenizer ${spec} is served by the replicas' /tokenize, not loaded locally`);
  if (cache.maxBytes === 0) return spec === "sim" ? createSimTokenizer() : loadHfTokenizer(spec);
  if (spec === "sim")
    return createCachingTokenizer(createSimTokenizer(), Object.keys(SIM_SPECIAL_TOKENS), cache);
  const tok = await loadHfTokenizer(spec);
  return createCachingTokenizer(tok, await hfSafeBoundaries(join(spec, "tokenizer.json")), cache);
}

/**
 * Special added tokens of a tokenizer.json that split the text before normalization and
 * pre-tokenization and strip nothing around them; none when the file truncates or pads (then only
 * whole texts are cached) or uses a "first"-only prepend, which depends on the position in the text.
 */
export async function hfSafeBoundaries(tokenizerJsonPath: string): Promise<string[]> {
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(await readFile(tokenizerJsonPath, "utf8")) as Record<string, unknown>;
  } catch {
    return [];
  }
  if ((j.truncation ?? null) !== null || (j.padding ?? null) !== null) return [];
  if (/"prepend_scheme"\s*:\s*"first"/.test(JSON.stringify(j.pre_tokenizer ?? null))) return [];
  const added = Array.isArray(j.added_tokens) ? (j.added_tokens as Array<Record<string, unknown>>) : [];
  return added
    .filter(
      (t) =>
        typeof t.content === "string" &&
        t.content.length > 0 &&
        t.special === true &&
        t.normalized !== true &&
        t.lstrip !== true &&
        t.rstrip !== true &&
        t.single_word !== true,
    )
    .map((t) => t.content as string);
}

/** The cache counters of a tokenizer from loadGatewayTokenizer, or null when it has no cache. */
export function tokenizerCacheOf(tok: Tokenizer | null): CachingTokenizer | null {
  return tok && typeof (tok as CachingTokenizer).stats === "function" ? (tok as CachingTokenizer) : null;
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
