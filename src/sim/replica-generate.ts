/**
 * /v1/completions and /v1/chat/completions of the simulated replica: tokenizes the prompt(s), hands one
 * engine request per (prompt, n) choice to the driver, and answers in vLLM's JSON or SSE shapes
 * (replica-responses.ts): one chunk per engine step per choice. With a NixlConnector, the first
 * choice honours kv_transfer_params (nixl-connector.ts): do_remote_decode on a producer returns the
 * prefiller's kv_transfer_params, do_remote_prefill on a consumer pulls the prompt's KV; a failed
 * pull under kv_load_failure_policy "fail" is answered 500, as vLLM does for FinishReason.ERROR.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { EngineInputError } from "../engine/engine.ts";
import type { Faults } from "./faults.ts";
import { isProducer } from "./kv-transfer-config.ts";
import type { LoraAdapter } from "./lora-config.ts";
import type { NixlConnector } from "./nixl-connector.ts";
import type { DriverOutput, ReplicaDriver } from "./replica-driver.ts";
import type { ReplicaOptions } from "./replica-options.ts";
import {
  ApiError,
  type ChatParams,
  type CompletionParams,
  contextLengthMessage,
  sendError,
  sendJson,
} from "./replica-protocol.ts";
import {
  type Choice,
  finalResponse,
  IncrementalText,
  type PromptInfo,
  SseWriter,
  usageOf,
} from "./replica-responses.ts";

export interface GenerateContext {
  opts: ReplicaOptions;
  driver: ReplicaDriver;
  faults: Faults;
  /** The served name a request's `model` refers to; throws a 404 ApiError for unknown names. */
  resolveModel(name: string | undefined): string;
  /** The LoRA adapter a resolved model name is, if it is one. */
  adapter(name: string): LoraAdapter | undefined;
  /** A fresh engine request id. */
  nextEngineId(): string;
  /** The P/D connector when --kv-transfer-config set one. */
  nixl: NixlConnector | null;
}

/** vLLM's answer to a request that ended with FinishReason.ERROR (a failed KV load). */
const KV_LOAD_FAILED = new ApiError(
  500,
  'Internal server error: the KV cache could not be loaded from the prefiller (kv_load_failure_policy "fail"); retry the request, or set kv_load_failure_policy "recompute" to prefill locally',
  null,
  "InternalServerError",
);

function tokenizePrompts(ctx: GenerateContext, p: CompletionParams | ChatParams): PromptInfo[] {
  const tok = ctx.opts.tokenizer;
  if (p.kind === "chat") {
    const text = tok.applyChatTemplate(p.messages, { addGenerationPrompt: p.addGenerationPrompt });
    return [{ tokenIds: tok.encode(text, p.addSpecialTokens), text: null }];
  }
  return p.prompts.map((pr) => {
    if ("text" in pr) return { tokenIds: tok.encode(pr.text, p.addSpecialTokens), text: pr.text };
    const badId = pr.tokenIds.find((id) => id >= tok.vocabSize);
    if (badId !== undefined)
      throw new ApiError(
        400,
        `Token id ${badId} is out of vocabulary (vocab size ${tok.vocabSize})`,
        "prompt",
      );
    return { tokenIds: pr.tokenIds, text: null };
  });
}

/** Handles a parsed generation request; errors before the response starts are thrown as ApiError. */
export function handleGeneration(
  ctx: GenerateContext,
  p: CompletionParams | ChatParams,
  req: IncomingMessage,
  res: ServerResponse,
): void {
  try {
    runGeneration(ctx, p, req, res);
  } catch (err) {
    // Rejected before the engine took it: a P/D decode request frees its prefiller's blocks now.
    ctx.nixl?.rejectedBeforeAdmission(p.kvTransferParams);
    throw err;
  }
}

function runGeneration(
  ctx: GenerateContext,
  p: CompletionParams | ChatParams,
  req: IncomingMessage,
  res: ServerResponse,
): void {
  const model = ctx.resolveModel(p.model);
  // vLLM selects an adapter by the request's model name; it runs on the base model's engine.
  const adapter = ctx.adapter(model);
  const prompts = tokenizePrompts(ctx, p);
  const maxModelLen = ctx.opts.maxModelLen;
  const maxTokensOf = prompts.map((pr) => {
    const len = pr.tokenIds.length;
    if (len === 0)
      throw new ApiError(
        400,
        "The decoder prompt cannot be empty",
        p.kind === "chat" ? "messages" : "prompt",
      );
    if (len + (p.maxTokens ?? 1) > maxModelLen)
      throw new ApiError(
        400,
        contextLengthMessage(maxModelLen, len, p.maxTokens),
        len >= maxModelLen ? null : "max_tokens",
      );
    return p.maxTokens ?? maxModelLen - len;
  });
  if (p.priority !== 0 && ctx.opts.schedulingPolicy !== "priority")
    throw new ApiError(400, `Got priority ${p.priority} but Priority scheduling is not enabled.`, "priority");
  const ordinal = ctx.faults.startRequest();
  if (ctx.faults.shouldFail())
    throw new ApiError(
      500,
      "Simulated internal server error (--fault-error-rate)",
      null,
      "InternalServerError",
    );

  const header = req.headers["x-request-id"];
  const baseId = (typeof header === "string" && header) || p.requestId || randomUUID().replace(/-/g, "");
  const id = `${p.kind === "chat" ? "chatcmpl" : "cmpl"}-${baseId}`;
  const created = Math.floor(Date.now() / 1000);
  const tok = ctx.opts.tokenizer;
  const skip = new Set([tok.eosTokenId]);
  const choices: Choice[] = [];
  for (let i = 0; i < prompts.length; i++)
    for (let j = 0; j < p.n; j++)
      choices.push({
        index: i * p.n + j,
        promptIndex: i,
        engineId: ctx.nextEngineId(),
        handle: null,
        text: new IncrementalText(tok, skip),
        tokenIds: [],
        finishReason: null,
        record: null,
        started: false,
      });

  let finished = 0;
  let done = false;
  let firstOutputSeen = false;
  const cancelAll = () => {
    for (const c of choices) c.handle?.cancel();
  };
  const stream = p.stream ? new SseWriter(res, p, id, created, model) : null;
  // vLLM's --stream-interval (vllm/v1/engine/output_processor.py): after a choice's first token, its
  // chunk waits until it carries that many new tokens, or the choice finishes.
  const interval = ctx.opts.streamInterval;
  const pending = new Map<Choice, { delta: string; ids: number[] }>();
  const holdBack = (c: Choice, delta: string, ids: number[], final: boolean) => {
    if (interval <= 1) return { delta, ids };
    const held = pending.get(c);
    const all = held ? { delta: held.delta + delta, ids: [...held.ids, ...ids] } : { delta, ids };
    if (final || !c.started || all.ids.length >= interval) {
      pending.delete(c);
      return all;
    }
    pending.set(c, all);
    return null;
  };

  const deliver = (c: Choice, out: DriverOutput) => {
    if (out.finishReason === "error") {
      onError(KV_LOAD_FAILED);
      return;
    }
    c.tokenIds.push(...out.newTokenIds);
    const final = out.finishReason !== null;
    const delta = c.text.push(out.newTokenIds, final);
    if (final) {
      c.finishReason = out.finishReason;
      c.record = out.record ?? null;
      finished++;
    }
    if (stream) {
      if (p.kind === "completion" && p.echo && !c.started) {
        const pr = prompts[c.promptIndex]!;
        stream.choiceChunk(c, (pr.text ?? tok.decode(pr.tokenIds)) + delta, out.newTokenIds, prompts);
      } else {
        const held = holdBack(c, delta, out.newTokenIds, final);
        if (held) stream.choiceChunk(c, held.delta, held.ids, prompts);
      }
    }
    c.started = true;
    if (!firstOutputSeen) {
      firstOutputSeen = true;
      if (stream) res.write("", () => ctx.faults.afterFirstOutput(ordinal));
      else ctx.faults.afterFirstOutput(ordinal);
    }
    if (finished === choices.length) {
      const usage = usageOf(choices, prompts);
      const rec = choices[0]?.record;
      const kvParams = ctx.nixl && rec ? ctx.nixl.transferParams(rec) : null;
      const body = stream
        ? null
        : finalResponse(p, id, created, model, choices, prompts, usage, tok, kvParams);
      done = true;
      if (stream) stream.finish(usage);
      else sendJson(res, 200, body);
    }
  };
  const onOutput = (c: Choice, out: DriverOutput) => {
    if (done) return;
    try {
      deliver(c, out);
    } catch (err) {
      ctx.opts.log(`sim-replica: request ${id} failed mid-way: ${(err as Error)?.stack ?? err}`);
      onError(err as Error);
    }
  };
  const onError = (err: Error) => {
    if (done) return;
    done = true;
    cancelAll();
    const api =
      err instanceof ApiError
        ? err
        : err instanceof EngineInputError
          ? new ApiError(400, err.message)
          : new ApiError(500, `Internal server error: ${err?.message ?? err}`);
    if (stream) stream.error(api);
    else sendError(res, api);
  };

  const nixl = ctx.nixl;
  const kvp = p.kvTransferParams;
  const remoteDecode = nixl !== null && isProducer(nixl.config) && kvp?.["do_remote_decode"] === true;
  let prepared: string | null = null;
  try {
    for (const c of choices) {
      const pr = prompts[c.promptIndex]!;
      const maxTokens = maxTokensOf[c.promptIndex]!;
      const first = c.index === 0;
      const remotePrefill = first && nixl?.prepare(c.engineId, kvp) === true;
      if (remotePrefill) prepared = c.engineId;
      c.handle = ctx.driver.submit(
        {
          id: c.engineId,
          promptTokenIds: pr.tokenIds,
          maxTokens,
          ignoreEos: p.ignoreEos || p.minTokens >= maxTokens,
          ...(p.cacheSalt !== undefined && { cacheSalt: p.cacheSalt }),
          ...(adapter !== undefined && { loraName: adapter.name, loraId: adapter.id }),
          priority: p.priority,
          ...(p.seed !== undefined && { seed: p.seed + (c.index % p.n) }),
          ...(first && remoteDecode && { remoteDecode: true }),
          ...(remotePrefill && { remotePrefill: true }),
        },
        { onOutput: (out) => onOutput(c, out), onError },
        { delay: ctx.faults.extraLatency },
      );
    }
  } catch (err) {
    done = true;
    cancelAll();
    if (prepared !== null) nixl?.forget(prepared);
    if (err instanceof EngineInputError) throw new ApiError(400, err.message);
    throw err;
  }
  res.on("close", () => {
    if (!done) {
      done = true;
      cancelAll();
    }
  });
  stream?.start();
}
