/** End to end: a simulated vLLM replica publishing real KV events, the subscriber connected to it, and
 * the precise index then matching the keys kvgate computes from the same token ids (sim tokenizer, the
 * replica's chat template) on that endpoint; then two replicas behind precise-prefix-cache-producer,
 * where the scheduler picks the one whose KV events announced the prompt's blocks. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { KvEventsSubscriber, kvEventsEndpointFor } from "../src/datalayer/kv-events-subscriber.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import type { ChatMessage } from "../src/engine/tokenizer.ts";
import { BlockKeyer, loadXxh64Hasher } from "../src/kv/block-keys.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import type { PrecisePrefixProducer } from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import { postJson, startTestReplica, waitFor } from "./helpers/replica.ts";

const keyer = new BlockKeyer({ hasher: await loadXxh64Hasher(), blockSize: 16 });
const MODEL = "sim-model";
const SYSTEM = "You are a careful assistant for the kvgate test suite. ".repeat(12);

for (const format of ["map", "array"] as const) {
  describe(`replica → subscriber → index (${format} events)`, () => {
    it("matches every full prompt block of a chat request on the replica that served it", async (t) => {
      const r = await startTestReplica({
        servedModelName: MODEL,
        kvEventsFormat: format,
        kvEventsConfig: JSON.stringify({
          enable_kv_cache_events: true,
          publisher: "zmq",
          endpoint: "tcp://127.0.0.1:*",
          replay_endpoint: "tcp://127.0.0.1:*",
          topic: `kv@127.0.0.1@${MODEL}`,
        }),
      });
      t.after(() => r.close());
      const id = `127.0.0.1:${r.port}`;
      const index = new PreciseIndex({ keyer });
      const sub = new KvEventsSubscriber({ index });
      t.after(() => sub.close());
      await sub.addEndpoint({
        id,
        address: r.server.publisher!.endpoint,
        replayAddress: r.server.publisher!.replayEndpoint,
      });
      const lastSeq = () => sub.stats().endpoints[id]?.lastSeq ?? null;
      // Slow joiner: small requests until a batch arrives.
      for (let i = 0; i < 100 && lastSeq() === null; i++) {
        await postJson(`${r.url}/v1/completions`, {
          model: MODEL,
          prompt: `probe ${i} `.repeat(20),
          max_tokens: 1,
        });
        await new Promise((res) => setTimeout(res, 20));
      }
      assert.notEqual(lastSeq(), null, "subscriber never received a batch");

      const tok = createSimTokenizer({ vocabSize: r.server.opts.profile.model.vocabSize });
      const ask = async (messages: ChatMessage[], cacheSalt?: string) => {
        const res = await postJson(`${r.url}/v1/chat/completions`, {
          model: MODEL,
          messages,
          max_tokens: 2,
          ...(cacheSalt ? { cache_salt: cacheSalt } : {}),
        });
        assert.equal(res.status, 200);
        // The tokens the replica used: the sim tokenizer on its chat template, no special tokens for chat.
        const ids = tok.encode(tok.applyChatTemplate(messages, { addGenerationPrompt: true }), false);
        const check = await postJson(`${r.url}/tokenize`, { model: MODEL, messages });
        assert.deepEqual(ids, check.body.tokens);
        assert.equal(res.body.usage.prompt_tokens, ids.length);
        return ids;
      };

      const first: ChatMessage[] = [
        { role: "system", content: SYSTEM },
        { role: "user", content: "Which replica holds my prefix? Answer briefly, please." },
      ];
      const ids = await ask(first);
      const keys = keyer.keys(ids, MODEL);
      assert.ok(keys.length >= 8, `${ids.length} prompt tokens`);
      await waitFor(() => index.longestPrefix(keys, [id], 0).blocks[0] === keys.length);
      const m = index.longestPrefix(keys, [id, "10.9.9.9:8000"], 0);
      assert.deepEqual([...m.blocks], [keys.length, 0]);
      assert.equal(m.scores[0], keys.length, "gpu tier, weight 1 per block");
      assert.deepEqual(index.tiersOf(id, keys[0], 0), ["gpu"]);

      // Another user turn over the same system prompt: the shared blocks match, its own ones too.
      const second: ChatMessage[] = [first[0], { role: "user", content: "A different question entirely." }];
      const ids2 = await ask(second);
      const keys2 = keyer.keys(ids2, MODEL);
      let shared = 0;
      while (shared < keys2.length && keys2[shared] === keys[shared]) shared++;
      assert.ok(shared >= 4 && shared < keys2.length, `shared ${shared} of ${keys2.length}`);
      await waitFor(() => index.longestPrefix(keys2, [id], 0).blocks[0] === keys2.length);

      // A salted request: only keys computed with the same cache_salt match it.
      const third: ChatMessage[] = [
        { role: "user", content: "Salted prompt that nobody else shares. ".repeat(6) },
      ];
      const ids3 = await ask(third, "tenant-a");
      const salted = keyer.keys(ids3, MODEL, "tenant-a");
      await waitFor(() => index.longestPrefix(salted, [id], 0).blocks[0] === salted.length);
      assert.equal(index.longestPrefix(keyer.keys(ids3, MODEL), [id], 0).blocks[0], 0);

      const s = sub.stats();
      assert.equal(s.garbage, 0);
      assert.equal(s.resets, 0);
      const is = index.stats();
      assert.equal(is.unknownParent, 0);
      assert.equal(is.unsupportedExtraKeyBlocks, 0);
    });
  });
}

describe("replicas → subscriber → precise-prefix-cache-producer → pick", () => {
  it("routes a request to the replica that holds its prefix, known only from KV events", async (t) => {
    const replicas = await Promise.all(
      [0, 1].map(() =>
        startTestReplica({
          servedModelName: MODEL,
          kvEventsConfig: JSON.stringify({
            enable_kv_cache_events: true,
            publisher: "zmq",
            endpoint: "tcp://127.0.0.1:*",
            topic: `kv@127.0.0.1@${MODEL}`,
          }),
        }),
      ),
    );
    for (const r of replicas) t.after(() => r.close());
    const { scheduler } = await createScheduler(
      `apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: precise-prefix-cache-producer\n  name: precise\n- type: prefix-cache-scorer\n`,
      { seed: 7, hasher: await createXxHasher() },
    );
    const producer = scheduler.plugins.get("precise") as PrecisePrefixProducer;
    const sub = new KvEventsSubscriber({ index: producer.index, topicFilter: producer.kvEvents.topicFilter });
    t.after(() => sub.close());
    const ids = replicas.map((r) => `127.0.0.1:${r.port}`);
    for (const [i, r] of replicas.entries()) {
      const spec = { id: ids[i], host: "127.0.0.1", kvEvents: r.server.publisher!.endpoint };
      await sub.addEndpoint(kvEventsEndpointFor(spec, producer.kvEvents));
    }
    for (const [i, r] of replicas.entries()) {
      const seen = () => sub.stats().endpoints[ids[i]]?.lastSeq !== null;
      for (let k = 0; k < 100 && !seen(); k++) {
        await postJson(`${r.url}/v1/completions`, {
          model: MODEL,
          prompt: `join ${k} `.repeat(20),
          max_tokens: 1,
        });
        await new Promise((res) => setTimeout(res, 20));
      }
      assert.ok(seen(), `no events from ${ids[i]}`);
    }
    const tok = createSimTokenizer({ vocabSize: replicas[1].server.opts.profile.model.vocabSize });
    const prompt = "Only the second replica has seen this long document. ".repeat(10);
    const tokenIds = tok.encode(prompt, true); // completions add BOS
    await postJson(`${replicas[1].url}/v1/completions`, { model: MODEL, prompt, max_tokens: 1 });
    const candidates = ids.map((id) => endpoint(id));
    const req = completion("e2e", prompt, { model: MODEL, tokenIds });
    const blocks = Math.floor(tokenIds.length / 16);
    await waitFor(
      () =>
        producer.index.longestPrefix(producer.index.keyer.keys(tokenIds, MODEL), [ids[1]], 0).blocks[0] ===
        blocks,
    );
    const r = scheduler.schedule(req, candidates, 0);
    assert.equal(r.target?.id, ids[1]);
    const info = r.cycle.get(prefixKey("precise"));
    assert.equal(info?.matchBlocks(ids[1]), blocks);
    assert.equal(info?.matchBlocks(ids[0]), 0);
  });
});
