/**
 * Per-request rows (`kvgate simulate --records`): TTFT and E2E counted as the run's aggregates count
 * them (the first chunk with a token, the response's trip back added), a failure's kind with no
 * latency, and the JSON Lines round trip with a bad line named.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { RequestRecord } from "../src/bench/request-metrics.ts";
import { parseRowsJsonl, requestRows, rowsJsonl } from "../src/bench/request-rows.ts";

const ok: RequestRecord = {
  id: "r1",
  stage: 2,
  start: 10,
  end: 12,
  // An empty first chunk (role only) is not the first token.
  chunkTimes: [10.05, 10.25, 11.5, 12],
  chunkTokens: [0, 1, 3, 2],
  promptTokens: 700,
  completionTokens: 6,
  cachedTokens: 512,
  endpoint: "sim-3:8000",
  networkDelay: 0.04,
};
const failed: RequestRecord = {
  id: "r2",
  stage: 0,
  warmup: true,
  start: 1,
  end: 1.5,
  chunkTimes: [],
  chunkTokens: [],
  promptTokens: 90,
  completionTokens: 0,
  error: { kind: "http_503", message: "no endpoint", status: 503 },
};

test("a row counts TTFT from the first token and adds the response's trip back", () => {
  const [row, bad] = requestRows("default", [ok, failed]);
  assert.equal(row.router, "default");
  assert.equal(row.stage, 2);
  assert.equal(row.warmup, false);
  assert.equal(row.endpoint, "sim-3:8000");
  assert.ok(Math.abs((row.ttft_s as number) - 0.29) < 1e-9, `ttft ${row.ttft_s}`);
  assert.ok(Math.abs((row.e2e_s as number) - 2.04) < 1e-9, `e2e ${row.e2e_s}`);
  assert.deepEqual([row.prompt_tokens, row.cached_tokens, row.output_tokens], [700, 512, 6]);
  assert.equal(row.error, undefined);
  assert.equal(bad.error, "http_503");
  assert.equal(bad.warmup, true);
  assert.equal(bad.ttft_s, undefined, "a failed request has no TTFT");
  assert.equal(bad.e2e_s, undefined);
});

test("rows survive JSON Lines, and a line that is not a row is named", () => {
  const rows = requestRows("precise", [ok, failed]);
  const text = rowsJsonl(rows);
  assert.equal(text.split("\n").length, 3, "one line each, newline-terminated");
  assert.deepEqual(parseRowsJsonl(text, "f.jsonl"), rows);
  assert.throws(
    () => parseRowsJsonl(`${text}{oops\n`, "f.jsonl"),
    /f\.jsonl:3: not JSON.*one request row per line/,
  );
  assert.throws(
    () => parseRowsJsonl('{"id":"r9"}\n', "g.jsonl"),
    /g\.jsonl:1: not a request row.*kvgate simulate --records/,
  );
});
