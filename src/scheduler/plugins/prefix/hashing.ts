/**
 * Prompt → prefix block hashes, following llm-d's approximate prefix producer (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/hashing.go`):
 *   h0  = xxh64(utf8(model) || utf8(cacheSalt))
 *   b_i = xxh64(block_i bytes)             (token ids as LE uint32; or raw prompt bytes)
 *   h_i = xxh64(LE64(b_i) || LE64(h_{i-1}))
 * The trailing partial block is hashed. Without real token ids the flattened prompt's UTF-8 bytes
 * are the pseudo-tokens, 4 bytes each; hashing the raw bytes of a block equals hashing its packed
 * LE uint32 pseudo-tokens, except that a trailing partial pseudo-token stays unpadded, as in llm-d.
 */
import type { Hasher, PackedHashes } from "../../hash.ts";
import type { CycleState, PromptInput, RequestFacts } from "../../types.ts";
import { dataKey } from "../../types.ts";
import type { ChainCache } from "./chain-cache.ts";
import { packHashes } from "./indexer.ts";
import { writeUtf8 } from "./utf8.ts";

/** Bytes per pseudo-token (llm-d averageCharactersPerToken). */
export const BYTES_PER_TOKEN = 4;
/**
 * Pseudo-tokens standing in for one non-text chat part (image, audio, video). llm-d estimates a
 * per-modality count; kvgate uses one fixed run so the part still shifts later block boundaries.
 */
export const MULTIMODAL_PLACEHOLDER_TOKENS = 64;

export type PromptSegment = { kind: "bytes"; bytes: Uint8Array } | { kind: "tokens"; tokens: Uint32Array };

/** The request's prompt(s) as hashable segments; multi-prompt completions hash per prompt. */
export interface FlatPrompt {
  segments: PromptSegment[];
  /** Prompt tokens: real ids when given, else ceil(bytes / 4) per segment. */
  tokenCount: number;
}

const PROMPT_KEY = dataKey<FlatPrompt>("kvgate/flat-prompt");
const encoder = new TextEncoder();
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** The flattened prompt of the cycle's request, computed once per request. */
export function flatPrompt(cycle: CycleState, hasher: Hasher | null): FlatPrompt {
  const memo = cycle.get(PROMPT_KEY);
  if (memo !== undefined) return memo;
  const req = cycle.request;
  if (req.tokenIds !== undefined && req.tokenIds.length > 0) {
    // Token ids: their count needs no copy (precise mode's consumers ask only for it); segments on first use.
    const lazy = new LazyFlatPrompt(req, hasher, req.tokenIds.length);
    cycle.set(PROMPT_KEY, lazy);
    return lazy;
  }
  return cycle.memo(PROMPT_KEY, () => flattenPrompt(req, hasher));
}

/**
 * The cycle's prompt for immediate hashing. A chat prompt (the common case) is flattened into the
 * shared scratch buffer without the copy flatPrompt() makes: its bytes stay valid only until the
 * next flattening, so the caller must consume them at once and keep no reference. The cycle still
 * memoises the prompt: the token count now, owned segments (re-flattened) if anyone asks.
 */
export function transientPrompt(cycle: CycleState, hasher: Hasher | null): FlatPrompt {
  const memo = cycle.get(PROMPT_KEY);
  if (memo !== undefined) return memo;
  const req = cycle.request;
  const p = req.prompt;
  if ((req.tokenIds !== undefined && req.tokenIds.length > 0) || p.kind !== "chat")
    return flatPrompt(cycle, hasher);
  // Written straight into the hasher's scratch memory when it has one: chain() then needs no copy.
  const w = new ByteWriter(hasher?.chain !== undefined ? hasher : null);
  writeChat(w, p.messages, p.tools, hasher);
  const bytes = w.view();
  const tokenCount = Math.ceil(bytes.length / BYTES_PER_TOKEN);
  cycle.set(PROMPT_KEY, new LazyFlatPrompt(req, hasher, tokenCount));
  return { segments: [{ kind: "bytes", bytes }], tokenCount };
}

/** A memoised prompt whose owned segments are built on first use (same bytes, by determinism). */
class LazyFlatPrompt implements FlatPrompt {
  #segments: PromptSegment[] | null = null;

  constructor(
    readonly req: RequestFacts,
    readonly hasher: Hasher | null,
    readonly tokenCount: number,
  ) {}

  get segments(): PromptSegment[] {
    if (this.#segments === null) this.#segments = flattenPrompt(this.req, this.hasher).segments;
    return this.#segments;
  }
}

export function flattenPrompt(req: RequestFacts, hasher: Hasher | null): FlatPrompt {
  if (req.tokenIds && req.tokenIds.length > 0) {
    const tokens = new Uint32Array(req.tokenIds);
    return { segments: [{ kind: "tokens", tokens }], tokenCount: tokens.length };
  }
  const segments = segmentsOf(req.prompt, hasher);
  let tokenCount = 0;
  for (const s of segments) {
    tokenCount += s.kind === "tokens" ? s.tokens.length : Math.ceil(s.bytes.length / BYTES_PER_TOKEN);
  }
  return { segments, tokenCount };
}

function segmentsOf(p: PromptInput, hasher: Hasher | null): PromptSegment[] {
  if (p.kind === "chat") return [{ kind: "bytes", bytes: flattenChat(p.messages, p.tools, hasher) }];
  const prompt = p.prompt;
  if (typeof prompt === "string") return [{ kind: "bytes", bytes: encoder.encode(prompt) }];
  if (prompt.length === 0) return [];
  if (typeof prompt[0] === "string") {
    return (prompt as string[]).map((s) => ({ kind: "bytes", bytes: encoder.encode(s) }));
  }
  if (typeof prompt[0] === "number") return [{ kind: "tokens", tokens: new Uint32Array(prompt as number[]) }];
  return (prompt as number[][]).map((t) => ({ kind: "tokens", tokens: new Uint32Array(t) }));
}

/**
 * Chat flattening: json(tools) when present, then per message its role followed by its content
 * text, with no separators (llm-d). A non-text part pads to a 4-byte boundary and appends
 * MULTIMODAL_PLACEHOLDER_TOKENS copies of the low 32 bits of xxh64(its url, or its JSON).
 */
export function flattenChat(
  messages: readonly { role: string; content?: unknown }[],
  tools: unknown,
  hasher: Hasher | null,
): Uint8Array {
  const w = new ByteWriter();
  writeChat(w, messages, tools, hasher);
  return w.done();
}

function writeChat(
  w: ByteWriter,
  messages: readonly { role: string; content?: unknown }[],
  tools: unknown,
  hasher: Hasher | null,
): void {
  if (tools !== undefined && tools !== null) w.text(JSON.stringify(tools));
  for (const m of messages) {
    w.text(m.role ?? "");
    const c = m.content;
    if (typeof c === "string") {
      w.text(c);
    } else if (Array.isArray(c)) {
      for (const part of c as { type?: string; text?: string; [k: string]: unknown }[]) {
        if (part.type === "text") w.text(part.text ?? "");
        else w.placeholders(part, hasher);
      }
    }
  }
}

/** Strings up to this many UTF-16 units try the allocation-free ASCII copy in ByteWriter.text(). */
const SHORT_TEXT = 32;

/**
 * Appends UTF-8 text and placeholder runs into one shared, growing scratch buffer, or into the
 * hasher's scratch memory (Hasher.scratch) when given one.
 */
class ByteWriter {
  static #shared = new Uint8Array(1 << 16);
  readonly #hasher: Hasher | null;
  #buf: Uint8Array;
  #len = 0;

  constructor(hasher: Hasher | null = null) {
    this.#hasher = hasher?.scratch !== undefined ? hasher : null;
    this.#buf = this.#hasher !== null ? this.#scratch(1 << 16) : ByteWriter.#shared;
  }

  text(s: string): void {
    if (s.length === 0) return;
    this.#reserve(s.length * 3);
    const buf = this.#buf;
    // Short ASCII strings (chat roles) are copied directly, cheaper than a call into the encoder.
    // Same bytes: ASCII is its own UTF-8.
    if (s.length <= SHORT_TEXT) {
      const at = this.#len;
      let i = 0;
      for (; i < s.length; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) break;
        buf[at + i] = c;
      }
      if (i === s.length) {
        this.#len = at + i;
        return;
      }
    }
    this.#len += writeUtf8(buf, this.#len, s);
  }

  placeholders(part: Record<string, unknown>, hasher: Hasher | null): void {
    const pad = (BYTES_PER_TOKEN - (this.#len % BYTES_PER_TOKEN)) % BYTES_PER_TOKEN;
    this.#reserve(pad + MULTIMODAL_PLACEHOLDER_TOKENS * BYTES_PER_TOKEN);
    const buf = this.#buf;
    buf.fill(0, this.#len, this.#len + pad);
    this.#len += pad;
    const url =
      (part.image_url as { url?: string } | undefined)?.url ??
      (part.video_url as { url?: string } | undefined)?.url;
    const key = encoder.encode(url ?? JSON.stringify(part));
    const h = hasher ? Number(hasher.h64(key) & 0xffffffffn) : 0;
    const dv = new DataView(buf.buffer);
    for (let i = 0; i < MULTIMODAL_PLACEHOLDER_TOKENS; i++, this.#len += BYTES_PER_TOKEN)
      dv.setUint32(this.#len, h, true);
  }

  /** A copy of the bytes written (the scratch buffer is reused by the next request). */
  done(): Uint8Array {
    return this.#buf.slice(0, this.#len);
  }

  /** The bytes written, in place: valid only until the next ByteWriter writes. */
  view(): Uint8Array {
    return this.#buf.subarray(0, this.#len);
  }

  #reserve(n: number): void {
    const buf = this.#buf;
    if (this.#len + n <= buf.length) return;
    const size = Math.max(buf.length * 2, this.#len + n);
    if (this.#hasher !== null) {
      this.#buf = this.#scratch(size); // keeps the bytes written
      return;
    }
    const next = new Uint8Array(size);
    next.set(buf.subarray(0, this.#len));
    ByteWriter.#shared = next;
    this.#buf = next;
  }

  #scratch(bytes: number): Uint8Array {
    return (this.#hasher as Hasher & { scratch(bytes: number): Uint8Array }).scratch(bytes);
  }
}

/** h0 = xxh64(utf8(model) || utf8(cacheSalt)). */
export function rootHash(hasher: Hasher, model: string, cacheSalt: string | undefined): bigint {
  return hasher.h64(encoder.encode(model + (cacheSalt ?? "")));
}

const scratch = new Uint8Array(16);
const scratchView = new DataView(scratch.buffer);

/** Appends up to `maxBlocks` chained block hashes of `seg` to `out`. */
export function chainHashes(
  hasher: Hasher,
  h0: bigint,
  seg: PromptSegment,
  blockSizeTokens: number,
  maxBlocks: number,
  out: bigint[],
): void {
  const bytes = seg.kind === "bytes" ? seg.bytes : tokenBytes(seg.tokens);
  chainFrom(hasher, bytes, blockSizeTokens * BYTES_PER_TOKEN, maxBlocks, 0, h0, out);
}

/**
 * chainHashes() as PackedHashes, the prefix index's hot-path format: in one call
 * when the hasher has a chain fast path, else via `cache` (or chainHashes) and packing.
 */
export function chainHashesPacked(
  hasher: Hasher,
  h0: bigint,
  seg: PromptSegment,
  blockSizeTokens: number,
  maxBlocks: number,
  cache: ChainCache | null,
): PackedHashes {
  if (hasher.chain !== undefined) {
    const bytes = seg.kind === "bytes" ? seg.bytes : tokenBytes(seg.tokens);
    return hasher.chain(bytes, blockSizeTokens * BYTES_PER_TOKEN, maxBlocks, 0, h0);
  }
  const out: bigint[] = [];
  if (cache !== null) cache.hash(hasher, h0, seg, blockSizeTokens, maxBlocks, out);
  else chainHashes(hasher, h0, seg, blockSizeTokens, maxBlocks, out);
  return packHashes(out);
}

/** Continues a chain at block `first` (whose parent hash is `prev`), appending to `out`. */
export function chainFrom(
  hasher: Hasher,
  bytes: Uint8Array,
  blockBytes: number,
  maxBlocks: number,
  first: number,
  prev: bigint,
  out: bigint[],
): void {
  if (hasher.chain !== undefined) {
    const packed = hasher.chain(bytes, blockBytes, maxBlocks, first, prev);
    for (let k = 0; k < packed.length; k += 2)
      out.push((BigInt(packed[k + 1] >>> 0) << 32n) | BigInt(packed[k] >>> 0));
    return;
  }
  for (let i = first, off = first * blockBytes; off < bytes.length && i < maxBlocks; i++, off += blockBytes) {
    const b = hasher.h64(bytes.subarray(off, Math.min(off + blockBytes, bytes.length)));
    scratchView.setBigUint64(0, b, true);
    scratchView.setBigUint64(8, prev, true);
    prev = hasher.h64(scratch);
    out.push(prev);
  }
}

/** Token ids as little-endian uint32 bytes. */
export function tokenBytes(tokens: Uint32Array): Uint8Array {
  if (LITTLE_ENDIAN) return new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  const out = new Uint8Array(tokens.length * 4);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < tokens.length; i++) dv.setUint32(i * 4, tokens[i], true);
  return out;
}
