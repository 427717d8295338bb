/**
 * The bench entry scripts' flag errors (src/bench/cli-args.ts): an unknown flag prints one line
 * naming the script and the flag, then the script's usage, and exits 2; no stack trace. Each script
 * below stops at argument parsing, before any simulation or child process starts.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

function run(script: string, args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ["--import", "tsx", script, ...args],
      { cwd: ROOT, timeout: 60_000 },
      (err, _stdout, stderr) => resolve({ code: err === null ? 0 : (err.code as number | null), stderr }),
    );
  });
}

const cases = [
  {
    name: "bench:stage-anatomy",
    script: "src/bench/stage-anatomy-run.ts",
    args: ["x.yaml", "--routers", "x"],
  },
  { name: "bench:engine", script: "src/bench/engine-bench.ts", args: ["--bogus"] },
  { name: "bench:relay upstream", script: "src/bench/relay/upstream.ts", args: ["--bogus"] },
];

for (const c of cases)
  test(`${c.name}: an unknown flag is a one-line error and the usage, exit 2, no stack trace`, async () => {
    const r = await run(c.script, c.args);
    assert.equal(r.code, 2, r.stderr);
    const [first] = r.stderr.split("\n");
    assert.ok(first.startsWith(`${c.name}: Unknown option '--`), r.stderr);
    assert.match(r.stderr, /\nusage: /);
    assert.doesNotMatch(r.stderr, /^\s+at /m, "no stack frames");
    assert.doesNotMatch(r.stderr, /ERR_PARSE_ARGS/);
  });
