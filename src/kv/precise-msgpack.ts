/**
 * The msgpack reader behind precise-decode.ts: bounds-checked reads of the forms KV-event batches use
 * (https://github.com/msgpack/msgpack/blob/master/spec.md), with fast loops for block-hash and token-id
 * arrays. Whatever it does not accept the way the reference decoder (@msgpack/msgpack via event-codec.ts)
 * would, it rejects by throwing FALLBACK, and the caller decodes with the reference instead.
 */

/** Thrown to leave the fast path; the caller catches it and uses the reference decoder. */
export const FALLBACK = { fallback: true };

// Fatal: the reference decoder turns invalid UTF-8 into other code units than TextDecoder's U+FFFD,
// so invalid strings fall back to it.
const UTF8 = new TextDecoder("utf-8", { fatal: true });
const SAFE = BigInt(Number.MAX_SAFE_INTEGER);
/** Payload width of fixed-size numbers, by first byte. */
const SKIP_WIDTH = new Uint8Array(256);
for (const [c, w] of [
  [0xca, 4],
  [0xcb, 8],
  [0xcc, 1],
  [0xcd, 2],
  [0xce, 4],
  [0xcf, 8],
  [0xd0, 1],
  [0xd1, 2],
  [0xd2, 4],
  [0xd3, 8],
])
  SKIP_WIDTH[c] = w;

/** Interns short ASCII strings by their bytes, so known keys and tags cost no UTF-8 decoding. */
export class StringTable {
  private readonly byLength: { bytes: Uint8Array; value: string }[][] = [];

  constructor(values: readonly string[]) {
    const enc = new TextEncoder();
    for (const value of values) {
      const bytes = enc.encode(value);
      (this.byLength[bytes.length] ??= []).push({ bytes, value });
    }
  }

  /** The interned string equal to b[at, at+n), or undefined. */
  find(b: Uint8Array, at: number, n: number): string | undefined {
    const bucket = this.byLength[n];
    if (bucket === undefined) return undefined;
    next: for (const { bytes, value } of bucket) {
      for (let j = n - 1; j >= 0; j--) if (bytes[j] !== b[at + j]) continue next;
      return value;
    }
    return undefined;
  }
}

export class MsgpackReader {
  b: Uint8Array = new Uint8Array(0);
  dv: DataView = new DataView(this.b.buffer);
  p = 0;
  end = 0;

  reset(buf: Uint8Array): void {
    this.b = buf;
    this.dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    this.p = 0;
    this.end = buf.length;
  }

  /** The next byte, without consuming it (undefined at the end). */
  peek(): number {
    return this.b[this.p];
  }

  need(n: number): void {
    if (this.p + n > this.end) throw FALLBACK;
  }

  arrayLen(): number {
    this.need(1);
    const c = this.b[this.p++];
    if (c >= 0x90 && c <= 0x9f) return c & 0x0f;
    if (c === 0xdc) return this.u16();
    if (c === 0xdd) return this.u32();
    throw FALLBACK;
  }

  mapLen(): number {
    this.need(1);
    const c = this.b[this.p++];
    if (c >= 0x80 && c <= 0x8f) return c & 0x0f;
    if (c === 0xde) return this.u16();
    if (c === 0xdf) return this.u32();
    throw FALLBACK;
  }

  u8(): number {
    this.need(1);
    return this.b[this.p++];
  }

  u16(): number {
    this.need(2);
    const v = this.dv.getUint16(this.p);
    this.p += 2;
    return v;
  }

  u32(): number {
    this.need(4);
    const v = this.dv.getUint32(this.p);
    this.p += 4;
    return v;
  }

  nil(): boolean {
    this.need(1);
    if (this.b[this.p] !== 0xc0) return false;
    this.p++;
    return true;
  }

  /** An int in any msgpack int form, as a safe JS integer (decodeEventBatch's intValue rules). */
  int(): number {
    this.need(1);
    const c = this.b[this.p++];
    if (c <= 0x7f) return c;
    if (c >= 0xe0) return c - 0x100;
    let v: number;
    switch (c) {
      case 0xcc:
        this.need(1);
        return this.b[this.p++];
      case 0xcd:
        return this.u16();
      case 0xce:
        return this.u32();
      case 0xd0:
        this.need(1);
        v = this.dv.getInt8(this.p);
        this.p += 1;
        return v;
      case 0xd1:
        this.need(2);
        v = this.dv.getInt16(this.p);
        this.p += 2;
        return v;
      case 0xd2:
        this.need(4);
        v = this.dv.getInt32(this.p);
        this.p += 4;
        return v;
      case 0xcf:
      case 0xd3: {
        this.need(8);
        const x = c === 0xcf ? this.dv.getBigUint64(this.p) : this.dv.getBigInt64(this.p);
        this.p += 8;
        if (x > SAFE || x < -SAFE) throw FALLBACK;
        return Number(x);
      }
      default:
        throw FALLBACK;
    }
  }

  optInt(): number | null {
    return this.nil() ? null : this.int();
  }

  /** The batch ts: float64/float32 (finite) or an int. */
  num(): number {
    this.need(1);
    const c = this.b[this.p];
    if (c === 0xcb || c === 0xca) {
      this.p++;
      this.need(c === 0xcb ? 8 : 4);
      const v = c === 0xcb ? this.dv.getFloat64(this.p) : this.dv.getFloat32(this.p);
      this.p += c === 0xcb ? 8 : 4;
      if (!Number.isFinite(v)) throw FALLBACK;
      return v;
    }
    return this.int();
  }

  /** A block hash as uint64 (negative ints cast as decodeEventBatch does). */
  hash(): bigint {
    this.need(1);
    const c = this.b[this.p];
    if (c === 0xcf) {
      this.need(9);
      const v = this.dv.getBigUint64(this.p + 1);
      this.p += 9;
      return v;
    }
    if (c === 0xd3) {
      this.need(9);
      const v = BigInt.asUintN(64, this.dv.getBigInt64(this.p + 1));
      this.p += 9;
      return v;
    }
    const v = this.int();
    return v >= 0 ? BigInt(v) : BigInt.asUintN(64, BigInt(v));
  }

  hashes(): bigint[] {
    const n = this.arrayLen();
    if (n > this.end - this.p) throw FALLBACK;
    const out = new Array<bigint>(n);
    for (let i = 0; i < n; i++) out[i] = this.hash();
    return out;
  }

  tokens(): number[] {
    const n = this.arrayLen();
    if (n > this.end - this.p) throw FALLBACK;
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const c = this.b[this.p];
      if (c <= 0x7f) {
        out[i] = c;
        this.p++;
      } else if (c === 0xce && this.p + 5 <= this.end) {
        out[i] = this.dv.getUint32(this.p + 1);
        this.p += 5;
      } else if (c === 0xcd && this.p + 3 <= this.end) {
        out[i] = this.dv.getUint16(this.p + 1);
        this.p += 3;
      } else out[i] = this.int();
    }
    return out;
  }

  strLen(): number {
    this.need(1);
    const c = this.b[this.p++];
    if (c >= 0xa0 && c <= 0xbf) return c & 0x1f;
    if (c === 0xd9) {
      this.need(1);
      return this.b[this.p++];
    }
    if (c === 0xda) return this.u16();
    if (c === 0xdb) return this.u32();
    throw FALLBACK;
  }

  /** A string; those in `known` are returned interned, without decoding. */
  str(known?: StringTable): string {
    const n = this.strLen();
    this.need(n);
    let s: string | undefined = known?.find(this.b, this.p, n);
    if (s !== undefined) {
      this.p += n;
      return s;
    }
    if (
      n === 3 &&
      this.b[this.p + 1] === 0x50 &&
      this.b[this.p + 2] === 0x55 &&
      (this.b[this.p] === 0x47 || this.b[this.p] === 0x43)
    )
      s = this.b[this.p] === 0x47 ? "GPU" : "CPU";
    else {
      try {
        s = UTF8.decode(this.b.subarray(this.p, this.p + n));
      } catch {
        throw FALLBACK;
      }
    }
    this.p += n;
    return s;
  }

  optStr(): string | null {
    return this.nil() ? null : this.str();
  }

  /** extra_keys on the fast path: nil, or a list whose entries are all nil. */
  extraKeys(): (unknown[] | null)[] | null {
    if (this.nil()) return null;
    const n = this.arrayLen();
    if (n > this.end - this.p) throw FALLBACK;
    const out = new Array<null>(n);
    for (let i = 0; i < n; i++) {
      if (!this.nil()) throw FALLBACK;
      out[i] = null;
    }
    return out;
  }

  /** Skips one value of a form the reference decoder accepts without error; anything else falls back. */
  skip(): void {
    this.need(1);
    const c = this.b[this.p];
    if (c <= 0x7f || c >= 0xe0 || c === 0xc0 || c === 0xc2 || c === 0xc3) {
      this.p++;
      return;
    }
    if ((c >= 0x90 && c <= 0x9f) || c === 0xdc || c === 0xdd) {
      const n = this.arrayLen();
      for (let i = 0; i < n; i++) this.skip();
      return;
    }
    if ((c >= 0x80 && c <= 0x8f) || c === 0xde || c === 0xdf) {
      const n = this.mapLen();
      for (let i = 0; i < n; i++) {
        const kc = this.b[this.p];
        if ((kc >= 0xa0 && kc <= 0xbf) || kc === 0xd9 || kc === 0xda || kc === 0xdb) {
          if (this.str() === "__proto__") throw FALLBACK;
        } else if (kc === 0xcf || kc === 0xd3)
          throw FALLBACK; // a bigint key: the reference rejects it
        else this.int(); // other keys must be numbers for the reference decoder
        this.skip();
      }
      return;
    }
    if ((c >= 0xa0 && c <= 0xbf) || c === 0xd9 || c === 0xda || c === 0xdb) {
      const n = this.strLen();
      this.need(n);
      this.p += n;
      return;
    }
    this.p++;
    const w = SKIP_WIDTH[c];
    if (w > 0) {
      this.need(w);
      this.p += w;
      return;
    }
    if (c === 0xc4 || c === 0xc5 || c === 0xc6) {
      const n = c === 0xc4 ? this.u8() : c === 0xc5 ? this.u16() : this.u32();
      this.need(n);
      this.p += n;
      return;
    }
    throw FALLBACK; // ext types (the reference may reject them), 0xc1
  }
}
