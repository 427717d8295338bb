// spreadHotPrefixes: the affinity filter gives a prefix more homes while the requests sent to its
// holders exceed their fair shares of the pool's and its own requests would give each home `margin`
// of a share, and the decayed counts behind it (hot-prefixes.ts).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { PrefixMatchInfo } from "../src/scheduler/plugins/data.ts";
import { packedKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import { PrefixRates } from "../src/scheduler/plugins/filters/hot-prefixes.ts";
import {
  affinityParams,
  PrefixCacheAffinityFilter,
} from "../src/scheduler/plugins/filters/prefix-affinity.ts";
import { completion, cycleFor, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState } from "../src/scheduler/types.ts";

const pool = ["a:1", "b:1", "c:1", "d:1"].map((id) => endpoint(id));
const ids = (eps: readonly { id: string }[]) => eps.map((e) => e.id);

/** A number per prefix name, so test prefixes get keys as the producers' are: numbers. */
const names = new Map<string, number>();
const named = (name: string, blocks: number) => {
  if (!names.has(name)) names.set(name, names.size + 1);
  return (names.get(name) as number) * 1_000_000 + blocks;
};

/**
 * A request of `total` blocks whose first blocks are named by `name` and depth (the same for every
 * request of that name), held by each endpoint of `held` to the given depth.
 */
function info(name: string, total: number, held: Record<string, number>): PrefixMatchInfo {
  return {
    totalBlocks: total,
    blockSizeTokens: 64,
    promptTokens: total * 64,
    anyMatch: Object.values(held).some((b) => b > 0),
    matchBlocks: (id) => held[id] ?? 0,
    matches: () => new Map(Object.entries(held).filter(([, b]) => b > 0)),
    prefixKey: (blocks) => (blocks >= 1 && blocks <= total ? named(name, blocks) : undefined),
  };
}

function filter(spread: Record<string, unknown> | null = {}) {
  return new PrefixCacheAffinityFilter(
    "f",
    affinityParams.parse({
      prefixMatchInfoProducerName: "p",
      maxTTFTPenaltyMs: 0,
      ...(spread === null ? {} : { spreadHotPrefixes: spread }),
    }),
  );
}

/** Picks so far from each list of endpoints kept, so each list is picked from in turn. */
const turns = new Map<string, number>();
/** The endpoint route() picked last. */
let picked = "";
/**
 * Filters one request at time `t` (seconds) and picks one of the endpoints kept (or of `pickFrom`,
 * to hold the traffic where it is), in turn for that list, as the load scorers would spread them.
 */
function route(
  f: PrefixCacheAffinityFilter,
  i: PrefixMatchInfo,
  t: number,
  candidates: readonly EndpointState[] = pool,
  pickFrom?: readonly string[],
): string[] {
  const c = cycleFor(completion(`r${t}`, "x"), candidates, t);
  c.set(prefixKey("p"), i);
  const kept = ids(f.filter(c, candidates));
  const from = pickFrom ?? kept;
  const list = from.join(",");
  const turn = turns.get(list) ?? 0;
  turns.set(list, turn + 1);
  const target = candidates.find((e) => e.id === from[turn % from.length]) as EndpointState;
  picked = target.id;
  f.preRequest(c, { target, profiles: {} } as never, t);
  return kept;
}

describe("prefix-cache-affinity-filter, spreadHotPrefixes", () => {
  it("sends a prefix that takes all the traffic to the endpoints without it, once it has been seen enough", () => {
    const f = filter();
    const out: string[][] = [];
    // 10 requests a second, all sharing one 12-block prefix held by a:1, with questions of two
    // lengths: their sticky parts end at blocks 11 and 12, so they share the keys at 1, 2, 4 and 8.
    for (let k = 0; k < 20; k++)
      out.push(route(f, info("sys", k % 2 === 0 ? 13 : 15, { "a:1": 12 }), k / 10));
    // Fewer than minRequests (16) seen: sticky.
    for (const o of out.slice(0, 15)) assert.deepEqual(o, ["a:1"]);
    for (const o of out.slice(16)) assert.deepEqual(o, ["b:1", "c:1", "d:1"]);
    assert.equal(f.decisions["hot-prefix"], out.slice(15).filter((o) => o.length === 3).length);
  });

  it("stops once its homes' fair shares carry it and the other prefixes homed beside it", () => {
    // The prefix is half the pool's requests, two endpoints' fair shares; the other half is spread
    // over all four, half a share each. Two homes are sent three shares, one above theirs (over a
    // margin of 0.6: hot); three are sent three and a half, half a share above (not hot). Its own
    // requests alone, against its homes' shares, would stop at two.
    for (const [held, expected] of [
      [{ "a:1": 9 }, ["b:1", "c:1", "d:1"]],
      [{ "a:1": 9, "b:1": 9 }, ["c:1", "d:1"]],
      [{ "a:1": 9, "b:1": 9, "c:1": 9 }, ["a:1", "b:1", "c:1"]],
    ] as const) {
      const f = filter({ margin: 0.6 });
      let last: string[] = [];
      // Its requests go to its homes all along, whatever the filter says, as they would while the
      // homes are these.
      for (let k = 0; k < 80; k++) {
        const t = k / 10;
        last =
          k % 2 === 0
            ? route(f, info("sys", 10, held), t, pool, Object.keys(held))
            : route(f, info(`other${k}`, 10, {}), t);
        if (k % 2 === 1)
          assert.deepEqual(last, ["a:1", "b:1", "c:1", "d:1"], "an unmatched request keeps all");
      }
      assert.deepEqual(route(f, info("sys", 10, held), 8), expected);
    }
  });

  it("spreads the prefix that needs another home, not one whose home is busy with another's", () => {
    // a:1 holds u (a fifth of the requests, under one endpoint's share) and v (two fifths); the rest
    // are unmatched and spread over all four. a:1 is sent 2.8 shares. Only v's own requests fill a
    // second home to half a share: u stays home, where moving it would hand it around the pool.
    const f = filter();
    for (let k = 0; k < 400; k++) {
      const t = k / 10;
      const slot = k % 10;
      if (slot < 2) assert.deepEqual(route(f, info("u", 10, { "a:1": 9 }), t), ["a:1"], `u at ${t}`);
      else if (slot < 6) route(f, info("v", 10, { "a:1": 9 }), t);
      else route(f, info(`rest${k}`, 10, {}), t);
    }
    assert.ok(f.decisions["hot-prefix"] > 0, "v spreads");
  });

  it("gives a prefix with all the traffic every endpoint, however many there are", () => {
    const many = Array.from({ length: 16 }, (_, k) => endpoint(`e${k}:1`));
    const f = filter();
    const held: Record<string, number> = { "e0:1": 9 };
    for (let k = 0; k < 400; k++) {
      route(f, info("sys", 10, held), k / 10, many);
      // The one picked holds the prefix from then on.
      held[picked] ??= 9;
    }
    assert.equal(Object.keys(held).length, 16);
  });

  it("never spreads prefixes that share the pool evenly", () => {
    // Eight prefixes, two homed on each endpoint, or four, one on each, requested in turn at 40 a
    // second for a minute. Each of the four brings three times the share the others leave per
    // endpoint, but its home is sent no more than its share: the others went elsewhere.
    for (const prefixes of [8, 4]) {
      const f = filter();
      for (let k = 0; k < 2400; k++) {
        const p = k % prefixes;
        const home = pool[p % 4].id;
        assert.deepEqual(route(f, info(`sys${p}`, 10, { [home]: 9 }), k / 40), [home]);
      }
      assert.equal(f.decisions["hot-prefix"], 0);
    }
  });

  it("judges a long conversation by its own blocks, not by the hot system prompt it starts with", () => {
    // All traffic shares an 8-block system prompt held by a:1 alone; conversations of 32 blocks run
    // past it, each held by its home. Their deepest counted depth (16 blocks) is their own.
    const f = filter();
    const convo = (k: number, home: string): PrefixMatchInfo => {
      const i = info(`c${k % 4}`, 32, { "a:1": 8, [home]: 31 });
      const own = i.prefixKey;
      return { ...i, prefixKey: (d) => (d <= 8 ? named("sys", d) : own?.(d)) };
    };
    for (let k = 0; k < 400; k++) {
      const home = pool[k % 4].id;
      assert.deepEqual(route(f, convo(k, home), k / 10), [home]);
    }
    // A short question behind the same system prompt, judged at depth 8, is hot.
    const q = info("sys", 10, { "a:1": 8 });
    const short: PrefixMatchInfo = { ...q, prefixKey: (d) => (d <= 8 ? named("sys", d) : undefined) };
    assert.deepEqual(route(f, short, 40), ["b:1", "c:1", "d:1"]);
  });

  it("forgets a burst: a prefix hot a minute ago is sticky again once its rate has fallen", () => {
    const f = filter();
    for (let k = 0; k < 40; k++) route(f, info("sys", 10, { "a:1": 9 }), k / 10);
    assert.deepEqual(route(f, info("sys", 10, { "a:1": 9 }), 4), ["b:1", "c:1", "d:1"]);
    // Then the pool's traffic moves to other prefixes, one request of "sys" every 10 s among them.
    let last: string[] = [];
    for (let k = 0; k < 1200; k++) {
      const t = 5 + k / 10;
      last = k % 100 === 99 ? route(f, info("sys", 10, { "a:1": 9 }), t) : route(f, info(`o${k}`, 10, {}), t);
    }
    assert.deepEqual(last, ["a:1"]);
  });

  it("is off unless asked for, and refuses a margin that is not above zero", () => {
    const f = filter(null);
    for (let k = 0; k < 100; k++) assert.deepEqual(route(f, info("sys", 10, { "a:1": 9 }), k / 10), ["a:1"]);
    assert.throws(() => affinityParams.parse({ spreadHotPrefixes: { margin: 0 } }), /must be above 0/);
  });
});

describe("packedKey", () => {
  it("names a prompt's first blocks by 53 bits of the last one's [lo, hi] hash pair, nothing past its end", () => {
    const packed = [0x7fff_f800, -1, 21, 22, -2048, 3];
    assert.equal(packedKey(packed, 1), 0xffff_ffff * 2 ** 21 + 0xf_ffff);
    assert.equal(packedKey(packed, 3), 3 * 2 ** 21 + 0x1f_ffff);
    assert.ok(Number.isSafeInteger(packedKey(packed, 1)));
    assert.notEqual(packedKey(packed, 2), packedKey(packed, 3));
    assert.equal(packedKey(packed, 4), undefined);
    assert.equal(packedKey(packed, 0), undefined);
    assert.equal(packedKey(undefined, 1), undefined);
  });
});

describe("PrefixRates", () => {
  it("decays each count with the window's time constant, the pool's too", () => {
    const r = new PrefixRates(30);
    for (let k = 0; k < 10; k++) {
      r.countPick("e", 0);
      r.countPrefix(1, 0);
    }
    assert.equal(r.requests(0), 10);
    assert.ok(Math.abs(r.requests(30) - 10 / Math.E) < 1e-9);
    assert.ok(Math.abs(r.countPrefix(1, 30) - (1 + 10 / Math.E)) < 1e-9);
    // A steady rate reads rate × window.
    const s = new PrefixRates(10);
    for (let k = 0; k < 2000; k++) s.countPick("e", k / 5);
    assert.ok(Math.abs(s.requests(400) - 50) < 1, `${s.requests(400)}`);
  });

  it("sweeps out prefixes that have gone quiet, so a stream of one-off prefixes stays bounded", () => {
    const r = new PrefixRates(1);
    for (let k = 0; k < 100_000; k++) r.countPrefix(k + 10, k);
    assert.ok(r.size <= 4096, `${r.size}`);
    // One still busy is kept through a sweep.
    const b = new PrefixRates(1000);
    for (let k = 0; k < 5000; k++) {
      b.countPrefix(1, k / 100);
      b.countPrefix(k + 10, k / 100);
    }
    assert.ok(b.countPrefix(1, 50) > 1000);
  });
});
