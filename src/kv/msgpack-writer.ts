/**
 * A small msgpack writer that picks the same encodings msgspec does, so payloads are byte-identical to
 * vLLM's: ints in their shortest form (unsigned types for values >= 0, signed for < 0), floats always
 * float64, str8 for 32..255-byte strings, bin8/16/32 for bytes. @msgpack/msgpack's encoder differs
 * (it writes integral floats as ints), hence this writer.
 * Format reference: https://github.com/msgpack/msgpack/blob/master/spec.md
 */

const UTF8 = new TextEncoder();
const TWO_POW_32 = 4294967296;
const UINT64_MAX = (1n << 64n) - 1n;
const INT64_MIN = -(1n << 63n);

export class MsgpackWriter {
  private buf: Uint8Array;
  private view: DataView;
  private pos = 0;

  constructor(initialCapacity = 256) {
    this.buf = new Uint8Array(initialCapacity);
    this.view = new DataView(this.buf.buffer);
  }

  /** A copy of the bytes written so far. */
  finish(): Uint8Array {
    return this.buf.slice(0, this.pos);
  }

  private ensure(extra: number): void {
    const need = this.pos + extra;
    if (need <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < need) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  private byte(b: number): void {
    this.ensure(1);
    this.buf[this.pos++] = b;
  }

  nil(): void {
    this.byte(0xc0);
  }

  bool(b: boolean): void {
    this.byte(b ? 0xc3 : 0xc2);
  }

  float64(x: number): void {
    this.ensure(9);
    this.buf[this.pos] = 0xcb;
    this.view.setFloat64(this.pos + 1, x);
    this.pos += 9;
  }

  /** An integral JS number, in the shortest msgpack int form. */
  int(n: number): void {
    if (!Number.isInteger(n)) throw new RangeError(`msgpack int: ${n} is not an integer`);
    this.ensure(5);
    if (n >= 0) {
      if (n < 128) {
        this.buf[this.pos++] = n;
      } else if (n < 256) {
        this.buf[this.pos++] = 0xcc;
        this.buf[this.pos++] = n;
      } else if (n < 65536) {
        this.buf[this.pos] = 0xcd;
        this.view.setUint16(this.pos + 1, n);
        this.pos += 3;
      } else if (n < TWO_POW_32) {
        this.buf[this.pos] = 0xce;
        this.view.setUint32(this.pos + 1, n);
        this.pos += 5;
      } else {
        this.bigint(BigInt(n));
      }
      return;
    }
    if (n >= -32) {
      this.buf[this.pos++] = n & 0xff;
    } else if (n >= -128) {
      this.buf[this.pos++] = 0xd0;
      this.buf[this.pos++] = n & 0xff;
    } else if (n >= -32768) {
      this.buf[this.pos] = 0xd1;
      this.view.setInt16(this.pos + 1, n);
      this.pos += 3;
    } else if (n >= -2147483648) {
      this.buf[this.pos] = 0xd2;
      this.view.setInt32(this.pos + 1, n);
      this.pos += 5;
    } else {
      this.bigint(BigInt(n));
    }
  }

  /** A bigint in [-2^63, 2^64), in the shortest msgpack int form (0xcf above 2^32 - 1). */
  bigint(b: bigint): void {
    if (b < 4294967296n && b >= -2147483648n) {
      this.int(Number(b));
      return;
    }
    if (b > UINT64_MAX || b < INT64_MIN) throw new RangeError(`msgpack int: ${b} does not fit 64 bits`);
    this.ensure(9);
    if (b > 0n) {
      this.buf[this.pos] = 0xcf;
      this.view.setBigUint64(this.pos + 1, b);
    } else {
      this.buf[this.pos] = 0xd3;
      this.view.setBigInt64(this.pos + 1, b);
    }
    this.pos += 9;
  }

  str(s: string): void {
    // ASCII fast path: event tags, field names and media are ASCII.
    const n = s.length;
    let ascii = n < 256;
    for (let i = 0; ascii && i < n; i++) if (s.charCodeAt(i) > 0x7f) ascii = false;
    if (ascii) {
      this.strHeader(n);
      this.ensure(n);
      for (let i = 0; i < n; i++) this.buf[this.pos++] = s.charCodeAt(i);
      return;
    }
    const bytes = UTF8.encode(s);
    this.strHeader(bytes.length);
    this.raw(bytes);
  }

  private strHeader(len: number): void {
    if (len < 32) this.byte(0xa0 | len);
    else if (len < 256) this.sized(0xd9, len, 1);
    else if (len < 65536) this.sized(0xda, len, 2);
    else this.sized(0xdb, len, 4);
  }

  bin(bytes: Uint8Array): void {
    const len = bytes.length;
    if (len < 256) this.sized(0xc4, len, 1);
    else if (len < 65536) this.sized(0xc5, len, 2);
    else this.sized(0xc6, len, 4);
    this.raw(bytes);
  }

  arrayHeader(len: number): void {
    if (len < 16) this.byte(0x90 | len);
    else if (len < 65536) this.sized(0xdc, len, 2);
    else this.sized(0xdd, len, 4);
  }

  mapHeader(len: number): void {
    if (len < 16) this.byte(0x80 | len);
    else if (len < 65536) this.sized(0xde, len, 2);
    else this.sized(0xdf, len, 4);
  }

  /**
   * Any plain value: null/undefined → nil, integral number → int, other number → float64, bigint → int,
   * Uint8Array → bin, array → array, plain object → map (own keys in insertion order).
   */
  value(v: unknown): void {
    if (v === null || v === undefined) this.nil();
    else if (typeof v === "boolean") this.bool(v);
    else if (typeof v === "number") {
      if (Number.isInteger(v)) this.int(v);
      else this.float64(v);
    } else if (typeof v === "bigint") this.bigint(v);
    else if (typeof v === "string") this.str(v);
    else if (v instanceof Uint8Array) this.bin(v);
    else if (Array.isArray(v)) {
      this.arrayHeader(v.length);
      for (const item of v) this.value(item);
    } else if (typeof v === "object" && Object.getPrototypeOf(v) === Object.prototype) {
      const keys = Object.keys(v);
      this.mapHeader(keys.length);
      for (const k of keys) {
        this.str(k);
        this.value((v as Record<string, unknown>)[k]);
      }
    } else {
      throw new TypeError(`msgpack: cannot encode a value of type ${typeof v}`);
    }
  }

  private sized(head: number, len: number, width: 1 | 2 | 4): void {
    this.ensure(1 + width);
    this.buf[this.pos] = head;
    if (width === 1) this.buf[this.pos + 1] = len;
    else if (width === 2) this.view.setUint16(this.pos + 1, len);
    else this.view.setUint32(this.pos + 1, len);
    this.pos += 1 + width;
  }

  private raw(bytes: Uint8Array): void {
    this.ensure(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }
}
