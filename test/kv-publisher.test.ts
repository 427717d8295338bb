// Tests for the simulated replica's ZMQ KV-event publisher against real zeromq sockets on 127.0.0.1:
// live frames and sequence numbers, topic filtering, bind/connect, DP rank, and the replay ROUTER in both
// vLLM layouts (vllm/distributed/kv_events.py before and since v0.26.0, PR #45177).

import assert from "node:assert/strict";
import { test } from "node:test";
import { Dealer, Subscriber } from "zeromq";
import { decodeEventBatch, encodeEventBatch } from "../src/kv/event-codec.ts";
import type { BlockRemoved, KVEventBatch } from "../src/kv/events.ts";
import { kvEventsConfigFromObject } from "../src/sim/kv-events-config.ts";
import {
  endpointBinds,
  KvEventsBindError,
  REPLAY_END_SEQ,
  ZmqEventPublisher,
} from "../src/sim/kv-publisher.ts";
import { randomBatch, rng } from "./helpers/kv-event-fixtures.ts";
import { freePort } from "./helpers/local-epp.ts";

const TOPIC = "kv@10.0.0.5:8000@Qwen/Qwen3-8B";
const WAIT_MS = 5000;

function config(extra: Record<string, unknown> = {}) {
  return kvEventsConfigFromObject({
    enable_kv_cache_events: true,
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    topic: TOPIC,
    ...extra,
  });
}

function seq8(n: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}

async function recv(sock: Subscriber | Dealer, what: string): Promise<Buffer[]> {
  try {
    return await sock.receive();
  } catch (err) {
    throw new Error(`timed out after ${sock.receiveTimeout} ms waiting for ${what}: ${String(err)}`);
  }
}

const probe = (): KVEventBatch => ({
  ts: 0.5,
  events: [{ type: "AllBlocksCleared" }],
  dataParallelRank: null,
});

/** Slow-joiner guard: publishes probe batches until the subscriber sees one; returns that message. */
async function joinWithProbes(pub: ZmqEventPublisher, sub: Subscriber): Promise<Buffer[]> {
  const saved = sub.receiveTimeout;
  sub.receiveTimeout = 50;
  try {
    for (let attempt = 0; attempt < 100; attempt++) {
      pub.publish(probe());
      try {
        return await sub.receive();
      } catch {
        // not joined yet
      }
    }
    throw new Error("subscriber never received a probe batch (100 attempts)");
  } finally {
    sub.receiveTimeout = saved;
  }
}

interface ReplayEntry {
  topic: string | null;
  seq: bigint;
  payload: Buffer;
}

/** A DEALER replay client accepting both reply layouts; reads until the end marker. */
async function replayFrom(endpoint: string, start: number, before: Buffer[][] = []) {
  const dealer = new Dealer({ linger: 0, receiveTimeout: WAIT_MS });
  dealer.connect(endpoint);
  try {
    for (const frames of before) await dealer.send(frames);
    await dealer.send([Buffer.alloc(0), seq8(start)]);
    const entries: ReplayEntry[] = [];
    for (;;) {
      const [delim, ...rest] = await recv(dealer, `replay reply (after ${entries.length} entries)`);
      assert.equal(delim.length, 0, "replies start with an empty delimiter");
      assert.ok(
        rest.length === 2 || rest.length === 3,
        `reply with ${rest.length} frames after the delimiter`,
      );
      const layout = rest.length === 3 ? "v0.26" : "legacy";
      const [topic, seq, payload] = rest.length === 3 ? rest : [null, rest[0], rest[1]];
      if (seq.equals(REPLAY_END_SEQ)) {
        assert.equal(payload.length, 0, "end marker has an empty payload");
        if (topic !== null) assert.equal(topic.length, 0, "end marker has an empty topic");
        return { entries, endLayout: layout };
      }
      assert.equal(seq.length, 8);
      entries.push({
        topic: topic === null ? null : topic.toString("utf8"),
        seq: seq.readBigUInt64BE(0),
        payload,
      });
    }
  } finally {
    dealer.close();
  }
}

test("endpointBinds follows vLLM's rule", () => {
  assert.equal(endpointBinds("tcp://*:5557"), true);
  assert.equal(endpointBinds("tcp://[::]:5557"), true);
  assert.equal(endpointBinds("ipc:///tmp/kv"), true);
  assert.equal(endpointBinds("inproc://kv"), true);
  assert.equal(endpointBinds("tcp://indexer:5557"), false);
  assert.equal(endpointBinds("tcp://127.0.0.1:5557"), false);
});

test("live stream: [topic, seq u64 BE, payload], seq from 0 per batch, payload byte-exact", async () => {
  const pub = await ZmqEventPublisher.start(config(), { format: "map" });
  const sub = new Subscriber({ linger: 0, receiveTimeout: WAIT_MS });
  try {
    assert.match(pub.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/, "the bound port is reported");
    assert.match(pub.replayEndpoint ?? "", /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(pub.stats().nextSeq, 0);
    sub.connect(pub.endpoint);
    sub.subscribe("kv@");
    const [t0, s0, p0] = await joinWithProbes(pub, sub);
    assert.equal(t0.toString(), TOPIC);
    let expect = s0.readBigUInt64BE(0);
    assert.deepEqual(decodeEventBatch(p0).events, probe().events);
    const probes = pub.stats().nextSeq;

    const r = rng(1);
    const batches = Array.from({ length: 40 }, () => randomBatch(r, 8));
    for (const b of batches) pub.publish(b);
    let k = 0;
    while (k < batches.length) {
      const frames = await recv(sub, `batch ${k}`);
      assert.equal(frames.length, 3);
      const [topic, seq, payload] = frames;
      assert.equal(topic.toString("utf8"), TOPIC);
      assert.equal(seq.length, 8);
      expect++;
      assert.equal(seq.readBigUInt64BE(0), expect, "consecutive seq numbers");
      if (expect < BigInt(probes)) continue; // a probe published before the first one arrived
      const b = batches[k];
      const sent = { ...b, dataParallelRank: b.dataParallelRank ?? 0 };
      assert.equal(expect, BigInt(probes + k));
      assert.deepEqual(Buffer.from(payload), Buffer.from(encodeEventBatch(sent, "map")));
      // Copied so bytes in extra_keys decode as Uint8Array, not as Buffer views of the frame.
      assert.deepEqual(decodeEventBatch(new Uint8Array(payload)), { ...sent, skippedEvents: 0 });
      k++;
    }
    assert.equal(pub.stats().nextSeq, probes + batches.length);
    const all = await replayFrom(pub.replayEndpoint!, 0);
    assert.deepEqual(
      all.entries.map((e) => e.seq),
      Array.from({ length: probes + batches.length }, (_, i) => BigInt(i)),
      "the first batch ever published had seq 0",
    );
  } finally {
    sub.close();
    await pub.close();
  }
});

test("topic filter: a non-matching subscription receives nothing published while it was the only one", async () => {
  const pub = await ZmqEventPublisher.start(config({ replay_endpoint: null }), { format: "array" });
  const match = new Subscriber({ linger: 0, receiveTimeout: WAIT_MS });
  const other = new Subscriber({ linger: 0, receiveTimeout: WAIT_MS });
  try {
    match.connect(pub.endpoint);
    match.subscribe("kv@10.0.0.5");
    other.connect(pub.endpoint);
    other.subscribe("kv@10.0.0.6");
    await joinWithProbes(pub, match);
    for (let i = 0; i < 20; i++) pub.publish(probe());
    const cutoff = BigInt(pub.stats().nextSeq);
    let last = -1n;
    while (last < cutoff - 1n) last = (await recv(match, "matching batch"))[1].readBigUInt64BE(0);
    // Widen the filter; the first message `other` ever gets must be one published after that.
    other.subscribe(TOPIC);
    const [topic, seq] = await joinWithProbes(pub, other);
    assert.equal(topic.toString(), TOPIC);
    assert.ok(seq.readBigUInt64BE(0) >= cutoff, `got seq ${seq.readBigUInt64BE(0)} published before cutoff`);
  } finally {
    match.close();
    other.close();
    await pub.close();
  }
});

test("connect mode: an endpoint without a wildcard dials a subscriber that binds", async () => {
  const sub = new Subscriber({ linger: 0, receiveTimeout: WAIT_MS });
  let pub: ZmqEventPublisher | null = null;
  try {
    await sub.bind("tcp://127.0.0.1:*");
    sub.subscribe();
    const addr = sub.lastEndpoint!;
    pub = await ZmqEventPublisher.start(config({ endpoint: addr, replay_endpoint: null }), {
      format: "array",
    });
    assert.equal(pub.endpoint, addr);
    const [, , payload] = await joinWithProbes(pub, sub);
    assert.deepEqual(decodeEventBatch(payload).events, [{ type: "AllBlocksCleared" }]);
  } finally {
    sub.close();
    await pub?.close();
  }
});

test("data-parallel rank: endpoints offset, null ranks filled, the caller's batch untouched", async () => {
  const name = `inproc://kv-dp-${process.pid}-${Date.now()}`;
  const pub = await ZmqEventPublisher.start(config({ endpoint: name, replay_endpoint: `${name}-replay` }), {
    format: "array",
    dataParallelRank: 2,
  });
  const sub = new Subscriber({ linger: 0, receiveTimeout: WAIT_MS });
  try {
    assert.equal(pub.endpoint, `${name}_dp2`);
    assert.equal(pub.replayEndpoint, `${name}-replay_dp2`);
    sub.connect(pub.endpoint);
    sub.subscribe();
    const [, , p] = await joinWithProbes(pub, sub);
    assert.equal(decodeEventBatch(p).dataParallelRank, 2);
    const mine: KVEventBatch = { ts: 3, events: [], dataParallelRank: null };
    pub.publish(mine);
    pub.publish({ ts: 4, events: [], dataParallelRank: 5 });
    assert.equal(mine.dataParallelRank, null);
    const ranks: (number | null)[] = [];
    while (ranks.length < 2) {
      const got = decodeEventBatch((await recv(sub, "rank batch"))[2]);
      if (got.ts !== 0.5) ranks.push(got.dataParallelRank);
    }
    assert.deepEqual(ranks, [2, 5]);
  } finally {
    sub.close();
    await pub.close();
  }
});

for (const layout of ["v0.26", "legacy"] as const) {
  test(`replay (${layout}): batches with seq >= start, in order, then the end marker`, async () => {
    const pub = await ZmqEventPublisher.start(config(), { format: "array", replayLayout: layout });
    try {
      const r = rng(layout === "legacy" ? 5 : 6);
      const batches = Array.from({ length: 10 }, () => randomBatch(r, 5));
      for (const b of batches) pub.publish(b);
      const encoded = batches.map((b) =>
        encodeEventBatch({ ...b, dataParallelRank: b.dataParallelRank ?? 0 }, "array"),
      );
      for (const start of [0, 4, 9]) {
        const got = await replayFrom(pub.replayEndpoint!, start);
        assert.equal(got.endLayout, layout);
        assert.deepEqual(
          got.entries.map((e) => e.seq),
          Array.from({ length: 10 - start }, (_, i) => BigInt(start + i)),
        );
        for (const e of got.entries) {
          assert.equal(e.topic, layout === "v0.26" ? TOPIC : null);
          assert.deepEqual(Buffer.from(e.payload), Buffer.from(encoded[Number(e.seq)]));
        }
      }
      const none = await replayFrom(pub.replayEndpoint!, 10);
      assert.deepEqual(none.entries, []);
      assert.equal(none.endLayout, layout);
      assert.equal(pub.stats().replayRequestsServed, 4);
    } finally {
      await pub.close();
    }
  });
}

test("replay from before the retained window returns what is kept (first seq > requested)", async () => {
  const pub = await ZmqEventPublisher.start(config({ buffer_steps: 3 }), { format: "map" });
  try {
    for (let i = 0; i < 6; i++) pub.publish({ ts: i, events: [], dataParallelRank: 0 });
    const got = await replayFrom(pub.replayEndpoint!, 1);
    assert.deepEqual(
      got.entries.map((e) => e.seq),
      [3n, 4n, 5n],
    );
    assert.deepEqual(
      got.entries.map((e) => decodeEventBatch(e.payload).ts),
      [3, 4, 5],
    );
  } finally {
    await pub.close();
  }
});

test("malformed replay requests are ignored and counted; the socket keeps serving", async () => {
  const pub = await ZmqEventPublisher.start(config(), { format: "array" });
  try {
    for (let i = 0; i < 5; i++) pub.publish({ ts: i, events: [], dataParallelRank: 0 });
    const bad = [[Buffer.from("only-one-frame")], [Buffer.alloc(0), seq8(0), Buffer.from("extra")]];
    // Had either bad request been answered, the first reply would carry seq 0, not 2.
    const got = await replayFrom(pub.replayEndpoint!, 2, bad);
    assert.deepEqual(
      got.entries.map((e) => e.seq),
      [2n, 3n, 4n],
    );
    const s = pub.stats();
    assert.equal(s.replayRequestsMalformed, 2);
    assert.equal(s.replayRequestsServed, 1);
  } finally {
    await pub.close();
  }
});

test("publish never throws: encode errors consume a seq, publishing after close counts as dropped", async () => {
  const pub = await ZmqEventPublisher.start(config(), { format: "array" });
  try {
    const badHash: BlockRemoved = { type: "BlockRemoved", blockHashes: [-1n], medium: null, groupIdx: null };
    pub.publish({ ts: 1, events: [badHash], dataParallelRank: 0 });
    pub.publish({ ts: 2, events: [], dataParallelRank: 0 });
    const got = await replayFrom(pub.replayEndpoint!, 0);
    assert.deepEqual(
      got.entries.map((e) => e.seq),
      [1n],
      "the unencodable batch used seq 0, as in vLLM",
    );
    assert.equal(pub.stats().encodeErrors, 1);
  } finally {
    await pub.close();
  }
  await pub.close();
  pub.publish({ ts: 3, events: [], dataParallelRank: 0 });
  assert.equal(pub.stats().dropped, 1);
});

/** A KvEventsBindError for `field` at `address` that is not the "already in use" kind. */
function bindError(field: "endpoint" | "replay_endpoint", address: string) {
  return (e: unknown): boolean => {
    assert.ok(e instanceof KvEventsBindError, `expected KvEventsBindError, got ${e}`);
    assert.equal(e.code, "KVG_ERR_KV_EVENTS_BIND");
    assert.equal(e.field, field);
    assert.equal(e.address, address);
    assert.ok(
      e.message.startsWith(`--kv-events-config "${field}" ${address}: cannot bind: `),
      `message ${JSON.stringify(e.message)}`,
    );
    return true;
  };
}

test("start() rejects on a bad endpoint and leaves nothing open", async () => {
  await assert.rejects(
    ZmqEventPublisher.start(config({ endpoint: "tcp://127.0.0.1:notaport*" }), { format: "map" }),
    bindError("endpoint", "tcp://127.0.0.1:notaport*"),
  );
  // The PUB socket binds its fixed port before the replay endpoint fails: start() must close it, or
  // the port stays taken (a second bind on it fails with EADDRINUSE while the first socket is open).
  const port = await freePort("0.0.0.0");
  const endpoint = `tcp://*:${port}`; // the "*" makes it bind rather than connect (endpointBinds)
  await assert.rejects(
    ZmqEventPublisher.start(config({ endpoint, replay_endpoint: "bogus://x" }), { format: "map" }),
    bindError("replay_endpoint", "bogus://x"),
  );
  // zmq unbinds a closed socket on its I/O thread, a moment later: retry "in use" for up to 1 s (as
  // gateway-precise-lifecycle does). A socket left open holds the port far longer than that.
  let again: ZmqEventPublisher | undefined;
  for (let attempt = 0; again === undefined; attempt++) {
    try {
      again = await ZmqEventPublisher.start(config({ endpoint }), { format: "map" });
    } catch (err) {
      if (attempt >= 50 || !(err instanceof KvEventsBindError && /already in use/.test(err.message)))
        throw err;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  try {
    assert.equal(again.endpoint, `tcp://0.0.0.0:${port}`);
  } finally {
    await again.close();
  }
});
