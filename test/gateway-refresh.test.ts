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

test("gateway: Scheduler.refresh() runs on the period the config asks for, and stops at close", async (t) => {
  // Only setInterval is mocked: the gateway's startup and close still do real I/O and setTimeout.
  t.mock.timers.enable({ apis: ["setInterval"] });
  const gw = await startGateway({ endpoints: "127.0.0.1:9", config: LOCALITY, log: () => {} });
  const s = gw.gateway.routing.scheduler;
  const calls: number[] = [];
  const real = s.refresh.bind(s);
  s.refresh = (now) => {
    calls.push(now);
    real(now);
  };
  try {
    assert.equal(s.refreshIntervalS, 0.02);
    t.mock.timers.tick(200);
    assert.equal(calls.length, 200 / 20, "one refresh per 20 ms period");
    // The ticks are mocked, the clock the gateway reads is not: it never goes back.
    for (let k = 1; k < calls.length; k++) assert.ok(calls[k] >= calls[k - 1], "monotonic clock");
  } finally {
    await gw.close();
  }
  t.mock.timers.tick(200);
  assert.equal(calls.length, 10, "no refresh after close");
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
