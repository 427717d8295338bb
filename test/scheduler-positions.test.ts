// CycleState.positions(): id → position indexes kept across requests, rebuilt only on change.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { IndexCache } from "../src/scheduler/candidate-index.ts";
import { Cycle } from "../src/scheduler/cycle.ts";
import { createRng } from "../src/scheduler/rng.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState } from "../src/scheduler/types.ts";

const pool = Array.from({ length: 40 }, (_, i) => endpoint(`10.0.0.${i}:8000`));
const cycle = (eps: readonly EndpointState[], cache: IndexCache) =>
  new Cycle(completion("r", "p"), eps, 0, createRng(1), cache);

function check(eps: readonly EndpointState[], positions: { indexOf(id: string): number }): void {
  for (const [i, e] of eps.entries()) assert.equal(positions.indexOf(e.id), i, e.id);
  assert.equal(positions.indexOf("nowhere:1"), -1);
}

describe("CycleState.positions", () => {
  it("indexes the candidate list once and reuses it while the list holds the same objects", () => {
    const cache = new IndexCache();
    for (let k = 0; k < 3; k++) {
      const eps = [...pool]; // a fresh array per request, as the datastore hands out
      const p = cycle(eps, cache).positions(eps);
      assert.ok(p !== null);
      check(eps, p);
    }
    assert.equal(cache.candidates.rebuilds, 1);
    const shuffled = [...pool].reverse();
    const p = cycle(shuffled, cache).positions(shuffled);
    assert.ok(p !== null);
    check(shuffled, p);
    assert.equal(cache.candidates.rebuilds, 2);
    const fewer = pool.slice(5);
    check(fewer, cycle(fewer, cache).positions(fewer) as NonNullable<ReturnType<Cycle["positions"]>>);
    assert.equal(cache.candidates.rebuilds, 3);
  });

  it("indexes another list from its second sighting on, and follows in-place changes", () => {
    const cache = new IndexCache();
    const subset = pool.filter((_, i) => i % 2 === 0);
    assert.equal(cycle(pool, cache).positions(subset), null, "first sighting: scan instead");
    const p = cycle(pool, cache).positions(subset);
    assert.ok(p !== null);
    check(subset, p);
    subset.reverse(); // nobody should, but a changed list must not get stale answers
    check(subset, cycle(pool, cache).positions(subset) as NonNullable<typeof p>);
  });

  it("keeps no index for short lists (a scan is cheaper)", () => {
    const cache = new IndexCache();
    const few = pool.slice(0, 10);
    const c = cycle(pool, cache);
    assert.equal(c.positions(few), null);
    assert.equal(c.positions(few), null);
    assert.ok(cycle(few, cache).positions(few) !== null, "the candidate list itself always has one");
  });

  it("answers the first occurrence when an id repeats", () => {
    const cache = new IndexCache();
    const eps = [pool[0], pool[1], pool[0]];
    const p = cycle(eps, cache).positions(eps);
    assert.equal(p?.indexOf(pool[0].id), 0);
  });
});
