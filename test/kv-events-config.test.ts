// Tests for `--kv-events-config` parsing (vLLM's KVEventsConfig fields, defaults and strictness) and the
// data-parallel endpoint offset (vLLM's ZmqEventPublisher.offset_endpoint_port).

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  KvEventsConfigError,
  offsetEndpointPort,
  parseKvEventsConfig,
  publishesEvents,
} from "../src/sim/kv-events-config.ts";

test("an empty object gives vLLM's defaults, with publisher resolved to 'null' when disabled", () => {
  assert.deepEqual(parseKvEventsConfig("{}"), {
    enableKvCacheEvents: false,
    publisher: "null",
    endpoint: "tcp://*:5557",
    replayEndpoint: null,
    bufferSteps: 10000,
    hwm: 100000,
    maxQueueSize: 100000,
    topic: "",
  });
});

test("publisher defaults to 'zmq' when enabled; an explicit value wins either way", () => {
  assert.equal(parseKvEventsConfig('{"enable_kv_cache_events":true}').publisher, "zmq");
  assert.equal(parseKvEventsConfig('{"enable_kv_cache_events":true,"publisher":null}').publisher, "zmq");
  assert.equal(parseKvEventsConfig('{"enable_kv_cache_events":true,"publisher":"null"}').publisher, "null");
  assert.equal(parseKvEventsConfig('{"publisher":"zmq"}').publisher, "zmq");
  assert.equal(publishesEvents(parseKvEventsConfig('{"enable_kv_cache_events":true}')), true);
  assert.equal(publishesEvents(parseKvEventsConfig('{"publisher":"zmq"}')), false);
  assert.equal(
    publishesEvents(parseKvEventsConfig('{"enable_kv_cache_events":true,"publisher":"null"}')),
    false,
  );
});

test("the llm-d invocation parses to camelCase fields", () => {
  const c = parseKvEventsConfig(
    '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://indexer:5557",' +
      '"replay_endpoint":"tcp://*:5558","buffer_steps":5,"hwm":7,"max_queue_size":9,"topic":"kv@10.0.0.5:8000@m"}',
  );
  assert.deepEqual(c, {
    enableKvCacheEvents: true,
    publisher: "zmq",
    endpoint: "tcp://indexer:5557",
    replayEndpoint: "tcp://*:5558",
    bufferSteps: 5,
    hwm: 7,
    maxQueueSize: 9,
    topic: "kv@10.0.0.5:8000@m",
  });
});

test("unknown keys are rejected, naming every one", () => {
  assert.throws(
    () =>
      parseKvEventsConfig('{"enable_kv_cache_events":true,"endpont":"x","prefix_cache_upload_token":"t"}'),
    (err: unknown) =>
      err instanceof KvEventsConfigError &&
      /unknown field\(s\) endpont, prefix_cache_upload_token/.test(err.message),
  );
});

test("wrong types, negatives, fractions, bad JSON and non-objects fail with the field named", () => {
  const cases: [string, RegExp][] = [
    ['{"enable_kv_cache_events":"true"}', /enable_kv_cache_events/],
    ['{"publisher":"kafka"}', /publisher/],
    ['{"buffer_steps":-1}', /buffer_steps/],
    ['{"hwm":1.5}', /hwm/],
    ['{"max_queue_size":"10"}', /max_queue_size/],
    ['{"endpoint":5557}', /endpoint/],
    ['{"topic":null}', /topic/],
    ["{", /not valid JSON/],
    ["[]", /\(root\)/],
    ["null", /\(root\)/],
  ];
  for (const [json, re] of cases) {
    assert.throws(
      () => parseKvEventsConfig(json),
      (err: unknown) => err instanceof KvEventsConfigError && re.test(err.message),
      json,
    );
  }
});

test("offsetEndpointPort: rank 0 unchanged, tcp port + rank, inproc suffix, errors as in vLLM", () => {
  assert.equal(offsetEndpointPort("tcp://*:5557", 0), "tcp://*:5557");
  assert.equal(offsetEndpointPort("tcp://*:5557", 1), "tcp://*:5558");
  assert.equal(offsetEndpointPort("tcp://indexer:5557", 3), "tcp://indexer:5560");
  assert.equal(offsetEndpointPort("tcp://[::1]:6000", 2), "tcp://[::1]:6002");
  assert.equal(offsetEndpointPort("inproc://cache", 2), "inproc://cache_dp2");
  assert.equal(offsetEndpointPort(null, 4), null);
  assert.equal(offsetEndpointPort("ipc:///tmp/kv", 0), "ipc:///tmp/kv");
  assert.throws(() => offsetEndpointPort("ipc:///tmp/kv", 1), KvEventsConfigError);
  assert.throws(() => offsetEndpointPort("tcp://127.0.0.1:*", 1), KvEventsConfigError);
});
