/**
 * The process launcher's start timeout: it adapts to the load per CPU within bounds, and a child
 * that does not print its startup line in time is killed with a message naming the process, the
 * line awaited, the wait and what to do.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { adaptiveStartTimeoutMs, spawnKvgate } from "../src/sim/launcher.ts";

test("the start timeout stretches with the load per CPU, from 1x to at most 10x its base", () => {
  assert.equal(adaptiveStartTimeoutMs(60_000, 0.3), 60_000);
  assert.equal(adaptiveStartTimeoutMs(60_000, 2.5), 150_000);
  assert.equal(adaptiveStartTimeoutMs(60_000, 40), 600_000);
});

test("a child that does not start in time is killed, and the error says what waited for what", async () => {
  const args = ["sim-replica", "--host", "127.0.0.1", "--port", "0", "--profile", "llama-3.1-8b-h100"];
  const err = await spawnKvgate("test replica 3", args, { timeoutMs: 200, hint: "What to do: wait." }).then(
    () => assert.fail("started within 200 ms"),
    (e: Error) => e,
  );
  assert.match(
    err.message,
    /^test replica 3 \(pid \d+, `kvgate sim-replica --host 127\.0\.0\.1 --port 0 --profile llama-3\.1-8b-h100`\) did not print its "listening on http:\/\/\.\.\." startup line on stdout within 0\.2 s \(load average [\d.]+ on \d+ CPUs/,
  );
  assert.match(err.message, /Its stderr: .*\. What to do: wait\.$/s);
});
