/**
 * `kvgate sim-fleet N` as a user runs it: N replicas on distinct ports that answer, an endpoints file
 * on stdout that `kvgate serve --endpoints-file` loads, KV events on each replica's own socket with the
 * topic kv@<pod>@<model>, flags it manages refused, and SIGTERM stopping every replica.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";
import { Subscriber } from "zeromq";
import { parseEndpointsFile } from "../src/datalayer/endpoints.ts";
import { waitFor } from "./helpers/gateway-fakes.ts";
import { KVGATE_BIN, postJson, runKvgate } from "./helpers/replica.ts";

test("sim-fleet refuses flags it sets per replica, before starting any", { timeout: 120_000 }, async () => {
  const r = await runKvgate(["sim-fleet", "2", "--", "--port", "9000"], { timeoutMs: 90_000 });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /--port is set per replica by sim-fleet/);
});

test("sim-fleet 2 starts two replicas that answer and prints a loadable endpoints file", {
  timeout: 180_000,
}, async (t) => {
  const args = ["sim-fleet", "2", "--port", "0", "--kv-events-port", "0", "--model", "m"];
  args.push("--time-scale", "100", "--num-gpu-blocks-override", "2048", "--max-model-len", "8192");
  const child = spawn(process.execPath, [KVGATE_BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  await waitFor(() => err.includes("replica(s) ready") || child.exitCode !== null, "fleet ready", 150_000);
  assert.match(err, /2 replica\(s\) ready/, err);

  const eps = parseEndpointsFile(out, "sim-fleet stdout"); // the gateway's own parser
  assert.equal(eps.length, 2);
  assert.notEqual(eps[0]!.id, eps[1]!.id);
  assert.deepEqual(
    eps.map((e) => e.labels.pod),
    ["sim-0", "sim-1"],
  );
  const kvPorts = eps.flatMap((e) => [e.kvEvents, e.kvEventsReplay]);
  assert.equal(new Set(kvPorts).size, 4, `four distinct KV-event sockets: ${kvPorts.join(" ")}`);

  // Replica 0 publishes its blocks on its own socket, under its own topic.
  const sub = new Subscriber({ linger: 0, receiveTimeout: 20_000 });
  t.after(() => sub.close());
  sub.connect(eps[0]!.kvEvents!);
  sub.subscribe("kv@");
  await new Promise((r) => setTimeout(r, 300)); // the SUB's subscription reaches the PUB
  for (const e of eps) {
    const res = await postJson(`http://${e.id}/v1/completions`, {
      model: "m",
      prompt: "a shared system prompt ".repeat(20),
      max_tokens: 2,
    });
    assert.equal(res.status, 200, `${e.id} answers`);
  }
  const [topic] = await sub.receive();
  assert.equal(topic!.toString(), "kv@sim-0@m");

  child.kill("SIGTERM");
  assert.equal(await exited, 0, err);
  for (const e of eps)
    await assert.rejects(
      fetch(`http://${e.id}/health`, { signal: AbortSignal.timeout(5000) }),
      `${e.id} stopped with the fleet`,
    );
});
