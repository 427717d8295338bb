/**
 * UTF-8 encoding of prompt text into a caller's buffer at an offset, the hot step of prompt
 * flattening (~32 KB per 8k-token prompt). Under Node, ASCII text (the common case: the check is a
 * fast length scan) is copied as Latin-1, which for ASCII is the same bytes at ~2.5× the speed of
 * a UTF-8 encoder, through Buffer's per-encoding writers (Buffer.write's argument handling costs
 * ~0.1 µs a call, a prompt has dozens of strings); nothing is allocated per call (TextEncoder's
 * encodeInto needs a subarray view and returns a result object). Elsewhere, TextEncoder.
 */
type NodeBuffer = Uint8Array & {
  write(s: string, offset: number, encoding: "latin1" | "utf8"): number;
  latin1Write?(s: string, offset: number): number;
  utf8Write?(s: string, offset: number): number;
};
type NodeBufferClass = {
  from(ab: ArrayBufferLike, offset: number, length: number): NodeBuffer;
  byteLength(s: string): number;
};

const NodeBuf = (globalThis as { Buffer?: NodeBufferClass }).Buffer;
const encoder = new TextEncoder();
let viewOf: Uint8Array | null = null;
let view: NodeBuffer | null = null;
let direct = false;

/**
 * Writes `s` as UTF-8 into `dst` at `at`; returns the bytes written. `dst` must have room for
 * 3 bytes per UTF-16 unit of `s` from `at` on.
 */
export function writeUtf8(dst: Uint8Array, at: number, s: string): number {
  if (NodeBuf === undefined) return encoder.encodeInto(s, dst.subarray(at)).written;
  if (viewOf !== dst) {
    view = NodeBuf.from(dst.buffer, dst.byteOffset, dst.length);
    viewOf = dst;
    direct = typeof view.latin1Write === "function" && typeof view.utf8Write === "function";
  }
  const b = view as NodeBuffer;
  const ascii = NodeBuf.byteLength(s) === s.length;
  if (direct)
    return ascii
      ? (b.latin1Write as (s: string, o: number) => number).call(b, s, at)
      : (b.utf8Write as (s: string, o: number) => number).call(b, s, at);
  return b.write(s, at, ascii ? "latin1" : "utf8");
}
