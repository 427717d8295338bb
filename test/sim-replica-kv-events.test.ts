/**
 * KV events from the simulated replica, received by a real zeromq Subscriber: three frames
 * [topic, seq u64 BE, msgpack batch], one batch per step, BlockStored for a request's full prompt
 * blocks with 64-bit sha256_cbor hashes (vLLM's chain with PYTHONHASHSEED), map encoding by default
 * and array encoding with --kv-events-format array.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { decode } from "@msgpack/msgpack";
import { Subscriber } from "zeromq";
import { decodeEventBatch } from "../src/kv/event-codec.ts";
import type { BlockStored } from "../src/kv/events.ts";
import { hashBlockTokens, noneHash } from "../src/kv/vllm-block-hash.ts";
import { postJson, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const ids = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);

async function withSubscriber(r: TestReplica, fn: (next: () => Promise<Buffer[]>) => Promise<void>) {
  const sub = new Subscriber({ linger: 0, receiveTimeout: 10_000 });
  try {
    sub.connect(r.server.publisher!.endpoint);
    sub.subscribe("kv@");
    const next = async () => (await sub.receive()) as Buffer[];
    // Slow-joiner guard: send small requests until one of their batches arrives (one receive in flight).
    let joined = false;
    const first = next().then(() => (joined = true));
    first.catch(() => {});
    for (let i = 0; i < 100 && !joined; i++) {
      await postJson(`${r.url}/v1/completions`, { prompt: ids(32, 50_000 + i * 100), max_tokens: 1 });
      await Promise.race([first, new Promise((res) => setTimeout(res, 50))]);
    }
    assert.ok(joined, "subscriber never received a batch");
    // Drain whatever the probes left in flight.
    sub.receiveTimeout = 200;
    try {
      for (;;) await sub.receive();
    } catch {}
    sub.receiveTimeout = 10_000;
    await fn(next);
  } finally {
    sub.close();
  }
}

const config = (topic: string) =>
  JSON.stringify({ enable_kv_cache_events: true, publisher: "zmq", endpoint: "tcp://127.0.0.1:*", topic });

test("BlockStored for a request's full prompt blocks, with 64-bit hashes, over ZMQ (map format)", async (t) => {
  const r = await startTestReplica({ kvEventsConfig: config("kv@127.0.0.1@sim"), hashSeed: "0" });
  t.after(() => r.close());
  assert.match(r.server.publisher!.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  await withSubscriber(r, async (next) => {
    const prompt = ids(100, 7000);
    const res = await postJson(`${r.url}/v1/completions`, { prompt, max_tokens: 2, ignore_eos: true });
    assert.equal(res.status, 200);
    const stored: BlockStored[] = [];
    let lastSeq = -1n;
    while (stored.flatMap((e) => e.blockHashes).length < 6) {
      const frames = await next();
      assert.equal(frames.length, 3, "topic, seq, payload");
      assert.equal(frames[0]!.toString(), "kv@127.0.0.1@sim");
      assert.equal(frames[1]!.length, 8);
      const seq = frames[1]!.readBigUInt64BE();
      assert.ok(seq > lastSeq, "seq grows per batch");
      lastSeq = seq;
      const raw = decode(frames[2]!, { useBigInt64: true }) as unknown[];
      assert.equal(raw.length, 3, "[ts, events, data_parallel_rank]");
      const events = raw[1] as unknown[];
      for (const e of events)
        assert.ok(e instanceof Map || (typeof e === "object" && !Array.isArray(e)), "map-encoded events");
      const batch = decodeEventBatch(frames[2]!);
      assert.equal(batch.dataParallelRank, 0);
      assert.ok(Math.abs(batch.ts - Date.now() / 1000) < 600, "ts is wall-clock epoch seconds");
      for (const e of batch.events) if (e.type === "BlockStored") stored.push(e);
    }
    const hashes = stored.flatMap((e) => e.blockHashes);
    assert.equal(hashes.length, 6, "100 prompt tokens (+2 generated) fill 6 blocks of 16");
    assert.equal(stored[0]!.parentBlockHash, null, "the run starts at block 0");
    assert.deepEqual(
      stored.flatMap((e) => e.tokenIds),
      prompt.slice(0, 96),
    );
    for (const e of stored) {
      assert.equal(e.blockSize, 16);
      assert.equal(e.medium, "GPU");
    }
    // vLLM's sha256_cbor chain with PYTHONHASHSEED=0, low 64 bits.
    let parent = noneHash("0");
    for (let i = 0; i < 6; i++) {
      const h = hashBlockTokens(parent, prompt, i * 16, (i + 1) * 16, null);
      assert.equal(hashes[i], h.value, `block ${i}`);
      assert.equal(typeof hashes[i], "bigint");
      assert.ok(hashes[i]! < 2n ** 64n);
      parent = h.digest;
    }
    assert.ok(
      hashes.some((h) => h > BigInt(Number.MAX_SAFE_INTEGER)),
      "64-bit values beyond 2^53 survive the wire",
    );

    // A repeat is a prefix hit: no new BlockStored for the cached blocks.
    await postJson(`${r.url}/v1/completions`, { prompt, max_tokens: 1 });
    await postJson(`${r.url}/v1/completions`, { prompt: ids(40, 90_000), max_tokens: 1 });
    const again: bigint[] = [];
    for (;;) {
      const batch = decodeEventBatch((await next())[2]!);
      const s = batch.events.filter((e): e is BlockStored => e.type === "BlockStored");
      if (s.some((e) => e.tokenIds[0] === 90_000)) break; // the marker request's blocks
      again.push(...s.flatMap((e) => e.blockHashes));
    }
    assert.deepEqual(again, [], "cached blocks are not re-announced");
  });
});

test("--kv-events-format array encodes events as tagged arrays", async (t) => {
  const r = await startTestReplica({ kvEventsConfig: config("kv@a@sim"), kvEventsFormat: "array" });
  t.after(() => r.close());
  await withSubscriber(r, async (next) => {
    await postJson(`${r.url}/v1/completions`, { prompt: ids(48, 3000), max_tokens: 1 });
    for (;;) {
      const frames = await next();
      const raw = decode(frames[2]!, { useBigInt64: true }) as unknown[];
      const events = raw[1] as unknown[][];
      const stored = events.find((e) => Array.isArray(e) && e[0] === "BlockStored");
      if (!stored) continue;
      assert.ok(Array.isArray(stored));
      assert.equal((stored[1] as unknown[]).length, 3, "48 prompt tokens → 3 blocks");
      assert.equal(stored[4], 16, "block_size at index 4");
      break;
    }
  });
});

test("events off: no publisher is started", async (t) => {
  const r = await startTestReplica({
    kvEventsConfig: JSON.stringify({
      enable_kv_cache_events: false,
      publisher: "zmq",
      endpoint: "tcp://127.0.0.1:*",
    }),
  });
  t.after(() => r.close());
  assert.equal(r.server.publisher, null);
});
