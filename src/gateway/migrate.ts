/**
 * Mid-stream migration (`--migrate-streams`, or `x-kvgate-migrate: on` per request; Dynamo calls
 * it request migration, `--migration-limit`): when the replica streaming a response dies after the
 * first byte, the gateway resumes the response on another replica by sending it the prompt's token
 * ids plus the tokens already generated, as a `/v1/completions` token-id prompt (vLLM accepts
 * them), and continues the client's SSE stream in the original response's own format — the same
 * `id`, `created`, `model` and chunk shape, chat deltas for a chat request — so the client sees one
 * uninterrupted response.
 *
 * The token ids come from the replica itself: the upstream request carries `return_token_ids: true`
 * (vLLM's request field: `prompt_token_ids` on the first chunk, each chunk's `token_ids`), and
 * when the client did not ask for them they are removed on the way out. Only single-choice
 * streams (`n` 1, one prompt, no `echo`) migrate; anything else keeps the closing SSE error event.
 * A stop string that straddles the cut may be missed, and the sampler's RNG restarts on the new
 * replica (a `seed` does not reproduce the text the dead replica would have produced).
 */
import type { ResponseRewriter } from "./proxy.ts";

type Json = Record<string, unknown>;

/** Fields carried from the client's body into a continuation (sampling, limits, cache keys). */
const CARRIED = [
  "model",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
  "stop",
  "stop_token_ids",
  "frequency_penalty",
  "presence_penalty",
  "repetition_penalty",
  "ignore_eos",
  "logit_bias",
  "cache_salt",
  "priority",
  "skip_special_tokens",
  "spaces_between_special_tokens",
  "include_stop_str_in_output",
  "stream_options",
] as const;

/** Whether a request body can migrate, and its body for the first replica (with return_token_ids). */
export function planMigration(
  kind: "chat" | "completions",
  body: Buffer,
): { body: Buffer; migration: Migration } | null {
  let j: Json;
  try {
    j = JSON.parse(body.toString("utf8"));
  } catch {
    return null;
  }
  if (j === null || typeof j !== "object" || j.stream !== true) return null;
  if (j.n !== undefined && j.n !== 1) return null;
  if (j.best_of !== undefined && j.best_of !== 1) return null;
  if (kind === "completions") {
    const p = j.prompt;
    const single = typeof p === "string" || (Array.isArray(p) && p.every((x) => typeof x === "number"));
    if (!single || j.echo === true) return null;
  } else if (!Array.isArray(j.messages)) return null;
  const clientIds = j.return_token_ids === true;
  const up = clientIds ? body : Buffer.from(JSON.stringify({ ...j, return_token_ids: true }), "utf8");
  return { body: up, migration: new Migration(kind, j, clientIds) };
}

export class Migration implements ResponseRewriter {
  #on = false;
  /** Resumed at least once: upstream chunks are /v1/completions chunks to convert. */
  #continuing = false;
  promptIds: number[] | null = null;
  readonly generated: number[] = [];
  /** Tokens generated before the current upstream took over. */
  #before = 0;
  #finished = false;
  #template: Json | null = null;
  migrations = 0;

  constructor(
    readonly kind: "chat" | "completions",
    readonly request: Json,
    /** The client asked for token ids itself: they stay in its stream. */
    readonly clientIds: boolean,
  ) {}

  start(status: number, sse: boolean): void {
    this.#on = status === 200 && sse;
  }

  /** Whether the stream can be resumed now: the prompt ids are known and it has not finished. */
  get resumable(): boolean {
    return this.#on && this.promptIds !== null && !this.#finished;
  }

  /** The continuation request for the next replica (POST /v1/completions), or null. */
  resumeBody(): Buffer | null {
    if (!this.resumable) return null;
    const r = this.request;
    const body: Json = {};
    for (const k of CARRIED) if (r[k] !== undefined) body[k] = r[k];
    const max = (r.max_completion_tokens ?? r.max_tokens) as number | undefined;
    if (typeof max === "number") {
      const left = max - this.generated.length;
      if (left <= 0) return null;
      body.max_tokens = left;
    }
    if (typeof r.min_tokens === "number") body.min_tokens = Math.max(0, r.min_tokens - this.generated.length);
    body.prompt = [...(this.promptIds as number[]), ...this.generated];
    body.stream = true;
    body.return_token_ids = true;
    this.#continuing = true;
    this.#before = this.generated.length;
    this.migrations++;
    return Buffer.from(JSON.stringify(body), "utf8");
  }

  chunk(b: Buffer): Buffer {
    if (!this.#on) return b;
    const text = b.toString("utf8");
    let out = "";
    for (const ev of text.split(/(?<=\n\n)/)) out += this.#event(ev);
    return Buffer.from(out, "utf8");
  }

  end(): Buffer {
    return Buffer.alloc(0);
  }

  #event(ev: string): string {
    const m = /^data: ?(.*)\n\n$/s.exec(ev);
    if (m === null || m[1] === "[DONE]") return ev;
    let j: Json;
    try {
      j = JSON.parse(m[1]);
    } catch {
      return ev;
    }
    const choices = Array.isArray(j.choices) ? (j.choices as Json[]) : [];
    const c = choices[0];
    const pids = (j.prompt_token_ids ?? c?.prompt_token_ids) as number[] | undefined;
    if (!this.#continuing && Array.isArray(pids)) this.promptIds = pids;
    if (Array.isArray(c?.token_ids)) this.generated.push(...(c.token_ids as number[]));
    if (c && c.finish_reason !== null && c.finish_reason !== undefined) this.#finished = true;
    if (!this.#continuing) {
      if (c) this.#template = j;
      if (this.clientIds) return ev;
      delete j.prompt_token_ids;
      for (const x of choices) {
        delete x.prompt_token_ids;
        delete x.token_ids;
      }
      return `data: ${JSON.stringify(j)}\n\n`;
    }
    return `data: ${JSON.stringify(this.#convert(j, c))}\n\n`;
  }

  /** A continuation chunk (a /v1/completions chunk) in the original response's shape. */
  #convert(j: Json, c: Json | undefined): Json {
    const t = this.#template ?? {};
    const out: Json = { ...t };
    if (c === undefined) {
      out.choices = [];
      const u = j.usage as Json | null | undefined;
      if (u && typeof u === "object") {
        const prompt = (this.promptIds as number[]).length;
        const completion = this.#before + ((u.completion_tokens as number) ?? 0);
        out.usage = {
          ...u,
          prompt_tokens: prompt,
          completion_tokens: completion,
          total_tokens: prompt + completion,
        };
      } else if ("usage" in j) out.usage = j.usage;
      return out;
    }
    const tc = ((t.choices as Json[] | undefined)?.[0] ?? {}) as Json;
    const choice: Json = { ...tc };
    if (this.kind === "chat") choice.delta = { content: c.text ?? "" };
    else choice.text = c.text ?? "";
    if ("logprobs" in c) choice.logprobs = c.logprobs;
    choice.finish_reason = c.finish_reason ?? null;
    if (c.finish_reason != null) choice.stop_reason = c.stop_reason ?? null;
    delete choice.prompt_token_ids;
    if (this.clientIds) choice.token_ids = c.token_ids ?? [];
    else delete choice.token_ids;
    out.choices = [choice];
    delete out.prompt_token_ids;
    if ("usage" in j) out.usage = j.usage;
    else delete out.usage;
    return out;
  }
}
