/**
 * `kvgate serve --pools` and `kvgate epp --pools` from the command line (bad files and flag mixes exit 2 saying what to do, a
 * good file starts and routes), the shipped example file, and the trusted header never reaching a
 * replica.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { startMultiPool } from "../src/gateway/multi-pool/front.ts";
import { loadPoolsFile, parsePoolsFile } from "../src/gateway/multi-pool/pools-file.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";
import { KVGATE_BIN, postJson, runKvgate } from "./helpers/replica.ts";

const fakeReplica = (model: string) =>
  startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ model })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList(model)),
    "POST /v1/completions": (_q, res, body) =>
      void res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ model: JSON.parse(body.toString()).model })),
  });

test("bad --pools files and flag mixes exit 2 with what to do", { timeout: 30_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-pools-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const bad = join(dir, "bad.yaml");
  writeFileSync(bad, "pools:\n  - { name: a }\n");
  const r1 = await runKvgate(["serve", "--pools", bad, "--port", "0", "--admin-port", "0"]);
  assert.equal(r1.code, 2);
  assert.match(r1.stderr, /give exactly one of endpoints/);
  const r2 = await runKvgate(["serve", "--pools", bad, "--endpoints", "127.0.0.1:1"]);
  assert.equal(r2.code, 2);
  assert.match(r2.stderr, /drop --endpoints/);
  const r3 = await runKvgate(["serve", "--pools", join(dir, "missing.yaml")]);
  assert.equal(r3.code, 2);
  assert.match(r3.stderr, /missing\.yaml.*check the path/);
  writeFileSync(bad, "pools:\n  - { name: a, endpoints: 127.0.0.1:1, config: nope.yaml }\n");
  const r4 = await runKvgate(["serve", "--pools", bad, "--port", "0", "--admin-port", "0"]);
  assert.equal(r4.code, 2);
  assert.match(r4.stderr, /pool a: --config .*nope\.yaml/);
});

test("--autoscale-config with --pools is refused, not ignored", { timeout: 30_000 }, async () => {
  const r = await runKvgate(["serve", "--pools", "pools.yaml", "--autoscale-config", "autoscale.yaml"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--autoscale-config is not supported with --pools.*per pool/);
});

test("a good --pools file starts, names its pools and routes by model", { timeout: 30_000 }, async (t) => {
  const [a, b] = await Promise.all([fakeReplica("alpha"), fakeReplica("beta")]);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-pools-"));
  t.after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await Promise.all([a.close(), b.close()]);
  });
  const file = join(dir, "pools.yaml");
  writeFileSync(
    file,
    `pools:\n  - { name: a, endpoints: ${a.id} }\n  - { name: b, endpoints: [${b.id}], models: [beta] }\n`,
  );
  const child = spawn(
    process.execPath,
    [KVGATE_BIN, "serve", "--pools", file, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0"],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  t.after(() => void child.kill("SIGKILL"));
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  await waitFor(() => out.includes("\n"), "startup line", 15_000);
  assert.match(out, /pools a \(1 endpoint\(s\)\), b \(1 endpoint\(s\)\)/);
  const url = /listening on (http:\/\/[^,\s]+)/.exec(out)?.[1];
  await waitFor(() => a.hits("/v1/models") > 0, "pool a's models scraped");
  for (const model of ["alpha", "beta"]) {
    const r = await postJson(`${url}/v1/completions`, { model, prompt: "x", max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
  }
  assert.equal(a.hits("/v1/completions"), 1);
  assert.equal(b.hits("/v1/completions"), 1);
  child.kill("SIGTERM");
  await new Promise((r) => child.once("exit", r));
});

test("the trusted header is removed before the request reaches a replica", { timeout: 30_000 }, async (t) => {
  const [a, b] = await Promise.all([fakeReplica("alpha"), fakeReplica("beta")]);
  const h = await startMultiPool({
    poolsSpec: parsePoolsFile(
      `pools:\n  - { name: a, endpoints: ${a.id}, models: [alpha] }\n  - { name: b, endpoints: ${b.id}, models: [beta] }\ntrustedHeader: { name: x-selected-model, selects: model }\n`,
      "p.yaml",
      ".",
    ),
    scrapeIntervalMs: 25,
    log: () => {},
  });
  t.after(async () => {
    await h.close();
    await Promise.all([a.close(), b.close()]);
  });
  const r = await postJson(
    `${h.url}/v1/completions`,
    { model: "alpha", prompt: "x", max_tokens: 1 },
    {
      "x-selected-model": "beta",
    },
  );
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.model, "beta"); // the body's model was rewritten to the header's
  const sent = b.requests.filter((q) => q.url === "/v1/completions");
  assert.equal(sent.length, 1);
  assert.equal(sent[0].headers["x-selected-model"], undefined);
  assert.equal(a.hits("/v1/completions"), 0);
});

test("the shipped example pools file loads and its pool configs build", async () => {
  const path = new URL("../config/examples/multi-pool/pools.yaml", import.meta.url).pathname;
  const f = loadPoolsFile(path);
  assert.deepEqual(
    f.pools.map((p) => p.name),
    ["llama-8b", "qwen-7b"],
  );
  assert.deepEqual(
    f.rewrites.map((r) => r.name),
    ["chat-alias", "renamed"],
  );
  assert.equal(f.trustedHeader?.selects, "model");
  for (const p of f.pools) await createScheduler(readFileSync(p.configFile as string, "utf8"));
  assert.equal(dirname(f.pools[1].endpointsFile as string), dirname(path));
});

test("kvgate epp --pools: flag mixes exit 2 with what to do", { timeout: 120_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-pools-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, "pools.yaml");
  writeFileSync(file, "pools:\n  - { name: a, endpoints: 127.0.0.1:1 }\n");
  const r1 = await runKvgate([
    "epp",
    "--pools",
    file,
    "--endpoints",
    "127.0.0.1:2",
    "--config-file",
    "x.yaml",
  ]);
  assert.equal(r1.code, 2);
  assert.match(r1.stderr, /--pools names each pool's endpoints.*drop --endpoints, --config-file/);
  const r2 = await runKvgate(["epp", "--pools", file, "--ha-enable-leader-election"]);
  assert.equal(r2.code, 2);
  assert.match(r2.stderr, /not supported with --pools/);
  const bad = join(dir, "bad.yaml");
  writeFileSync(bad, "pools:\n  - { name: a }\n");
  const r3 = await runKvgate([
    "epp",
    "--pools",
    bad,
    "--grpc-port",
    "0",
    "--grpc-health-port",
    "0",
    "--metrics-port",
    "0",
  ]);
  assert.equal(r3.code, 2);
  assert.match(r3.stderr, /give exactly one of endpoints/);
});

test("kvgate epp --pools starts and names its pools", { timeout: 120_000 }, async (t) => {
  const [a, b] = await Promise.all([fakeReplica("alpha"), fakeReplica("beta")]);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-pools-"));
  t.after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await Promise.all([a.close(), b.close()]);
  });
  const file = join(dir, "pools.yaml");
  writeFileSync(
    file,
    `pools:\n  - { name: a, endpoints: ${a.id} }\n  - { name: b, endpoints: [${b.id}], models: [beta] }\n`,
  );
  const args = ["--host", "127.0.0.1", "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0"];
  const child = spawn(process.execPath, [KVGATE_BIN, "epp", "--pools", file, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  t.after(() => void child.kill("SIGKILL"));
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  await waitFor(() => out.includes("\n"), "startup line", 60_000);
  assert.match(
    out,
    /kvgate epp: ext_proc on 127\.0\.0\.1:\d+ \(TLS self-signed\).*pools a \(1 endpoint\(s\)\), b \(1 endpoint\(s\)\)/,
  );
  const metrics = /metrics (http:\/\/[^\s,]+)\/metrics/.exec(out)?.[1];
  const pools = (await (await fetch(`${metrics}/pools`)).json()) as { pools: { name: string }[] };
  assert.deepEqual(
    pools.pools.map((p) => p.name),
    ["a", "b"],
  );
  child.kill("SIGTERM");
  const code = await new Promise((r) => child.once("exit", r));
  assert.equal(code, 0);
});
