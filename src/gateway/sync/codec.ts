/**
 * The wire form of a gateway sync batch (src/scheduler/sync.ts) between `kvgate serve --nats`
 * replicas: JSON, with each chain of block hashes as base64 of its int32 halves (little-endian), a
 * third of the size of a JSON number array. decodeBatch checks every field: a garbled or foreign
 * message is refused with the reason, never merged.
 */
import type { PrefixInsert, SessionBinding, SyncBatch } from "../../scheduler/sync.ts";

/** Wire version; a peer sending another is refused (counted as dropped). */
export const SYNC_WIRE_VERSION = 1;

interface WireInsert {
  p: string;
  e: string;
  c: number;
  h: string;
}

function packHashes(h: readonly number[]): string {
  const a = new Int32Array(h.length);
  for (let i = 0; i < h.length; i++) a[i] = h[i] | 0;
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64");
}

function unpackHashes(s: string): number[] {
  const b = Buffer.from(s, "base64");
  if (b.length % 8 !== 0) throw new Error("hash chain is not a whole number of 64-bit blocks");
  const out = new Array<number>(b.length >>> 2);
  for (let i = 0; i < out.length; i++) out[i] = b.readInt32LE(4 * i);
  return out;
}

export function encodeBatch(b: SyncBatch): Uint8Array {
  const prefix: WireInsert[] = b.prefix.map((x) => ({ p: x.p, e: x.e, c: x.c, h: packHashes(x.h) }));
  const speculative = b.speculative?.map((x) => ({ p: x.p, e: x.e, t: x.t, h: packHashes(x.h) }));
  return Buffer.from(JSON.stringify({ v: SYNC_WIRE_VERSION, ...b, prefix, speculative }), "utf8");
}

const isStr = (x: unknown): x is string => typeof x === "string" && x.length > 0 && x.length <= 512;
const isNum = (x: unknown): x is number => typeof x === "number" && Number.isFinite(x) && x >= 0;

/** Parses and checks a batch; throws an Error saying what is wrong. */
export function decodeBatch(data: Uint8Array): SyncBatch {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8"));
  } catch {
    throw new Error("not JSON");
  }
  if (o === null || typeof o !== "object") throw new Error("not an object");
  if (o.v !== SYNC_WIRE_VERSION)
    throw new Error(`wire version ${String(o.v)}, expected ${SYNC_WIRE_VERSION}`);
  if (!isStr(o.origin) || !isStr(o.config)) throw new Error("origin and config must be strings");
  if (!isNum(o.seq) || !Number.isInteger(o.seq) || !isNum(o.at)) throw new Error("bad seq or at");
  if (!Array.isArray(o.prefix) || !Array.isArray(o.sessions))
    throw new Error("prefix and sessions must be arrays");
  const prefix: PrefixInsert[] = o.prefix.map((x: WireInsert) => {
    if (!x || !isStr(x.p) || !isStr(x.e) || !isNum(x.c) || typeof x.h !== "string")
      throw new Error("bad prefix insert");
    return { p: x.p, e: x.e, c: Math.floor(x.c), h: unpackHashes(x.h) };
  });
  const sessions: SessionBinding[] = o.sessions.map((x: SessionBinding) => {
    if (!x || !isStr(x.p) || !isStr(x.s) || !isStr(x.e)) throw new Error("bad session binding");
    return { p: x.p, s: x.s, e: x.e };
  });
  const out: SyncBatch = { origin: o.origin, seq: o.seq, at: o.at, config: o.config, prefix, sessions };
  if (o.load !== undefined) {
    if (o.load === null || typeof o.load !== "object") throw new Error("bad load");
    const load: Record<string, Array<[string, number, number]>> = {};
    for (const [name, rows] of Object.entries(o.load as Record<string, unknown>)) {
      if (!Array.isArray(rows)) throw new Error("bad load rows");
      load[name] = rows.map((r) => {
        if (!Array.isArray(r) || !isStr(r[0]) || !isNum(r[1]) || !isNum(r[2]))
          throw new Error("bad load row");
        return [r[0], r[1], r[2]] as [string, number, number];
      });
    }
    out.load = load;
  }
  if (o.speculative !== undefined) {
    if (!Array.isArray(o.speculative)) throw new Error("speculative must be an array");
    out.speculative = o.speculative.map((x: { p: unknown; e: unknown; t: unknown; h: unknown }) => {
      if (!x || !isStr(x.p) || !isStr(x.e) || !isNum(x.t) || typeof x.h !== "string")
        throw new Error("bad speculative entry");
      return { p: x.p, e: x.e, t: x.t, h: unpackHashes(x.h) };
    });
  }
  if (o.homes !== undefined) {
    if (o.homes === null || typeof o.homes !== "object") throw new Error("bad homes");
    const homes: Record<string, Array<[string, number]>> = {};
    for (const [name, rows] of Object.entries(o.homes as Record<string, unknown>)) {
      if (!Array.isArray(rows)) throw new Error("bad homes rows");
      homes[name] = rows.map((r) => {
        if (!Array.isArray(r) || !isStr(r[0]) || !isNum(r[1]) || !Number.isInteger(r[1]))
          throw new Error("bad homes row");
        return [r[0], r[1]] as [string, number];
      });
    }
    out.homes = homes;
  }
  return out;
}
