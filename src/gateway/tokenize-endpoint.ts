/**
 * `--tokenizer endpoint` (alias `remote`): the gateway asks one candidate replica's vLLM
 * `POST /tokenize` for the prompt's ids (vLLM's TokenizeRequest in vllm/entrypoints/openai/protocol.py:
 * completion form `{model, prompt,
 * add_special_tokens}`, chat form `{model, messages, add_generation_prompt}`; the answer's `tokens`),
 * so they are the engine's own by construction. A short timeout bounds it; any failure (timeout,
 * refused connection, non-200, malformed answer) gives undefined and the request is routed without
 * token ids (precise score 0), never an error to the client.
 */
import type { EndpointState, PromptInput } from "../scheduler/types.ts";
import type { TokenizeFlags } from "./tokenize.ts";

export const DEFAULT_ENDPOINT_TOKENIZE_TIMEOUT_MS = 250;

export interface EndpointTokenizerOptions {
  /** Per-request budget for the /tokenize call. Default 250 ms. */
  timeoutMs?: number;
  /** For tests. Default globalThis.fetch. */
  fetch?: typeof fetch;
}

export interface EndpointTokenizerStats {
  requests: number;
  failures: number;
}

export class EndpointTokenizer {
  readonly timeoutMs: number;
  #fetch: typeof fetch;
  #next = 0;
  requests = 0;
  failures = 0;

  constructor(opts: EndpointTokenizerOptions = {}) {
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_ENDPOINT_TOKENIZE_TIMEOUT_MS;
    this.#fetch = opts.fetch ?? fetch;
  }

  /** The /tokenize body for `prompt`, or undefined when ids are given or there are several prompts. */
  static body(model: string, prompt: PromptInput, flags: TokenizeFlags): Record<string, unknown> | undefined {
    if (prompt.kind === "chat") {
      const b: Record<string, unknown> = {
        model,
        messages: prompt.messages,
        add_generation_prompt: flags.addGenerationPrompt ?? true,
      };
      if (flags.addSpecialTokens !== undefined) b.add_special_tokens = flags.addSpecialTokens;
      return b;
    }
    if (typeof prompt.prompt !== "string") return undefined;
    return { model, prompt: prompt.prompt, add_special_tokens: flags.addSpecialTokens ?? true };
  }

  /**
   * Token ids from one of `candidates` (round-robin over them; they are the replicas the request may
   * go to, so they serve `model`), or undefined. Never throws.
   */
  async tokenIds(
    model: string,
    prompt: PromptInput,
    flags: TokenizeFlags,
    candidates: readonly EndpointState[],
  ): Promise<number[] | undefined> {
    if (prompt.kind === "completion") {
      const p = prompt.prompt;
      if (Array.isArray(p) && p.length > 0 && typeof p[0] === "number") return p as number[];
    }
    const body = EndpointTokenizer.body(model, prompt, flags);
    if (body === undefined || candidates.length === 0) return undefined;
    const target = candidates[this.#next++ % candidates.length]!;
    this.requests++;
    try {
      const res = await this.#fetch(`http://${target.address}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (res.status !== 200) {
        await res.body?.cancel().catch(() => {});
        throw new Error(`status ${res.status}`);
      }
      const j = (await res.json()) as { tokens?: unknown };
      const t = j?.tokens;
      if (!Array.isArray(t) || !t.every((x) => Number.isInteger(x) && x >= 0)) throw new Error("bad tokens");
      return t as number[];
    } catch {
      this.failures++;
      return undefined;
    }
  }

  stats(): EndpointTokenizerStats {
    return { requests: this.requests, failures: this.failures };
  }
}
