/** `kvgate serve` as a process: startup line, a request through it, SIGTERM → exit 0, usage errors → 2. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";
import { KVGATE_BIN, runKvgate } from "./helpers/replica.ts";

test("kvgate serve prints one startup line, proxies, and exits 0 on SIGTERM", {
  timeout: 60_000,
}, async () => {
  const up = await startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics()),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": (_q, res) =>
      void res.writeHead(200, { "content-type": "application/json" }).end('{"ok":1}'),
  });
  const child = spawn(
    process.execPath,
    [KVGATE_BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--endpoints", up.id],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  try {
    await waitFor(() => out.includes("\n") || child.exitCode !== null, "startup line", 30_000);
    const m =
      /^kvgate serve: listening on (http:\/\/127\.0\.0\.1:\d+), admin (http:\/\/127\.0\.0\.1:\d+), 1 endpoint\(s\), config built-in\n$/.exec(
        out,
      );
    assert.ok(m, `startup line: ${out} ${err}`);
    const [, url, admin] = m;
    // Before the first scrape an endpoint's health and models are unknown, which still routes.
    const r = await fetch(`${url}/v1/completions`, { method: "POST", body: '{"model":"m","prompt":"x"}' });
    assert.deepEqual([r.status, await r.text()], [200, '{"ok":1}']);
    assert.equal(r.headers.get("x-gateway-destination-endpoint-served"), up.id, "on by default");
    assert.equal((await fetch(`${admin}/endpoints`)).status, 200);
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
    assert.match(err, /SIGTERM, draining/);
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
    await up.close();
  }
});

test("kvgate serve on every interface says so and gives a URL to use; --no-served-endpoint-header", {
  timeout: 120_000,
}, async () => {
  const up = await startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics()),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": (_q, res) =>
      void res.writeHead(200, { "content-type": "application/json" }).end('{"ok":1}'),
  });
  const args = ["serve", "--host", "0.0.0.0", "--port", "0", "--admin-port", "0", "--endpoints", up.id];
  const child = spawn(process.execPath, [KVGATE_BIN, ...args, "--no-served-endpoint-header"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  try {
    await waitFor(() => out.includes("\n") || child.exitCode !== null, "startup line", 90_000);
    const m =
      /^kvgate serve: listening on http:\/\/0\.0\.0\.0:(\d+) \(all interfaces; from this machine (http:\/\/127\.0\.0\.1:(\d+))\), admin http:\/\/127\.0\.0\.1:\d+, 1 endpoint\(s\)/.exec(
        out,
      );
    assert.ok(m, `startup line: ${out} ${err}`);
    assert.equal(m[1], m[3], "the same port");
    const r = await fetch(`${m[2]}/v1/completions`, { method: "POST", body: '{"model":"m","prompt":"x"}' });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("x-gateway-destination-endpoint-served"), null);
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
    await up.close();
  }
});

test("kvgate serve on a taken port names the address and the flag, without a stack", {
  timeout: 120_000,
}, async () => {
  const taken = await startFake({});
  try {
    const r = await runKvgate(
      [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        String(taken.port),
        "--admin-port",
        "0",
        "--endpoints",
        "a:1",
      ],
      { timeoutMs: 90_000 },
    );
    assert.equal(r.code, 1, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(
        `cannot start: 127\\.0\\.0\\.1:${taken.port} \\(--port\\) is already in use .*pick another --port`,
      ),
    );
    assert.doesNotMatch(r.stderr, /\n\s+at /, "no stack trace");
  } finally {
    await taken.close();
  }
});

// Seven process starts in a row: on a loaded 2-core machine each can take ~10 s.
test("kvgate serve: bad flags, endpoints or config exit 2 with a message naming the problem", {
  timeout: 180_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-serve-"));
  try {
    const badEps = join(dir, "eps.yaml");
    writeFileSync(badEps, "- address: nohost\n");
    const badCfg = join(dir, "epp.yaml");
    writeFileSync(
      badCfg,
      "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: nope\n",
    );
    const cases: Array<[string[], RegExp]> = [
      [["serve", "--port", "0"], /exactly one of --endpoints or --endpoints-file/],
      [["serve", "--endpoints", "a:1", "--endpoints-file", badEps], /exactly one of/],
      [["serve", "--endpoints", "a:99999"], /port "99999"/],
      [["serve", "--endpoints-file", badEps], /endpoints\[0\]\.address: "nohost" is not host:port/],
      [["serve", "--endpoints", "a:1", "--config", badCfg, "--port", "0", "--admin-port", "0"], /nope/],
      [
        ["serve", "--endpoints", "a:1", "--config", join(dir, "missing.yaml")],
        /--config .*missing\.yaml: ENOENT.*; check the path/,
      ],
      [["serve", "--endpoints", "a:1", "--max-body-bytes", "0"], /--max-body-bytes/],
    ];
    for (const [args, re] of cases) {
      const r = await runKvgate(args, { timeoutMs: 30_000 });
      assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, re, args.join(" "));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
