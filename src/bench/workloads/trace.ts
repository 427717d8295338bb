/**
 * Trace replay from JSONL, and a writer for round trips. One JSON object per line:
 *
 *   {"arrival_time": 0.25, "input_length": 7200, "output_length": 1000,
 *    "prefix_group": 3, "prefix_length": 6000}
 *   {"arrival_time": 0.31, "input_length": 1200, "output_length": 64, "block_hashes": [17, 18, 90]}
 *
 * - arrival_time: seconds from the start of the run (non-decreasing is not required).
 * - input_length / output_length: prompt tokens and max_tokens (output_length ≥ 1).
 * - prefix_group (optional): records of one group share a prefix text of prefix_length tokens.
 *   Without prefix_length, the group's prefix is `prefixFraction` (default 0.5) of the shortest
 *   input_length in the group.
 * - block_hashes (optional, wins over prefix_group): one id per `blockSize`-token block of the
 *   prompt (Mooncake-style hash_ids); equal ids give equal block text, so two records share text
 *   exactly as far as their leading ids agree. Tokens past the listed blocks are unique text.
 * - Blank lines and lines starting with "#" are skipped. Unknown fields are ignored.
 *
 * No text is stored in the trace: it is synthesized from the seed, the group and the block ids.
 */
import { z } from "zod";
import type { RequestBody } from "./arrivals.ts";
import { streamRng } from "./sampling.ts";
import { joinText, KeyedText, randomWords } from "./text.ts";
import type { RequestKind, RequestSpec, Workload } from "./types.ts";

const count = z.number().int().nonnegative();

export const TraceRecordSchema = z.object({
  arrival_time: z.number().finite().nonnegative(),
  input_length: count.min(1),
  output_length: count.min(1),
  prefix_group: z.union([z.number().int(), z.string()]).optional(),
  prefix_length: count.optional(),
  block_hashes: z.array(z.union([z.number().int(), z.string()])).optional(),
});

export type TraceRecord = z.infer<typeof TraceRecordSchema>;

export class TraceParseError extends Error {
  override name = "TraceParseError";
  constructor(
    readonly line: number,
    message: string,
  ) {
    super(`trace line ${line}: ${message}`);
  }
}

export function parseTraceJsonl(text: string): TraceRecord[] {
  const out: TraceRecord[] = [];
  const lines = text.split("\n");
  for (const [i, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new TraceParseError(i + 1, `invalid JSON: ${(e as Error).message}`);
    }
    const r = TraceRecordSchema.safeParse(v);
    if (!r.success) {
      const issue = r.error.issues[0];
      throw new TraceParseError(i + 1, `${issue.path.join(".") || "record"}: ${issue.message}`);
    }
    if (r.data.prefix_length !== undefined && r.data.prefix_length > r.data.input_length)
      throw new TraceParseError(i + 1, "prefix_length exceeds input_length");
    out.push(r.data);
  }
  return out;
}

/** One record per line, fields in the documented order, undefined fields left out. */
export function traceToJsonl(records: TraceRecord[]): string {
  return records
    .map((r) =>
      JSON.stringify({
        arrival_time: r.arrival_time,
        input_length: r.input_length,
        output_length: r.output_length,
        prefix_group: r.prefix_group,
        prefix_length: r.prefix_length,
        block_hashes: r.block_hashes,
      }),
    )
    .join("\n")
    .concat(records.length ? "\n" : "");
}

/** The trace of a generated workload: nominal arrival times, lengths, group and prefix length. */
export function workloadToTrace(w: Pick<Workload, "requests">): TraceRecord[] {
  return w.requests.map((r: RequestSpec) => ({
    arrival_time: r.arrivalTime,
    input_length: r.promptTokensApprox,
    output_length: r.maxTokens,
    ...(r.groupId !== undefined ? { prefix_group: r.groupId } : {}),
    ...(r.groupId !== undefined && r.prefixTokens !== undefined ? { prefix_length: r.prefixTokens } : {}),
  }));
}

export interface TraceOptions {
  blockSize: number;
  prefixFraction: number;
  /** Arrival times are divided by this (2 = replay twice as fast). */
  speedup: number;
  api: RequestKind;
}

export const TRACE_DEFAULTS: TraceOptions = {
  blockSize: 16,
  prefixFraction: 0.5,
  speedup: 1,
  api: "completion",
};

/** Request bodies and arrival times for a parsed trace (open loop, in file order). */
export function traceRequests(
  records: TraceRecord[],
  o: TraceOptions,
  seed: number,
): Array<{ body: RequestBody; time: number }> {
  if (!Number.isInteger(o.blockSize) || o.blockSize < 1) throw new RangeError("trace.blockSize must be ≥ 1");
  if (!(o.prefixFraction >= 0 && o.prefixFraction <= 1))
    throw new RangeError("trace.prefixFraction in [0, 1]");
  if (!(o.speedup > 0)) throw new RangeError("trace.speedup must be > 0");
  const keyed = new KeyedText(seed);
  const groupMin = new Map<string, number>();
  for (const r of records) {
    if (r.prefix_group === undefined) continue;
    const k = String(r.prefix_group);
    groupMin.set(k, Math.min(groupMin.get(k) ?? Number.POSITIVE_INFINITY, r.input_length));
  }
  return records.map((r, i) => {
    const unique = (n: number) => randomWords(streamRng(seed, `trace-record:${i}`), n);
    let text: string;
    let prefixTokens: number | undefined;
    let groupId: number | undefined;
    if (r.block_hashes?.length) {
      const parts: string[] = [];
      let left = r.input_length;
      for (const h of r.block_hashes) {
        if (left <= 0) break;
        const n = Math.min(o.blockSize, left);
        parts.push(keyed.get(`block:${h}`, n));
        left -= n;
      }
      parts.push(unique(left));
      text = joinText(...parts);
    } else if (r.prefix_group !== undefined) {
      const k = String(r.prefix_group);
      const p = r.prefix_length ?? Math.floor((groupMin.get(k) ?? 0) * o.prefixFraction);
      text = joinText(keyed.get(`group:${k}`, p), unique(r.input_length - p));
      prefixTokens = p;
      if (typeof r.prefix_group === "number") groupId = r.prefix_group;
    } else text = unique(r.input_length);
    const common = {
      promptTokensApprox: r.input_length,
      maxTokens: r.output_length,
      ...(groupId !== undefined ? { groupId } : {}),
      ...(prefixTokens !== undefined && groupId !== undefined ? { prefixTokens } : {}),
    };
    const body: RequestBody =
      o.api === "chat"
        ? { kind: "chat", messages: [{ role: "user", content: text }], ...common }
        : { kind: "completion", prompt: text, ...common };
    return { body, time: r.arrival_time / o.speedup };
  });
}
