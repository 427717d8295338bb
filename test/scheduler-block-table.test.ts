// The prefix index's open-addressing hash table against a Map, with clustered keys, growth,
// deletions that wrap around the table end, and re-adds.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockTable } from "../src/scheduler/plugins/prefix/block-table.ts";
import { createRng } from "../src/scheduler/rng.ts";

describe("BlockTable", () => {
  for (const [name, lowBits] of [
    ["random hashes", 32],
    ["low halves crowded into five probe starts across the table's end (long runs, wrap-around)", 4],
  ] as const) {
    it(`agrees with a Map under random adds and deletes: ${name}`, () => {
      const rng = createRng(lowBits);
      const t = new BlockTable();
      const ref = new Map<string, { lo: number; hi: number; b: number }>();
      const keys: { lo: number; hi: number }[] = [];
      for (let step = 0; step < 30000; step++) {
        const r = rng.next();
        if (r < 0.55 || ref.size === 0) {
          // Low halves near the table's end as well as its start, so probe runs wrap.
          const lo =
            lowBits === 32
              ? rng.int(2 ** 32) | 0
              : (rng.int(2 ** 20) << 12) | [4093, 4094, 4095, 0, 1][rng.int(5)];
          const hi = rng.int(2 ** 32) | 0;
          const k = `${lo},${hi}`;
          if (ref.has(k)) continue;
          const b = step;
          t.add(lo, hi, b);
          ref.set(k, { lo, hi, b });
          keys.push({ lo, hi });
        } else if (r < 0.85) {
          const { lo, hi } = keys[rng.int(keys.length)];
          t.delete(lo, hi);
          ref.delete(`${lo},${hi}`);
        } else {
          const { lo, hi } = keys[rng.int(keys.length)];
          assert.equal(t.get(lo, hi), ref.get(`${lo},${hi}`)?.b ?? -1, `step ${step}`);
        }
        if (step % 1000 === 999) {
          assert.equal(t.size, ref.size);
          for (const { lo, hi, b } of ref.values()) assert.equal(t.get(lo, hi), b, `step ${step}`);
        }
      }
      assert.equal(t.get(12345, 67890), -1);
    });
  }
});
