/**
 * What the ext_proc server does to response bytes as they pass, without buffering the response:
 * ModelNameRestorer puts the client's model name back where an InferenceModelRewrite changed it
 * (llm-d's `rewriteModelName` in llm-d/llm-d-router@ebab6879 `pkg/epp/handlers/server.go`: byte
 * replacement of `"model":"<target>"` and `"model": "<target>"`), holding back only a tail that could
 * be the start of a match split across chunks; UsageScanner reads `prompt_tokens` and
 * `completion_tokens` from SSE events or a JSON body (vLLM's OpenAI usage object), last value wins.
 */

const QUOTE = 0x22;

export class ModelNameRestorer {
  readonly #from: Buffer[];
  readonly #to: Buffer[];
  readonly #longest: number;
  #carry: Buffer | null = null;

  /** Replaces the model `target` (what the replica served) with `client` (what the client asked for). */
  constructor(target: string, client: string) {
    const t = JSON.stringify(target);
    const c = JSON.stringify(client);
    this.#from = [Buffer.from(`"model":${t}`), Buffer.from(`"model": ${t}`)];
    this.#to = [Buffer.from(`"model":${c}`), Buffer.from(`"model": ${c}`)];
    this.#longest = Math.max(...this.#from.map((b) => b.length));
  }

  /** The bytes to emit for `chunk` (`end`: no more chunks, so nothing is held back). */
  push(chunk: Buffer, end: boolean): Buffer {
    const buf = this.#carry ? Buffer.concat([this.#carry, chunk]) : chunk;
    this.#carry = null;
    const parts: Buffer[] = [];
    let pos = 0;
    for (;;) {
      let at = -1;
      let which = 0;
      for (let k = 0; k < this.#from.length; k++) {
        const i = buf.indexOf(this.#from[k], pos);
        if (i >= 0 && (at < 0 || i < at)) {
          at = i;
          which = k;
        }
      }
      if (at < 0) break;
      parts.push(buf.subarray(pos, at), this.#to[which]);
      pos = at + this.#from[which].length;
    }
    const hold = end ? 0 : this.#partialTail(buf, pos);
    parts.push(buf.subarray(pos, buf.length - hold));
    if (hold > 0) this.#carry = Buffer.from(buf.subarray(buf.length - hold));
    return parts.length === 1 ? parts[0] : Buffer.concat(parts);
  }

  /** Length of the longest tail of buf[pos..] that is a proper prefix of a pattern. */
  #partialTail(buf: Buffer, pos: number): number {
    const max = Math.min(this.#longest - 1, buf.length - pos);
    for (let len = max; len > 0; len--) {
      const start = buf.length - len;
      if (buf[start] !== QUOTE) continue;
      for (const p of this.#from)
        if (len < p.length && buf.compare(p, 0, len, start, buf.length) === 0) return len;
    }
    return 0;
  }
}

const USAGE = /"(prompt|completion)_tokens"\s*:\s*(\d+)/g;

export class UsageScanner {
  promptTokens: number | null = null;
  completionTokens: number | null = null;
  #tail = "";

  push(chunk: Buffer): void {
    this.pushText(chunk.toString("latin1"));
  }

  /** push() for a chunk already decoded as latin1. */
  pushText(chunk: string): void {
    const text = this.#tail + chunk;
    // Most chunks of a stream carry no usage: the regex runs only where it can match.
    if (text.includes("_tokens"))
      for (const m of text.matchAll(USAGE)) {
        if (m[1] === "prompt") this.promptTokens = Number(m[2]);
        else this.completionTokens = Number(m[2]);
      }
    // Enough to finish a key and number split across chunks.
    this.#tail = text.length > 48 ? text.slice(-48) : text;
  }
}
