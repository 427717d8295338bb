// Tests for the msgspec-compatible msgpack writer: every int/str/bin/array/map boundary of the msgpack spec
// (https://github.com/msgpack/msgpack/blob/master/spec.md) and agreement with @msgpack/msgpack's decoder.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Decoder } from "@msgpack/msgpack";
import { MsgpackWriter } from "../src/kv/msgpack-writer.ts";

const hex = (u: Uint8Array): string => Buffer.from(u).toString("hex");

function enc(fn: (w: MsgpackWriter) => void): string {
  const w = new MsgpackWriter(1); // tiny initial capacity exercises growth
  fn(w);
  return hex(w.finish());
}

test("ints use the shortest form: unsigned types for >= 0, signed for < 0 (as msgspec)", () => {
  const cases: [bigint, string][] = [
    [0n, "00"],
    [127n, "7f"],
    [128n, "cc80"],
    [255n, "ccff"],
    [256n, "cd0100"],
    [65535n, "cdffff"],
    [65536n, "ce00010000"],
    [4294967295n, "ceffffffff"],
    [4294967296n, "cf0000000100000000"],
    [(1n << 63n) - 1n, "cf7fffffffffffffff"],
    [(1n << 63n) + 5n, "cf8000000000000005"],
    [(1n << 64n) - 1n, "cfffffffffffffffff"],
    [-1n, "ff"],
    [-32n, "e0"],
    [-33n, "d0df"],
    [-128n, "d080"],
    [-129n, "d1ff7f"],
    [-32768n, "d18000"],
    [-32769n, "d2ffff7fff"],
    [-2147483648n, "d280000000"],
    [-2147483649n, "d3ffffffff7fffffff"],
    [-(1n << 63n), "d38000000000000000"],
  ];
  for (const [v, want] of cases) {
    assert.equal(
      enc((w) => w.bigint(v)),
      want,
      `bigint ${v}`,
    );
    if (v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER)) {
      assert.equal(
        enc((w) => w.int(Number(v))),
        want,
        `number ${v}`,
      );
    }
  }
});

test("ints outside 64 bits and fractional ints are refused", () => {
  assert.throws(() => enc((w) => w.bigint(1n << 64n)), RangeError);
  assert.throws(() => enc((w) => w.bigint(-(1n << 63n) - 1n)), RangeError);
  assert.throws(() => enc((w) => w.int(1.5)), RangeError);
});

test("floats are always float64, even when integral", () => {
  assert.equal(
    enc((w) => w.float64(1.5)),
    "cb3ff8000000000000",
  );
  assert.equal(
    enc((w) => w.float64(1700000000.5)),
    "cb41d954fc40200000",
  );
  assert.equal(
    enc((w) => w.float64(2)),
    "cb4000000000000000",
  );
});

test("str, bin, array and map headers switch width at the spec boundaries", () => {
  const s = (n: number): string => "x".repeat(n);
  assert.equal(enc((w) => w.str(s(31))).slice(0, 2), "bf");
  assert.equal(enc((w) => w.str(s(32))).slice(0, 4), "d920");
  assert.equal(enc((w) => w.str(s(255))).slice(0, 4), "d9ff");
  assert.equal(enc((w) => w.str(s(256))).slice(0, 6), "da0100");
  assert.equal(enc((w) => w.str(s(65536))).slice(0, 10), "db00010000");
  // Non-ASCII: the header counts UTF-8 bytes, not UTF-16 units.
  assert.equal(
    enc((w) => w.str("é")),
    "a2c3a9",
  );
  assert.equal(
    enc((w) => w.bin(new Uint8Array([1, 2]))),
    "c4020102",
  );
  assert.equal(enc((w) => w.bin(new Uint8Array(256))).slice(0, 6), "c50100");
  assert.equal(enc((w) => w.bin(new Uint8Array(65536))).slice(0, 10), "c600010000");
  assert.equal(
    enc((w) => w.arrayHeader(15)),
    "9f",
  );
  assert.equal(
    enc((w) => w.arrayHeader(16)),
    "dc0010",
  );
  assert.equal(
    enc((w) => w.arrayHeader(65536)),
    "dd00010000",
  );
  assert.equal(
    enc((w) => w.mapHeader(15)),
    "8f",
  );
  assert.equal(
    enc((w) => w.mapHeader(16)),
    "de0010",
  );
  assert.equal(
    enc((w) => w.mapHeader(65536)),
    "df00010000",
  );
});

test("value() round-trips through @msgpack/msgpack for random nested values", () => {
  const dec = new Decoder({ useBigInt64: true });
  let seed = 12345;
  const rnd = (): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed / 4294967296;
  };
  const gen = (depth: number): unknown => {
    const k = Math.floor(rnd() * (depth > 2 ? 6 : 8));
    switch (k) {
      case 0:
        return null;
      case 1:
        return rnd() < 0.5;
      case 2:
        return Math.floor((rnd() - 0.5) * 2 ** 33) | 0; // int32
      case 3:
        return rnd() * 1e6 + 0.25; // fractional float
      case 4:
        return "s".repeat(Math.floor(rnd() * 300)) + (rnd() < 0.3 ? "ü" : "");
      case 5:
        return (1n << 32n) + BigInt(Math.floor(rnd() * 2 ** 31)) * (1n << 32n);
      case 6:
        return Array.from({ length: Math.floor(rnd() * 20) }, () => gen(depth + 1));
      default:
        return { a: gen(depth + 1), b: gen(depth + 1) };
    }
  };
  for (let i = 0; i < 2000; i++) {
    const v = gen(0);
    const w = new MsgpackWriter(4);
    w.value(v);
    assert.deepEqual(dec.decode(w.finish()), v);
  }
});
