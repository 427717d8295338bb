/**
 * The fleet simulator's KV link: FIFO per decoder NIC, one handshake per (decoder, prefiller)
 * pair that delays only that pair, overhead after the bytes land, and bytes/bandwidth on the wire.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { KvLink, kvLinkConfig } from "../src/sim/fleet/kv-link.ts";

describe("KvLink", () => {
  it("one transfer takes bytes/bandwidth plus the overhead", () => {
    const l = new KvLink(kvLinkConfig("rdma", { bandwidthGBps: 8, overheadMs: 5, handshakeS: 0 }));
    assert.equal(l.readyAt("d", "p", 1), 1);
    const done = l.start("d", 80e6, 1);
    assert.ok(Math.abs(done - (1 + 0.01 + 0.005)) < 1e-12);
    assert.equal(l.stats.bytes, 80e6);
  });

  it("the first contact of a pair waits for the handshake once; other pairs are not held by it", () => {
    const l = new KvLink(kvLinkConfig("rdma", { handshakeS: 5 }));
    assert.equal(l.readyAt("d", "p", 0), 5);
    assert.equal(l.readyAt("d", "p", 1), 5, "a second request during the handshake waits for the same end");
    assert.equal(l.readyAt("d", "p", 7), 7, "after it, no wait");
    assert.equal(l.readyAt("d", "q", 7), 12, "a new prefiller shakes hands of its own");
    assert.equal(l.stats.handshakes, 2);
  });

  it("transfers into one decoder queue behind each other; another decoder's NIC is free", () => {
    const l = new KvLink(kvLinkConfig("tcp", { bandwidthGBps: 1, overheadMs: 0, handshakeS: 0 }));
    const a = l.start("d", 1e9, 0);
    const b = l.start("d", 1e9, 0.5);
    const c = l.start("e", 1e9, 0.5);
    assert.equal(a, 1);
    assert.equal(b, 2);
    assert.equal(c, 1.5);
    assert.equal(l.stats.queuedSeconds, 0.5);
  });

  it("TCP defaults are slower than RDMA for the same bytes", () => {
    const r = new KvLink(kvLinkConfig("rdma")).start("d", 2e8, 0);
    const t = new KvLink(kvLinkConfig("tcp")).start("d", 2e8, 0);
    assert.ok(t > r);
  });

  it("a NIC never carries more than its bandwidth: n transfers end no sooner than Σ bytes / bandwidth", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 1e9 }), fc.double({ min: 0, max: 10, noNaN: true })), {
          minLength: 1,
          maxLength: 20,
        }),
        (xs) => {
          const l = new KvLink(kvLinkConfig("rdma", { bandwidthGBps: 2, overheadMs: 0, handshakeS: 0 }));
          xs.sort((a, b) => a[1] - b[1]);
          let last = 0;
          for (const [bytes, at] of xs) {
            const done = l.start("d", bytes, at);
            assert.ok(done >= last, "FIFO: completions in start order");
            last = done;
          }
          const total = xs.reduce((s, x) => s + x[0], 0);
          assert.ok(last >= xs[0][1] + total / 2e9 - 1e-9);
        },
      ),
    );
  });

  it("rejects a bandwidth that is not positive, naming the unit", () => {
    assert.throws(() => kvLinkConfig("rdma", { bandwidthGBps: 0 }), /GB\/s/);
  });
});

describe("KvLink lanes", () => {
  it("a TP4 decoder pulls from four TP1 prefillers at once, one NIC each, and a fifth waits", () => {
    const l = new KvLink(kvLinkConfig("rdma", { bandwidthGBps: 1, overheadMs: 0, handshakeS: 0 }));
    const ends = [0, 1, 2, 3, 4].map(() => l.start("d", 1e9, 0, 0, 1, 4));
    assert.deepEqual(ends, [1, 1, 1, 1, 2]);
  });

  it("a TP4 → TP4 transfer splits over the four NICs", () => {
    const l = new KvLink(kvLinkConfig("rdma", { bandwidthGBps: 1, overheadMs: 0, handshakeS: 0 }));
    assert.equal(l.start("d", 4e9, 0, 0, 4, 4), 1);
    assert.equal(l.start("d", 1e9, 0, 0, 1, 4), 2, "queued behind it on every NIC");
  });
});
