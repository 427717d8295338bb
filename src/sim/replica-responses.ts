/**
 * Response shapes of the simulated replica's generation endpoints, as vLLM sends them
 * (the response models of vllm/entrypoints/openai/protocol.py and its newer split files): incremental
 * detokenization, usage with prompt_tokens_details.cached_tokens,
 * the final JSON bodies of completions and chat, and the SSE chunk writer (role chunk, content deltas,
 * final chunk with finish_reason and stop_reason, optional usage chunk, `data: [DONE]`).
 */
import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import type { Tokenizer } from "../engine/tokenizer.ts";
import type { FinishReason, RequestRecord } from "../engine/types.ts";
import type { LoraAdapter } from "./lora-config.ts";
import type { RequestHandle } from "./replica-driver.ts";
import type { ReplicaOptions } from "./replica-options.ts";
import { type ApiError, type ChatParams, type CompletionParams, errorBody } from "./replica-protocol.ts";

/** Streams text from token ids a step at a time, holding back an incomplete UTF-8 sequence. */
export class IncrementalText {
  private ids: number[] = [];
  private prefix = 0;
  private read = 0;
  text = "";
  constructor(
    private readonly tok: Tokenizer,
    private readonly skipIds: ReadonlySet<number>,
  ) {}
  /** Adds tokens; returns the new text (possibly empty). `final` flushes held-back bytes. */
  push(newIds: number[], final = false): string {
    for (const id of newIds) if (!this.skipIds.has(id)) this.ids.push(id);
    const before = this.tok.decode(this.ids.slice(this.prefix, this.read));
    const after = this.tok.decode(this.ids.slice(this.prefix));
    if (after.length <= before.length || (!final && after.endsWith("\uFFFD")) || !after.startsWith(before))
      return final && !after.startsWith(before) ? this.resync() : "";
    const delta = after.slice(before.length);
    this.prefix = this.read;
    this.read = this.ids.length;
    this.text += delta;
    return delta;
  }
  /** Rare: the window's decoding changed its prefix; emit whatever the full text adds. */
  private resync(): string {
    const full = this.tok.decode(this.ids);
    const delta = full.startsWith(this.text) ? full.slice(this.text.length) : "";
    this.text += delta;
    this.prefix = this.read = this.ids.length;
    return delta;
  }
}

export interface Choice {
  index: number;
  promptIndex: number;
  engineId: string;
  handle: RequestHandle | null;
  text: IncrementalText;
  tokenIds: number[];
  finishReason: FinishReason | null;
  record: RequestRecord | null;
  started: boolean;
}

export interface PromptInfo {
  tokenIds: number[];
  text: string | null;
}

export interface Usage {
  prompt_tokens: number;
  total_tokens: number;
  completion_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export function usageOf(choices: Choice[], prompts: PromptInfo[]): Usage {
  let promptTokens = 0;
  let cached = 0;
  let completion = 0;
  const seen = new Set<number>();
  for (const c of choices) {
    completion += c.tokenIds.length;
    if (seen.has(c.promptIndex)) continue;
    seen.add(c.promptIndex);
    promptTokens += prompts[c.promptIndex]!.tokenIds.length;
    cached += c.record?.cachedTokens ?? 0;
  }
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens + completion,
    completion_tokens: completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

export function finalResponse(
  p: CompletionParams | ChatParams,
  id: string,
  created: number,
  model: string,
  choices: Choice[],
  prompts: PromptInfo[],
  usage: Usage,
  tok: Tokenizer,
  kvTransferParams: Record<string, unknown> | null = null,
): unknown {
  const tokenIds = (c: Choice) => (p.returnTokenIds ? { token_ids: c.tokenIds } : {});
  if (p.kind === "chat") {
    return {
      id,
      object: "chat.completion",
      created,
      model,
      choices: choices.map((c) => ({
        index: c.index,
        message: {
          role: "assistant",
          content: c.text.text,
          refusal: null,
          annotations: null,
          audio: null,
          function_call: null,
          tool_calls: [],
          reasoning_content: null,
        },
        logprobs: null,
        finish_reason: c.finishReason,
        stop_reason: null,
        ...tokenIds(c),
      })),
      service_tier: null,
      system_fingerprint: null,
      usage,
      prompt_logprobs: null,
      prompt_token_ids: p.returnTokenIds ? prompts[0]!.tokenIds : null,
      kv_transfer_params: kvTransferParams,
    };
  }
  return {
    id,
    object: "text_completion",
    created,
    model,
    choices: choices.map((c) => {
      const pr = prompts[c.promptIndex]!;
      const echo = p.echo ? (pr.text ?? tok.decode(pr.tokenIds)) : "";
      return {
        index: c.index,
        text: echo + c.text.text,
        logprobs: null,
        finish_reason: c.finishReason,
        stop_reason: null,
        prompt_logprobs: null,
        ...(p.returnTokenIds && { prompt_token_ids: pr.tokenIds, token_ids: c.tokenIds }),
      };
    }),
    service_tier: null,
    system_fingerprint: null,
    usage,
    kv_transfer_params: kvTransferParams,
  };
}

/** Writes vLLM's SSE chunks for one response. */
export class SseWriter {
  private readonly object: string;
  constructor(
    private readonly res: ServerResponse,
    private readonly p: CompletionParams | ChatParams,
    private readonly id: string,
    private readonly created: number,
    private readonly model: string,
  ) {
    this.object = p.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  }

  start(): void {
    if (this.res.headersSent || this.res.destroyed) return;
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
    });
    this.res.flushHeaders();
  }

  private send(data: unknown): void {
    if (!this.res.destroyed && !this.res.writableEnded) this.res.write(`data: ${JSON.stringify(data)}\n\n`);
  }

  private chunk(choices: unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> {
    const c: Record<string, unknown> = {
      id: this.id,
      object: this.object,
      created: this.created,
      model: this.model,
      choices,
      ...extra,
    };
    if (this.p.includeUsage) c["usage"] = null;
    return c;
  }

  choiceChunk(c: Choice, delta: string, newIds: number[], prompts: PromptInfo[]): void {
    const p = this.p;
    const final = c.finishReason !== null;
    if (!final && delta === "" && !p.returnTokenIds && c.started) return;
    const ids = p.returnTokenIds ? { token_ids: newIds } : {};
    const usage = p.continuousUsage
      ? {
          usage: {
            prompt_tokens: prompts[c.promptIndex]!.tokenIds.length,
            completion_tokens: c.tokenIds.length,
            total_tokens: prompts[c.promptIndex]!.tokenIds.length + c.tokenIds.length,
          },
        }
      : {};
    if (p.kind === "chat") {
      if (!c.started) {
        const first = p.returnTokenIds ? { prompt_token_ids: prompts[c.promptIndex]!.tokenIds } : {};
        this.send(
          this.chunk(
            [
              {
                index: c.index,
                delta: { role: "assistant", content: "" },
                logprobs: null,
                finish_reason: null,
              },
            ],
            first,
          ),
        );
      }
      const choice: Record<string, unknown> = {
        index: c.index,
        delta: { content: delta },
        logprobs: null,
        finish_reason: c.finishReason,
      };
      if (final) choice["stop_reason"] = null;
      this.send(this.chunk([{ ...choice, ...ids }], usage));
      return;
    }
    const first =
      p.returnTokenIds && !c.started ? { prompt_token_ids: prompts[c.promptIndex]!.tokenIds } : {};
    this.send(
      this.chunk(
        [
          {
            index: c.index,
            text: delta,
            logprobs: null,
            finish_reason: c.finishReason,
            stop_reason: null,
            ...first,
            ...ids,
          },
        ],
        usage,
      ),
    );
  }

  finish(usage: Usage): void {
    if (this.p.includeUsage)
      this.send({
        id: this.id,
        object: this.object,
        created: this.created,
        model: this.model,
        choices: [],
        usage,
      });
    this.end();
  }

  error(err: ApiError): void {
    this.start();
    this.send(errorBody(err));
    this.end();
  }

  private end(): void {
    if (this.res.destroyed || this.res.writableEnded) return;
    this.res.end("data: [DONE]\n\n");
  }
}

/**
 * vLLM's ModelList: one ModelCard per served name (owned_by "vllm", root = --model, max_model_len),
 * then one per LoRA adapter (root = its path, parent = its base model or the first served name,
 * no max_model_len), as vllm/entrypoints/openai/serving_models.py show_available_models lists them.
 */
export function modelList(
  o: ReplicaOptions,
  created: number,
  adapters: readonly LoraAdapter[] = [],
): unknown {
  const card = (id: string, root: string, parent: string | null, maxLen: number | null) => ({
    id,
    object: "model",
    created,
    owned_by: "vllm",
    root,
    parent,
    max_model_len: maxLen,
    permission: [
      {
        id: `modelperm-${randomUUID().replace(/-/g, "")}`,
        object: "model_permission",
        created,
        allow_create_engine: false,
        allow_sampling: true,
        allow_logprobs: true,
        allow_search_indices: false,
        allow_view: true,
        allow_fine_tuning: false,
        organization: "*",
        group: null,
        is_blocking: false,
      },
    ],
  });
  return {
    object: "list",
    data: [
      ...o.servedModelNames.map((id) => card(id, o.model, null, o.maxModelLen)),
      ...adapters.map((a) => card(a.name, a.path, a.baseModelName ?? o.servedModelNames[0]!, null)),
    ],
  };
}
