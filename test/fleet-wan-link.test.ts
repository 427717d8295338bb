// The links between regions: P/D KV transfers across regions share one link per pair, FIFO, plus a round trip.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { resolveLocality } from "../src/sim/fleet/locality.ts";
import { WanLink } from "../src/sim/fleet/wan-link.ts";

const origins = [{ region: "a" }, { region: "b" }];

describe("inter-region link (wan-link.ts)", () => {
  it("queues transfers between a pair first come first served, in either direction, and adds a round trip", () => {
    const cfg = resolveLocality({ rttMs: { "a/b": 40 }, bandwidthGbps: { "a/b": 8 }, origins }, ["a", "b"]);
    const wan = new WanLink(cfg.bandwidth, cfg.oneWay);
    // 8 Gb/s = 1 GB/s: 0.5 GB takes 0.5 s on the wire, then 40 ms.
    assert.equal(wan.transfer("a", "b", 0.5e9, 10), 10.54);
    // The other direction shares the link: it starts when the first leaves it (10.5).
    assert.ok(Math.abs(wan.transfer("b", "a", 0.25e9, 10.1) - (10.5 + 0.25 + 0.04)) < 1e-9);
    assert.ok(Math.abs(wan.stats.queuedSeconds - 0.4) < 1e-9);
    assert.equal(wan.stats.transfers, 2);
    // A later transfer after the link went idle waits for nothing.
    assert.ok(Math.abs(wan.transfer("a", "b", 1e9, 20) - 21.04) < 1e-9);
  });

  it("a pair without a bandwidth pays the round trip only; bad pairs are errors that say what to write", () => {
    const cfg = resolveLocality({ rttMs: { "a/b": 40 }, origins }, ["a", "b"]);
    assert.equal(new WanLink(cfg.bandwidth, cfg.oneWay).transfer("a", "b", 1e12, 5), 5.04);
    assert.throws(
      () => resolveLocality({ rttMs: { "a/b": 40 }, bandwidthGbps: { "a/c": 10 }, origins }, ["a", "b"]),
      /no pool or origin is in region c/,
    );
    assert.throws(
      () => resolveLocality({ rttMs: { "a/b": 40 }, bandwidthGbps: { "a-b": 10 }, origins }, ["a", "b"]),
      /must be "regionA\/regionB"/,
    );
  });
});
