/**
 * xxHash64 and llm-d's whole prefix block chain in one WebAssembly call. The per-block path calls
 * xxhash-wasm twice per block, and every call pays a JS↔wasm boundary plus BigInt conversions
 * (~80 ns, about 3× the hashing of a 256-byte block); here the prompt is copied into wasm memory
 * once and one call hashes every block:
 *   b_i = xxh64(block_i, seed 0),  h_i = xxh64(LE64(b_i) || LE64(h_{i-1}), seed 0)
 * The module is assembled below from a readable instruction list (no binary blob, no build step);
 * test/scheduler-hash-chain.test.ts checks it bit for bit against xxhash-wasm.
 */

// ---- a minimal WebAssembly assembler: just the opcodes used below ----

type Bytes = number[];

function uleb(n: number): Bytes {
  const out: Bytes = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

function sleb(v: bigint): Bytes {
  const out: Bytes = [];
  for (;;) {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    const done = (v === 0n && (b & 0x40) === 0) || (v === -1n && (b & 0x40) !== 0);
    out.push(done ? b : b | 0x80);
    if (done) return out;
  }
}

const I32 = 0x7f;
const I64 = 0x7e;
const VOID = 0x40;

/** Instruction helpers: each returns the encoded bytes of one instruction. */
const op = {
  get: (i: number) => [0x20, ...uleb(i)],
  set: (i: number) => [0x21, ...uleb(i)],
  tee: (i: number) => [0x22, ...uleb(i)],
  call: (f: number) => [0x10, ...uleb(f)],
  i32: (v: number) => [0x41, ...sleb(BigInt(v | 0))],
  i64: (v: bigint) => [0x42, ...sleb(BigInt.asIntN(64, v))],
  block: [0x02, VOID],
  loop: [0x03, VOID],
  if: [0x04, VOID],
  else: [0x05],
  end: [0x0b],
  br: (d: number) => [0x0c, ...uleb(d)],
  brIf: (d: number) => [0x0d, ...uleb(d)],
  select: [0x1b],
  i64Load: (offset: number) => [0x29, 0x03, ...uleb(offset)],
  i64Load32u: [0x35, 0x02, 0x00],
  i64Load8u: [0x31, 0x00, 0x00],
  i64Store: (offset: number) => [0x37, 0x03, ...uleb(offset)],
  i32Eq: [0x46],
  i32Eqz: [0x45],
  i32Add: [0x6a],
  i32Sub: [0x6b],
  i32And: [0x71],
  i32Shl: [0x74],
  i32LtU: [0x49],
  i32GtU: [0x4b],
  i32LeU: [0x4d],
  i32GeU: [0x4f],
  i64Add: [0x7c],
  i64Sub: [0x7d],
  i64Mul: [0x7e],
  i64Xor: [0x85],
  i64ShrU: [0x88],
  i64Rotl: [0x89],
  i64ExtendI32U: [0xad],
};

const P1 = 0x9e3779b185ebca87n;
const P2 = 0xc2b2ae3d27d4eb4fn;
const P3 = 0x165667b19e3779f9n;
const P4 = 0x85ebca77c2b2ae63n;
const P5 = 0x27d4eb2f165667c5n;

// Function indices (no imports, so they start at 0) and their signatures.
const F_XXH64 = 0; // (ptr i32, len i32, seed i64) -> i64
const F_CHAIN = 1; // (src i32, len i32, blockBytes i32, maxBlocks i32, out i32, prev i64) -> i32 blocks

/**
 * rotl(acc + lane·P2, 31)·P1 with acc already on the stack and `lane` pushing the lane. Always
 * inlined: a wasm call per round cost ~1 µs per 8k-token prompt (bench:picker).
 */
function laneRound(lane: Bytes): Bytes[] {
  return [lane, op.i64(P2), op.i64Mul, op.i64Add, op.i64(31n), op.i64Rotl, op.i64(P1), op.i64Mul];
}

/** h = rotl(h ^ x, r)·m + a, with x already on the stack; `h` is a local. */
function mix(h: number, r: bigint, m: bigint, a: bigint | null): Bytes[] {
  const add = a === null ? [] : [op.i64(a), op.i64Add];
  return [op.get(h), op.i64Xor, op.i64(r), op.i64Rotl, op.i64(m), op.i64Mul, ...add, op.set(h)];
}

// biome-ignore format: one instruction group per line
/**
 * The 32-byte stripes from local `p` while p ≤ local `limit` (at least one), into the lane locals
 * v, v+1, v+2, v+3 (seeded by the caller); advances p. Then local h = the lanes converged and merged.
 */
function stripes(p: number, limit: number, v: number, h: number): Bytes[] {
  return [
    op.loop,
    op.get(v), ...laneRound([...op.get(p), ...op.i64Load(0)]), op.set(v),
    op.get(v + 1), ...laneRound([...op.get(p), ...op.i64Load(8)]), op.set(v + 1),
    op.get(v + 2), ...laneRound([...op.get(p), ...op.i64Load(16)]), op.set(v + 2),
    op.get(v + 3), ...laneRound([...op.get(p), ...op.i64Load(24)]), op.set(v + 3),
    op.get(p), op.i32(32), op.i32Add, op.tee(p), op.get(limit), op.i32LeU, op.brIf(0),
    op.end,
    //  h = rotl(v1,1) + rotl(v2,7) + rotl(v3,12) + rotl(v4,18), then merge v1..v4
    op.get(v), op.i64(1n), op.i64Rotl,
    op.get(v + 1), op.i64(7n), op.i64Rotl, op.i64Add,
    op.get(v + 2), op.i64(12n), op.i64Rotl, op.i64Add,
    op.get(v + 3), op.i64(18n), op.i64Rotl, op.i64Add,
    op.set(h),
    ...[v, v + 1, v + 2, v + 3].flatMap((x) => [
      op.get(h), op.i64(0n), ...laneRound(op.get(x)), op.i64Xor, op.i64(P1), op.i64Mul, op.i64(P4), op.i64Add, op.set(h),
    ]),
  ];
}

// biome-ignore format: one instruction group per line
/** Seeds the lane locals v..v+3 with `seed` (pushed by `seed`). */
function seedLanes(seed: Bytes, v: number): Bytes[] {
  return [
    seed, op.i64(P1 + P2), op.i64Add, op.set(v),
    seed, op.i64(P2), op.i64Add, op.set(v + 1),
    seed, op.set(v + 2),
    seed, op.i64(P1), op.i64Sub, op.set(v + 3),
  ];
}

// biome-ignore format: one instruction group per line
/** xxh64's final avalanche of local h, left on the stack. */
function avalanche(h: number): Bytes[] {
  return [
    op.get(h), op.get(h), op.i64(33n), op.i64ShrU, op.i64Xor, op.i64(P2), op.i64Mul, op.set(h),
    op.get(h), op.get(h), op.i64(29n), op.i64ShrU, op.i64Xor, op.i64(P3), op.i64Mul, op.set(h),
    op.get(h), op.get(h), op.i64(32n), op.i64ShrU, op.i64Xor,
  ];
}

// biome-ignore format: one instruction group per line
// xxh64(p=0, len=1, seed=2); locals: end=3 i32, limit=4 i32, v1..v4=5..8 i64, h=9 i64.
const xxh64: Bytes[] = [
  op.get(0), op.get(1), op.i32Add, op.set(3),
  op.get(1), op.i32(32), op.i32GeU,
  op.if,
  ...seedLanes(op.get(2), 5),
  op.get(3), op.i32(32), op.i32Sub, op.set(4),
  ...stripes(0, 4, 5, 9),
  op.else,
  op.get(2), op.i64(P5), op.i64Add, op.set(9),
  op.end,
  op.get(9), op.get(1), op.i64ExtendI32U, op.i64Add, op.set(9),
  //  8-byte lanes
  op.block,
  op.loop,
  op.get(0), op.i32(8), op.i32Add, op.get(3), op.i32GtU, op.brIf(1),
  op.i64(0n), ...laneRound([...op.get(0), ...op.i64Load(0)]), ...mix(9, 27n, P1, P4),
  op.get(0), op.i32(8), op.i32Add, op.set(0),
  op.br(0),
  op.end,
  op.end,
  //  one 4-byte lane
  op.get(0), op.i32(4), op.i32Add, op.get(3), op.i32LeU,
  op.if,
  op.get(0), op.i64Load32u, op.i64(P1), op.i64Mul, ...mix(9, 23n, P2, P3),
  op.get(0), op.i32(4), op.i32Add, op.set(0),
  op.end,
  //  single bytes
  op.block,
  op.loop,
  op.get(0), op.get(3), op.i32GeU, op.brIf(1),
  op.get(0), op.i64Load8u, op.i64(P5), op.i64Mul, ...mix(9, 11n, P1, null),
  op.get(0), op.i32(1), op.i32Add, op.set(0),
  op.br(0),
  op.end,
  op.end,
  ...avalanche(9),
];

// biome-ignore format: one instruction group per line
/**
 * chain(src=0, len=1, bb=2, maxBlocks=3, out=4, prev=5); locals: i=6, off=7, n=8, p=9, limit=10
 * (i32), h=11, v1..v4=12..15 (i64). A whole block whose size is a multiple of 32 (vLLM's 16-token
 * blocks are 64 bytes) is hashed inline: xxh64 reduced to its stripes, no tail, no call (about a
 * tenth off chain() for an 8k-token prompt); any other block calls xxh64. Then the 16-byte pair
 * hash, unrolled (seed 0, two 8-byte lanes: b_i, then prev).
 */
const chain: Bytes[] = [
  op.block,
  op.loop,
  op.get(7), op.get(1), op.i32GeU, op.brIf(1),
  op.get(6), op.get(3), op.i32GeU, op.brIf(1),
  //  n = min(len − off, bb)
  op.get(2), op.get(1), op.get(7), op.i32Sub, op.tee(8), op.get(8), op.get(2), op.i32GtU, op.select, op.set(8),
  //  h = xxh64(src + off, n, 0)
  op.get(8), op.get(2), op.i32Eq, op.get(2), op.i32(31), op.i32And, op.i32Eqz, op.i32And,
  op.if,
  op.get(0), op.get(7), op.i32Add, op.tee(9), op.get(2), op.i32Add, op.i32(32), op.i32Sub, op.set(10),
  ...seedLanes(op.i64(0n), 12),
  ...stripes(9, 10, 12, 11),
  op.get(11), op.get(2), op.i64ExtendI32U, op.i64Add, op.set(11),
  ...avalanche(11), op.set(11),
  op.else,
  op.get(0), op.get(7), op.i32Add, op.get(8), op.i64(0n), op.call(F_XXH64), op.set(11),
  op.end,
  //  prev = pair hash: h' = P5 + 16; h' = rotl(h' ^ round(0, h), 27)·P1 + P4; same with prev; avalanche
  op.i64(0n), ...laneRound(op.get(11)), op.set(12),
  op.i64(P5 + 16n), op.set(11),
  op.get(12), ...mix(11, 27n, P1, P4),
  op.i64(0n), ...laneRound(op.get(5)), ...mix(11, 27n, P1, P4),
  ...avalanche(11), op.set(5),
  //  out[i] = prev; i++; off += bb
  op.get(4), op.get(6), op.i32(3), op.i32Shl, op.i32Add, op.get(5), op.i64Store(0),
  op.get(6), op.i32(1), op.i32Add, op.set(6),
  op.get(7), op.get(2), op.i32Add, op.set(7),
  op.br(0),
  op.end,
  op.end,
  op.get(6),
];

function section(id: number, body: Bytes): Bytes {
  return [id, ...uleb(body.length), ...body];
}

function vec(items: Bytes[]): Bytes {
  return [...uleb(items.length), ...items.flat()];
}

function str(s: string): Bytes {
  return [...uleb(s.length), ...[...s].map((c) => c.charCodeAt(0))];
}

function funcBody(locals: [count: number, type: number][], code: Bytes[]): Bytes {
  const body = [...vec(locals.map(([n, t]) => [...uleb(n), t])), ...code.flat(), ...op.end];
  return [...uleb(body.length), ...body];
}

/** The module's bytes: memory "mem", functions "xxh64" and "chain". */
export function xxh64ChainModuleBytes(): Uint8Array {
  const types = vec([
    [0x60, ...vec([[I32], [I32], [I64]]), ...vec([[I64]])],
    [0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [I64]]), ...vec([[I32]])],
  ]);
  const funcs = vec([uleb(0), uleb(1)]);
  const memory = vec([[0x00, ...uleb(1)]]);
  const exports = vec([
    [...str("mem"), 0x02, 0],
    [...str("xxh64"), 0x00, F_XXH64],
    [...str("chain"), 0x00, F_CHAIN],
  ]);
  const code = vec([
    funcBody(
      [
        [2, I32],
        [5, I64],
      ],
      xxh64,
    ),
    funcBody(
      [
        [5, I32],
        [5, I64],
      ],
      chain,
    ),
  ]);
  return new Uint8Array([
    0x00,
    0x61,
    0x73,
    0x6d,
    0x01,
    0x00,
    0x00,
    0x00,
    ...section(1, types),
    ...section(3, funcs),
    ...section(5, memory),
    ...section(7, exports),
    ...section(10, code),
  ]);
}

/** The slice of the WebAssembly JS API used here (its types live in the DOM lib, not in ES2023). */
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: object };
};

interface ChainExports {
  mem: { readonly buffer: ArrayBuffer; grow(pages: number): number };
  xxh64(ptr: number, len: number, seed: bigint): bigint;
  chain(src: number, len: number, blockBytes: number, maxBlocks: number, out: number, prev: bigint): number;
}

const PAGE = 65536;
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** One wasm instance with its own memory; synchronous; not reentrant (single-threaded use). */
export class Xxh64Chain {
  readonly #x: ChainExports;
  #u8: Uint8Array;
  #u32: Uint32Array;
  #view: DataView;
  /** Blocks hashed by the last #run. */
  #count = 0;

  constructor() {
    const instance = new WebAssembly.Instance(new WebAssembly.Module(xxh64ChainModuleBytes()), {});
    this.#x = instance.exports as unknown as ChainExports;
    this.#u8 = new Uint8Array(this.#x.mem.buffer);
    this.#u32 = new Uint32Array(this.#x.mem.buffer);
    this.#view = new DataView(this.#x.mem.buffer);
  }

  /** xxHash64 of `bytes` with `seed`, unsigned. */
  h64(bytes: Uint8Array, seed = 0n): bigint {
    this.#reserve(bytes.length);
    this.#u8.set(bytes, 0);
    return BigInt.asUintN(64, this.#x.xxh64(0, bytes.length, BigInt.asIntN(64, seed)));
  }

  /**
   * The chained hashes of blocks `first`, `first+1`, … of `bytes` (`blockBytes` each, the last one
   * possibly partial), up to block `maxBlocks − 1`, as PackedHashes (int32 halves); `prev` is the parent
   * hash of block `first` (h0 for block 0).
   */
  chain(bytes: Uint8Array, blockBytes: number, maxBlocks: number, first: number, prev: bigint): number[] {
    const out = this.#run(bytes, blockBytes, maxBlocks, first, prev);
    const n = this.#count;
    // Copied into a plain array of int32 halves (small integers to V8: no boxing, no double
    // array): a typed-array copy (slice) of this size gets an off-heap backing store, which costs
    // ~1 µs, several times that right after a scavenge (bench:picker).
    const hashes = new Array<number>(2 * n);
    if (LITTLE_ENDIAN) {
      const u32 = this.#u32;
      for (let k = 0, at = out >>> 2; k < 2 * n; k++) hashes[k] = u32[at + k] | 0;
    } else {
      for (let k = 0; k < 2 * n; k++) hashes[k] = this.#view.getInt32(out + 4 * k, true);
    }
    return hashes;
  }

  /**
   * chain()'s hashes as a view of this instance's memory (int32 halves, low half first), for a
   * caller that copies them into its own storage at once: valid only until the next call on this
   * instance. Null on a big-endian host (use chain()).
   */
  chainView(
    bytes: Uint8Array,
    blockBytes: number,
    maxBlocks: number,
    first: number,
    prev: bigint,
  ): Int32Array | null {
    if (!LITTLE_ENDIAN) return null;
    const out = this.#run(bytes, blockBytes, maxBlocks, first, prev);
    return new Int32Array(this.#x.mem.buffer, out, 2 * this.#count);
  }

  /** Hashes the blocks (see chain) into this instance's memory; returns the hashes' byte offset, their count in #count. */
  #run(bytes: Uint8Array, blockBytes: number, maxBlocks: number, first: number, prev: bigint): number {
    const start = first * blockBytes;
    this.#count = 0;
    if (start >= bytes.length || first >= maxBlocks) return 0;
    const blocks = Math.min(Math.ceil((bytes.length - start) / blockBytes), maxBlocks - first);
    const len = Math.min(bytes.length - start, blocks * blockBytes);
    const outBytes = blocks * 8;
    let src: number;
    let out: number;
    if (bytes.buffer === this.#x.mem.buffer) {
      // Written into scratch() by the caller: hash in place, hashes right after the input.
      src = bytes.byteOffset + start;
      out = (bytes.byteOffset + bytes.length + 7) & ~7;
      this.#reserve(out + outBytes);
    } else {
      src = outBytes;
      out = 0;
      this.#reserve(outBytes + len);
      this.#u8.set(bytes.subarray(start, start + len), outBytes);
    }
    this.#count = this.#x.chain(src, len, blockBytes, blocks, out, BigInt.asIntN(64, prev));
    return out;
  }

  /**
   * A view of this instance's memory, at least `bytes` long, for a caller to write chain() input
   * into (from offset 0) instead of having chain() copy it; bytes already written survive a later
   * scratch() call that grows the memory. Any other call on this instance may overwrite it.
   */
  scratch(bytes: number): Uint8Array {
    this.#reserve(bytes);
    return this.#u8;
  }

  #reserve(bytes: number): void {
    const mem = this.#x.mem;
    if (bytes <= mem.buffer.byteLength) return;
    mem.grow(Math.ceil((bytes - mem.buffer.byteLength) / PAGE));
    this.#u8 = new Uint8Array(mem.buffer);
    this.#u32 = new Uint32Array(mem.buffer);
    this.#view = new DataView(mem.buffer);
  }
}
