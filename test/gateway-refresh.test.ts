/**
 * The gateway drives the scheduler's between-request measurements (Scheduler.refresh) on a timer
 * at the period its plugins ask for, stops with the gateway, and starts none for a config that
 * asks for none.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { startGateway } from "../src/gateway/gateway.ts";

const LOCALITY = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: locality-filter
  parameters: { remeasureMs: 20 }
- type: queue-scorer
- type: max-score-picker
`;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("gateway: Scheduler.refresh() runs on the period the config asks for, and stops at close", async () => {
  const gw = await startGateway({ endpoints: "127.0.0.1:9", config: LOCALITY, log: () => {} });
  const s = gw.gateway.routing.scheduler;
  assert.equal(s.refreshIntervalS, 0.02);
  const calls: number[] = [];
  const real = s.refresh.bind(s);
  s.refresh = (now) => {
    calls.push(now);
    real(now);
  };
  try {
    await sleep(200);
    // 10 periods; timers on a loaded machine fire late, never early.
    assert.ok(calls.length >= 3 && calls.length <= 11, `${calls.length} refreshes in 200 ms`);
    for (let k = 1; k < calls.length; k++) assert.ok(calls[k] > calls[k - 1], "monotonic clock");
  } finally {
    await gw.close();
  }
  const n = calls.length;
  await sleep(60);
  assert.equal(calls.length, n, "no refresh after close");
});

test("gateway: a config without a between-request measurement starts no refresh timer", async () => {
  const gw = await startGateway({ endpoints: "127.0.0.1:9", log: () => {} });
  try {
    const s = gw.gateway.routing.scheduler;
    assert.equal(s.refreshIntervalS, null);
    let calls = 0;
    s.refresh = () => void calls++;
    await sleep(60);
    assert.equal(calls, 0);
  } finally {
    await gw.close();
  }
});
