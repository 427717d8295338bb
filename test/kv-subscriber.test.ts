/** KV-events subscriber over real ZMQ sockets on loopback: in-order streams, gaps with replay from the
 * real ZmqEventPublisher (both reply layouts, both encodings), lost history, gaps without replay, engine
 * restarts, garbage, replay timeouts, removal and chunked bursts. Index contents are checked against the
 * reference model of the generated streams. */
import assert from "node:assert/strict";
import { describe, it, type TestContext } from "node:test";
import { Publisher, Router, Subscriber } from "zeromq";
import { KvEventsSubscriber, kvEventsEndpointFor } from "../src/datalayer/kv-events-subscriber.ts";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import { encodeEventBatch } from "../src/kv/event-codec.ts";
import type { KVEventBatch } from "../src/kv/events.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { type KvEventsConfig, kvEventsConfigFromObject } from "../src/sim/kv-events-config.ts";
import { type ReplayLayout, ZmqEventPublisher } from "../src/sim/kv-publisher.ts";
import { rng } from "./helpers/kv-event-fixtures.ts";
import { StreamWorld } from "./helpers/precise-streams.ts";
import { waitFor } from "./helpers/replica.ts";

const keyer = new BlockKeyer({ hasher: await loadXxh64Hasher(), blockSize: 16 });
const EP = "10.0.0.1:8000";
const TOPIC = "kv@10.0.0.1:8000@m";

function seq8(n: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}
const empty = (): KVEventBatch => ({ ts: 1, events: [], dataParallelRank: 0 });

function setup(t: TestContext, seed: number, opts: { replayTimeoutMs?: number; chunkBlocks?: number } = {}) {
  const index = new PreciseIndex({ keyer });
  const sub = new KvEventsSubscriber({ index, ...opts });
  t.after(() => sub.close());
  const world = new StreamWorld(keyer, rng(seed), "m", { docs: 10, blocks: 8 });
  const last = () => sub.stats().endpoints[EP]?.lastSeq ?? null;
  const check = () => {
    for (const doc of world.docs) {
      const got = index.longestPrefix(doc.keys, [EP], 0);
      const want = world.refLongest(EP, doc.keys);
      assert.equal(got.blocks[0], want.blocks);
      assert.ok(Math.abs(got.scores[0] - want.score) < 1e-9);
    }
    assert.equal(index.endpointEntries(EP), world.refEntries(EP));
  };
  return { index, sub, world, last, check };
}

/** A raw PUB socket the test drives with arbitrary seqs and frames. */
async function rawPublisher(t: TestContext) {
  const pub = new Publisher({ linger: 0 });
  await pub.bind("tcp://127.0.0.1:*");
  t.after(() => pub.close());
  return { pub, address: pub.lastEndpoint! };
}

/** Sends empty batches with growing seqs until the subscriber has applied one; returns the next seq. */
async function joinRaw(pub: Publisher, last: () => number | null): Promise<number> {
  let seq = 100;
  for (let i = 0; i < 200 && last() === null; i++) {
    await pub.send([TOPIC, seq8(seq++), encodeEventBatch(empty(), "map")]);
    await new Promise((r) => setTimeout(r, 20));
  }
  await waitFor(() => last() === seq - 1);
  return seq;
}

describe("subscriber on a raw publisher", () => {
  it("applies in-order batches, counts garbage without losing the stream, resets on a gap", async (t) => {
    const { sub, world, last, check, index } = setup(t, 1);
    const { pub, address } = await rawPublisher(t);
    await sub.addEndpoint({ id: EP, address });
    let seq = await joinRaw(pub, last);
    for (let i = 0; i < 5; i++)
      await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 5), "array")]);
    await pub.send([TOPIC, seq8(seq)]); // 2 frames
    await pub.send([TOPIC, Buffer.from([1, 2, 3]), encodeEventBatch(empty(), "map")]); // 3-byte seq
    await pub.send([TOPIC, seq8(seq++), Buffer.from("not msgpack at all \xc1")]); // undecodable
    await pub.send([TOPIC, seq8(seq++), Buffer.from([0x93, 0xc3, 0x90])]); // [true, [], ...] truncated
    for (let i = 0; i < 3; i++)
      await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 5), "map")]);
    await waitFor(() => last() === seq - 1);
    let s = sub.stats().endpoints[EP];
    assert.deepEqual([s.garbage, s.gaps, s.resets], [4, 0, 0]);
    check();
    assert.ok(index.endpointEntries(EP) > 0);

    // A gap without a replay socket: everything known is dropped, then the stream goes on.
    world.batch(EP, 5); // published by the engine, lost on the way
    world.resetRef(EP);
    seq++;
    await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 5), "map")]);
    await waitFor(() => last() === seq - 1);
    s = sub.stats().endpoints[EP];
    assert.deepEqual([s.gaps, s.resets, s.replays], [1, 1, 0]);
    check();
  });

  it("treats a seq that goes back as an engine restart", async (t) => {
    const { sub, world, last, check } = setup(t, 2);
    const { pub, address } = await rawPublisher(t);
    await sub.addEndpoint({ id: EP, address });
    let seq = await joinRaw(pub, last);
    for (let i = 0; i < 4; i++)
      await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 6), "map")]);
    await waitFor(() => last() === seq - 1);
    world.resetRef(EP);
    for (let i = 0; i < 3; i++)
      await pub.send([TOPIC, seq8(i), encodeEventBatch(world.batch(EP, 6), "array")]);
    await waitFor(() => last() === 2);
    const s = sub.stats().endpoints[EP];
    assert.deepEqual([s.restarts, s.resets, s.gaps], [1, 1, 0]);
    check();
  });

  it("resets when the replay socket never answers", async (t) => {
    const { sub, world, last, check } = setup(t, 3, { replayTimeoutMs: 150 });
    const { pub, address } = await rawPublisher(t);
    const mute = new Router({ linger: 0 });
    await mute.bind("tcp://127.0.0.1:*");
    t.after(() => mute.close());
    await sub.addEndpoint({ id: EP, address, replayAddress: mute.lastEndpoint });
    let seq = await joinRaw(pub, last);
    await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 6), "map")]);
    world.batch(EP, 6);
    world.resetRef(EP);
    seq++;
    await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 6), "map")]);
    await waitFor(() => last() === seq - 1);
    const s = sub.stats().endpoints[EP];
    assert.deepEqual([s.gaps, s.replays, s.replayFailures, s.resets], [1, 1, 1, 1]);
    check();
  });

  it("removeEndpoint drops the entries at once and applies nothing more", async (t) => {
    const { sub, world, last, index } = setup(t, 4);
    const { pub, address } = await rawPublisher(t);
    await sub.addEndpoint({ id: EP, address });
    let seq = await joinRaw(pub, last);
    for (let i = 0; i < 3; i++)
      await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 6), "map")]);
    await waitFor(() => last() === seq - 1);
    assert.ok(index.endpointEntries(EP) > 0);
    const done = sub.removeEndpoint(EP);
    assert.equal(index.endpointEntries(EP), 0);
    assert.equal(index.stats().entries, 0);
    await done;
    await pub.send([TOPIC, seq8(seq++), encodeEventBatch(world.batch(EP, 6), "map")]);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(index.stats().entries, 0);
    assert.equal(sub.stats().endpoints[EP], undefined);
  });

  it("applies a burst in chunks, yielding to the event loop in between", async (t) => {
    const { sub, world, last, check } = setup(t, 5, { chunkBlocks: 16 });
    const { pub, address } = await rawPublisher(t);
    await sub.addEndpoint({ id: EP, address });
    let seq = await joinRaw(pub, last);
    const payload = encodeEventBatch(world.batch(EP, 200), "map");
    const seen: number[] = [];
    let watching = true;
    const watch = () => {
      seen.push(sub.stats().events);
      if (watching) setImmediate(watch);
    };
    setImmediate(watch);
    await pub.send([TOPIC, seq8(seq++), payload]);
    await waitFor(() => last() === seq - 1 && sub.stats().batches >= 2);
    watching = false;
    const final = sub.stats().events;
    assert.ok(
      seen.some((n) => n > 0 && n < final),
      "other callbacks ran while the batch was applied",
    );
    check();
  });
});

interface ProxyRig {
  publisher: ZmqEventPublisher;
  /** Seqs the proxy does not forward (a lossy network). */
  drop: Set<number>;
  address: string;
}

/** The real publisher behind a proxy that forwards live messages except the dropped seqs. */
async function proxied(t: TestContext, bufferSteps: number, format: "array" | "map", layout: ReplayLayout) {
  const cfg = kvEventsConfigFromObject({
    enable_kv_cache_events: true,
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    buffer_steps: bufferSteps,
    topic: TOPIC,
  });
  const publisher = await ZmqEventPublisher.start(cfg, { format, replayLayout: layout });
  const inbound = new Subscriber({ linger: 0 });
  inbound.connect(publisher.endpoint);
  inbound.subscribe();
  const outbound = new Publisher({ linger: 0 });
  await outbound.bind("tcp://127.0.0.1:*");
  const rig: ProxyRig = { publisher, drop: new Set(), address: outbound.lastEndpoint! };
  const loop = (async () => {
    try {
      for await (const frames of inbound) {
        if (!rig.drop.has(Number(frames[1].readBigUInt64BE()))) await outbound.send(frames);
      }
    } catch {}
  })();
  t.after(async () => {
    inbound.close();
    outbound.close();
    await loop;
    await publisher.close();
  });
  return rig;
}

async function joinProxied(rig: ProxyRig, last: () => number | null): Promise<void> {
  for (let i = 0; i < 200 && last() === null; i++) {
    rig.publisher.publish(empty());
    await new Promise((r) => setTimeout(r, 20));
  }
  await waitFor(() => last() === rig.publisher.stats().nextSeq - 1);
}

describe("gaps with replay from the real publisher", () => {
  for (const layout of ["v0.26", "legacy"] as const) {
    for (const format of ["map", "array"] as const) {
      it(`replays the missed batches (${layout} replies, ${format} events)`, async (t) => {
        const { sub, world, last, check } = setup(t, 10 + layout.length + format.length);
        const rig = await proxied(t, 64, format, layout);
        await sub.addEndpoint({ id: EP, address: rig.address, replayAddress: rig.publisher.replayEndpoint });
        await joinProxied(rig, last);
        const next = rig.publisher.stats().nextSeq;
        const batchesBefore = sub.stats().endpoints[EP].batches;
        for (let i = 2; i < 6; i++) rig.drop.add(next + i);
        for (let i = 0; i < 9; i++) rig.publisher.publish(world.batch(EP, 5));
        // publish() keeps each batch in the replay buffer at once, so the replay that next + 6's gap
        // asks for returns next + 2 … next + 8; the live next + 6, 7 and 8 then arrive as duplicates.
        await waitFor(() => last() === next + 8 && sub.stats().endpoints[EP].duplicates === 3);
        const s = sub.stats().endpoints[EP];
        assert.deepEqual([s.gaps, s.replays, s.resets, s.historyLost, s.garbage], [1, 1, 0, 0, 0]);
        assert.equal(s.batches - batchesBefore, 9, "each of the 9 batches applied exactly once");
        check();
      });
    }

    it(`rebuilds from what came back when the replay buffer lost the history (${layout})`, async (t) => {
      const { sub, world, last, check, index } = setup(t, 20 + layout.length);
      const rig = await proxied(t, 3, "map", layout);
      await sub.addEndpoint({ id: EP, address: rig.address, replayAddress: rig.publisher.replayEndpoint });
      await joinProxied(rig, last);
      const next = rig.publisher.stats().nextSeq;
      rig.publisher.publish(world.batch(EP, 6)); // delivered
      for (let i = 1; i <= 5; i++) rig.drop.add(next + i);
      for (let i = 1; i <= 3; i++) rig.publisher.publish(world.batch(EP, 6)); // lost for good
      world.resetRef(EP);
      for (let i = 4; i <= 6; i++) rig.publisher.publish(world.batch(EP, 6)); // the buffer keeps these 3
      await waitFor(() => last() === next + 6);
      const s = sub.stats().endpoints[EP];
      assert.deepEqual([s.gaps, s.replays, s.historyLost, s.resets], [1, 1, 1, 1]);
      check();
      assert.ok(index.endpointEntries(EP) > 0);
    });
  }
});

/** Forwards every live message from a publisher to a PUB socket bound at `bindAt` (retrying while the port is busy). */
async function forwarder(t: TestContext, from: string, bindAt: string) {
  const inbound = new Subscriber({ linger: 0 });
  inbound.connect(from);
  inbound.subscribe();
  let outbound: Publisher | null = null;
  for (let i = 0; i < 100 && outbound === null; i++) {
    const p = new Publisher({ linger: 0 });
    try {
      await p.bind(bindAt);
      outbound = p;
    } catch {
      p.close();
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  assert.ok(outbound, `could not bind ${bindAt}`);
  const out = outbound;
  const loop = (async () => {
    try {
      for await (const frames of inbound) await out.send(frames);
    } catch {}
  })();
  const close = async () => {
    inbound.close();
    out.close();
    await loop;
  };
  t.after(close);
  return { address: out.lastEndpoint!, close };
}

async function startRetrying(cfg: KvEventsConfig, format: "array" | "map"): Promise<ZmqEventPublisher> {
  for (let i = 0; ; i++) {
    try {
      return await ZmqEventPublisher.start(cfg, { format });
    } catch (err) {
      if (i >= 100) throw err;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

describe("engine restart behind a reconnect", () => {
  it("rebuilds from the new engine's history when its seq lands past ours", async (t) => {
    const { sub, world, last, check } = setup(t, 30);
    const cfg = (replay: string) =>
      kvEventsConfigFromObject({
        enable_kv_cache_events: true,
        endpoint: "tcp://127.0.0.1:*",
        replay_endpoint: replay,
        buffer_steps: 1000,
        topic: TOPIC,
      });
    const a = await ZmqEventPublisher.start(cfg("tcp://127.0.0.1:*"), { format: "map" });
    t.after(() => a.close());
    const front = await forwarder(t, a.endpoint, "tcp://127.0.0.1:*");
    await sub.addEndpoint({ id: EP, address: front.address, replayAddress: a.replayEndpoint });
    for (let i = 0; i < 200 && last() === null; i++) {
      a.publish(empty());
      await new Promise((r) => setTimeout(r, 20));
    }
    for (let i = 0; i < 2; i++) a.publish(world.batch(EP, 6));
    const lastA = a.stats().nextSeq - 1;
    await waitFor(() => last() === lastA);
    await front.close();
    await a.close();

    // The engine comes back on the same addresses and runs past our seq before we reconnect.
    world.resetRef(EP);
    const b = await startRetrying(cfg(a.replayEndpoint!), "array");
    t.after(() => b.close());
    for (let i = 0; i < lastA + 5; i++) b.publish(world.batch(EP, 6));
    await forwarder(t, b.endpoint, front.address);
    for (let i = 0; i < 200 && (last() ?? 0) <= lastA; i++) {
      b.publish(empty());
      await new Promise((r) => setTimeout(r, 20));
    }
    await waitFor(() => last() === b.stats().nextSeq - 1);
    const s = sub.stats().endpoints[EP];
    assert.deepEqual([s.reconnectResets, s.restarts, s.historyLost, s.gaps], [1, 0, 0, 0]);
    check();
  });
});

describe("kvEventsEndpointFor", () => {
  it("dials the endpoint's host on the producer's ports unless the endpoint set names an address", () => {
    const ports = { socketPort: 5556, replaySocketPort: 5557 };
    assert.deepEqual(
      kvEventsEndpointFor({ id: "10.0.0.7:8000", host: "10.0.0.7", kvEvents: null }, ports, "m"),
      {
        id: "10.0.0.7:8000",
        address: "tcp://10.0.0.7:5556",
        replayAddress: "tcp://10.0.0.7:5557",
        model: "m",
      },
    );
    const v6 = kvEventsEndpointFor({ id: "[fd00::1]:8000", host: "fd00::1", kvEvents: null }, ports);
    assert.equal(v6.address, "tcp://[fd00::1]:5556");
    assert.equal(v6.model, undefined, "no model: the topic's is used");
    const named = kvEventsEndpointFor(
      { id: "a:1", host: "a", kvEvents: "tcp://b:9000" },
      { socketPort: 5557, replaySocketPort: null },
    );
    assert.deepEqual([named.address, named.replayAddress], ["tcp://b:9000", null]);
  });
});
