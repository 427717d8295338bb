/**
 * The first hour with the CLI: `kvgate --version`, a `vllm serve` command line's common flags accepted
 * by sim-replica (with a startup note for those that change nothing), and a second replica on taken
 * ports failing with a message that names the address and the flag to change, never a stack.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { test } from "node:test";
import { postJson, runKvgate, spawnReplica, startTestReplica } from "./helpers/replica.ts";

const VERSION = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;

async function freePorts(k: number): Promise<number[]> {
  const held = await Promise.all(
    Array.from(
      { length: k },
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve) => {
          const s = createServer();
          s.listen(0, () => resolve(s));
        }),
    ),
  );
  const ports = held.map((s) => (s.address() as { port: number }).port);
  await Promise.all(held.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

const kvConfig = (pub: number, replay: number) =>
  JSON.stringify({
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: `tcp://*:${pub}`,
    replay_endpoint: `tcp://*:${replay}`,
    topic: "kv@r1@m",
  });

test("kvgate --version and -V print package.json's version", { timeout: 180_000 }, async () => {
  for (const flag of ["--version", "-V"]) {
    const r = await runKvgate([flag], { timeoutMs: 90_000 });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${VERSION}\n`);
  }
});

test("sim-replica takes vllm serve's common flags; those that change nothing get one startup note", {
  timeout: 180_000,
}, async (t) => {
  const help = await runKvgate(["sim-replica", "--help"], { timeoutMs: 90_000 });
  assert.equal(help.code, 0, help.stderr);
  const group = help.stdout.slice(help.stdout.indexOf("Accepted for `vllm serve` compatibility"));
  for (const flag of ["--gpu-memory-utilization", "--tensor-parallel-size", "--dtype", "--api-key"])
    assert.match(group, new RegExp(`${flag}\\b`), `${flag} is listed as having no effect`);

  const p = await spawnReplica(
    [
      ...[
        "--gpu-memory-utilization",
        "0.85",
        "-tp",
        "2",
        "--pipeline-parallel-size=1",
        "--dtype",
        "bfloat16",
      ],
      ...["--trust-remote-code", "--disable-log-requests", "--no-enable-chunked-prefill"],
      ...["--kv-cache-dtype", "fp8", "--swap-space", "4", "--uvicorn-log-level", "warning"],
      ...["--api-key", "secret", "--enforce-eager", "--max-num-seqs", "7", "--no-enable-prefix-caching"],
      ...["--served-model-name", "m", "--num-gpu-blocks-override", "1000", "--max-model-len", "4096"],
    ],
    { startTimeoutMs: 90_000 },
  );
  t.after(() => p.close());
  const res = await postJson(`${p.url}/v1/completions`, { model: "m", prompt: "hi", max_tokens: 2 });
  assert.equal(res.status, 200);
  const notes = p
    .stderr()
    .split("\n")
    .filter((l) => l.includes("no effect on the simulation"));
  assert.equal(notes.length, 1, p.stderr());
  for (const flag of [
    "--gpu-memory-utilization (",
    "--tensor-parallel-size (",
    "--pipeline-parallel-size (",
    "--dtype (",
    "--trust-remote-code (",
    "--no-enable-chunked-prefill (",
    "--api-key (",
  ])
    assert.ok(notes[0]!.includes(flag), `note names ${flag}: ${notes[0]}`);
  // Flags the simulation does honour are not in the note.
  for (const flag of ["--max-num-seqs", "--no-enable-prefix-caching", "--enable-chunked-prefill ("])
    assert.ok(!notes[0]!.includes(flag), `${flag} is not in the note`);
  const metrics = await (await fetch(`${p.url}/metrics`)).text();
  assert.match(metrics, /vllm:cache_config_info\{[^}]*enable_prefix_caching="False"/);
});

test("a second replica on taken ports names the address and the flag to change, without a stack", {
  timeout: 240_000,
}, async (t) => {
  const [pub, replay, other] = await freePorts(3);
  const first = await startTestReplica({ kvEventsConfig: kvConfig(pub!, replay!) });
  t.after(() => first.close());
  const cases: Array<[string[], RegExp]> = [
    [
      ["--kv-events-config", kvConfig(pub!, replay!)],
      new RegExp(
        `--kv-events-config "endpoint" tcp://\\*:${pub} is already in use .*"endpoint":"tcp://\\*:${pub! + 10}"`,
      ),
    ],
    [
      ["--kv-events-config", kvConfig(other!, replay!)],
      new RegExp(`--kv-events-config "replay_endpoint" tcp://\\*:${replay} is already in use`),
    ],
    [
      ["--port", String(first.port)],
      new RegExp(`127\\.0\\.0\\.1:${first.port} \\(--port\\) is already in use .*pick another --port`),
    ],
  ];
  for (const [args, re] of cases) {
    const r = await runKvgate(["sim-replica", "--host", "127.0.0.1", "--port", "0", ...args], {
      timeoutMs: 90_000,
    });
    assert.equal(r.code, 1, `${args.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, /^kvgate sim-replica: cannot start: /);
    assert.match(r.stderr, re);
    assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
  }
});
