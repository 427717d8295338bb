/**
 * `kvgate sim-replica` as a user runs it (spawned through bin/kvgate from another cwd): --help, flag
 * validation with exit code 2 naming the flag, the startup line, serving, SIGTERM → exit 0, and
 * profiles loaded by name or from a user's YAML file.
 */
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { listProfiles, loadProfile, PROFILES_DIR } from "../src/sim/profiles.ts";
import { resolveReplicaOptions } from "../src/sim/replica-options.ts";
import { postJson, runKvgate, spawnReplica } from "./helpers/replica.ts";

test("kvgate --help and kvgate sim-replica --help work from any cwd", async () => {
  const top = await runKvgate(["--help"], { cwd: tmpdir() });
  assert.equal(top.code, 0, top.stderr);
  assert.match(top.stdout, /sim-replica/);
  const sub = await runKvgate(["sim-replica", "--help"], { cwd: tmpdir() });
  assert.equal(sub.code, 0, sub.stderr);
  for (const flag of [
    "--port",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--num-gpu-blocks-override",
    "--kv-events-config",
    "--no-enable-prefix-caching",
    "--time-scale",
    "--profile",
    "--fault-crash-after",
    "--fault-metrics",
  ])
    assert.ok(sub.stdout.includes(flag), `help mentions ${flag}`);
});

test("bad flags exit with code 2 and a message naming the flag", async () => {
  const cases: [string[], RegExp][] = [
    [["--port", "abc"], /--port/],
    [["--time-scale", "0"], /--time-scale/],
    [["--profile", "no-such-profile"], /--profile.*available: .*llama-3\.1-8b-h100/],
    [["--max-model-len", "999999999"], /--max-model-len/],
    [["--num-gpu-blocks-override", "10", "--max-model-len", "4096"], /--max-model-len.*do not fit/],
    [["--kv-events-config", "{bad json"], /--kv-events-config/],
    [["--kv-events-config", '{"enable_kv_cache_events":true,"nope":1}'], /--kv-events-config/],
    [["--kv-events-format", "xml"], /--kv-events-format/],
    [["--fault-error-rate", "2"], /--fault-error-rate/],
    [["--fault-metrics", "sometimes"], /--fault-metrics/],
    [["--block-size", "0"], /--block-size/],
    [["--no-such-flag"], /unknown option/],
  ];
  for (const [args, pattern] of cases) {
    const res = await runKvgate(["sim-replica", ...args, "--port", "0"], { cwd: tmpdir() });
    assert.equal(res.code, 2, `${args.join(" ")}: exit ${res.code}; ${res.stderr}`);
    assert.match(res.stderr, pattern, args.join(" "));
  }
});

test("startup line, serving, and SIGTERM → exit 0", async (t) => {
  const p = await spawnReplica([
    "--served-model-name",
    "cli-model",
    "--num-gpu-blocks-override",
    "1000",
    "--max-model-len",
    "4096",
  ]);
  t.after(() => p.close());
  assert.match(p.banner, /^kvgate sim-replica listening on http:\/\/127\.0\.0\.1:\d+ /);
  assert.match(p.banner, /profile=llama-3\.1-8b-h100/);
  assert.match(p.banner, /blocks=1000/);
  assert.match(p.banner, /time_scale=100x/);
  const res = await postJson(`${p.url}/v1/completions`, { model: "cli-model", prompt: "hi", max_tokens: 2 });
  assert.equal(res.status, 200);
  const status = await p.close();
  assert.equal(status.code, 0, p.stderr());
  assert.equal(status.signal, null);
});

test("profiles: built-in names, a user's YAML by path, clear errors", async () => {
  const names = listProfiles();
  assert.ok(names.includes("llama-3.1-8b-h100"));
  assert.equal(loadProfile("qwen3-32b-tp2-h100").hardware.tensorParallel, 2);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-profile-"));
  try {
    const mine = join(dir, "my-gpu.yaml");
    const text = readFileSync(join(PROFILES_DIR, "llama-3.1-8b-h100.yaml"), "utf8").replace(
      "name: llama-3.1-8b-h100",
      "name: my-gpu",
    );
    writeFileSync(mine, text.replace("kvCapacityTokens: 421000", "kvCapacityTokens: 16000"));
    const opts = await resolveReplicaOptions({ profile: mine });
    assert.equal(opts.profile.name, "my-gpu");
    assert.equal(opts.numGpuBlocks, 1001, "blocks from the profile's KV capacity, plus the null block");
    assert.equal(opts.maxModelLen, 16000, "max-model-len capped by what the KV cache holds");
    // A profile directory of the user's own, addressed by name.
    copyFileSync(mine, join(dir, "other.yaml"));
    assert.deepEqual(listProfiles(dir), ["my-gpu", "other"]);
    assert.equal(loadProfile("other", { dir }).name, "my-gpu");
    writeFileSync(join(dir, "broken.yaml"), "name: x\nmodel: [1, 2\n");
    assert.throws(() => loadProfile(join(dir, "broken.yaml")), /invalid YAML/);
    writeFileSync(join(dir, "invalid.yaml"), "name: x\n");
    assert.throws(
      () => loadProfile(join(dir, "invalid.yaml")),
      /profile .*invalid\.yaml: model must be a mapping/,
    );
    const p = await spawnReplica(["--profile", mine], { startTimeoutMs: 20_000 });
    try {
      assert.match(p.banner, /profile=my-gpu/);
      assert.match(p.banner, /blocks=1001/);
    } finally {
      await p.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
