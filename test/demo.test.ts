/**
 * `kvgate demo` end to end at a tiny scale: exits 0, writes both live runs and the simulator's
 * two beside them, prints the CPU each part used, renices the replicas (not the gateway) when
 * asked, and leaves no process behind.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Abandoned, Barrier } from "../src/bench/demo.ts";
import { parseResultsFile } from "../src/bench/results.ts";
import { KVGATE_BIN } from "../src/sim/launcher.ts";

const TINY = [
  "--replicas",
  "2",
  "--users",
  "6",
  "--requests",
  "24",
  "--time-scale",
  "20",
  "--output-len",
  "8",
  "--blocks",
  "3000",
  "--profile",
  "llama-3.1-8b-h100",
];

/** Pids of live processes whose environment carries `marker` (children inherit it). */
function processesWith(marker: string): number[] {
  const pids: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${d}/environ`, "latin1").includes(marker)) pids.push(Number(d));
    } catch {}
  }
  return pids;
}

function runDemo(args: string[], onLine?: (line: string, kill: () => void) => void) {
  const marker = `KVGATE_DEMO_TEST=${randomUUID()}`;
  const [k, v] = marker.split("=");
  const child = spawn(process.execPath, [KVGATE_BIN, "demo", ...args], {
    env: { ...process.env, [k]: v },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => {
    out += d;
    for (const line of d.split("\n")) onLine?.(line, () => child.kill("SIGINT"));
  });
  child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
  // Generous: replicas take tens of seconds to start on a loaded 2-core machine.
  const timer = setTimeout(() => child.kill("SIGKILL"), 300_000);
  const done = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal });
    }),
  );
  return { done, marker, out: () => out, err: () => err };
}

/** Niceness and command line of a live process. */
function niceOf(pid: number): { nice: number; cmd: string } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const cmd = readFileSync(`/proc/${pid}/cmdline`, "latin1").split("\0").join(" ");
    return { nice: Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]), cmd };
  } catch {
    return null;
  }
}

async function noneLeft(marker: string): Promise<number[]> {
  // Children get SIGTERM then SIGKILL from the demo; give the kernel a moment to reap them.
  for (let i = 0; i < 50; i++) {
    const left = processesWith(marker);
    if (left.length === 0) return left;
    await new Promise((r) => setTimeout(r, 100));
  }
  return processesWith(marker);
}

test("the demo runs round-robin and kvgate side by side, writes both runs and exits 0 with no process left", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-demo-"));
  try {
    const json = join(dir, "demo.json");
    const report = join(dir, "demo.html");
    let seen: Array<{ nice: number; cmd: string }> = [];
    const run = runDemo([...TINY, "--replica-nice", "7", "--json", json, "--report", report], (line) => {
      if (line.startsWith("kvgate:") && line.includes("replicas ready"))
        seen = processesWith(run.marker).flatMap((pid) => niceOf(pid) ?? []);
    });
    const { code } = await run.done;
    assert.equal(code, 0, `demo failed: ${run.err()}`);
    const replicas = seen.filter((p) => p.cmd.includes(" sim-replica "));
    const gateway = seen.filter((p) => p.cmd.includes(" serve "));
    // The kvgate phase's 2 and round-robin's 2, which wait at the start line for kvgate's.
    assert.equal(replicas.length, 4, JSON.stringify(seen));
    assert.deepEqual(
      replicas.map((p) => p.nice),
      replicas.map(() => 7),
    );
    assert.deepEqual(
      gateway.map((p) => p.nice),
      [0],
      "the gateway keeps its priority",
    );
    const out = run.out().split("\n");
    const at = (re: RegExp) => out.findIndex((l) => re.test(l));
    const both = at(/^both phases ready: their users start now, side by side$/);
    assert.ok(
      both > at(/^round-robin: 2 replicas ready/) && both > at(/^kvgate: 2 replicas ready/),
      run.out(),
    );
    assert.match(run.out(), /CPU while round-robin ran .*replicas \d+\.\d\d, no gateway; /);
    assert.match(run.out(), /CPU while kvgate ran .*gateway \d+\.\d\d; /);
    assert.match(run.out(), /the load generator drove both phases at once: client \d+\.\d\d over/);
    assert.match(run.out(), /kvgate vs round-robin, live: +output tokens\/s/);
    assert.match(run.out(), /kvgate vs round-robin, simulated: output tokens\/s/);
    assert.match(
      run.out(),
      /live vs simulated \(round-robin \/ kvgate\), how far outside the 8 draws' range: output tokens\/s/,
    );
    assert.match(run.out(), /where the gain comes from: prefix-cache hit rate/);
    assert.ok(run.out().includes(`report: ${report}`), "prints the report's path");
    const html = readFileSync(report, "utf8");
    assert.match(html, /<svg/);
    assert.ok(html.includes("round-robin") && html.includes("kvgate"));
    const file = parseResultsFile(readFileSync(json, "utf8"));
    assert.equal(file.simulated, true);
    assert.deepEqual(
      file.runs.map((r) => r.router),
      ["round-robin", "kvgate", "round-robin (kvgate simulate)", "kvgate (kvgate simulate)"],
    );
    for (const r of file.runs) {
      // 24 sent; each of the 6 users' first (cold) request is warm-up, not measured.
      assert.equal(r.requests, 18, r.router);
      assert.equal((r.workload as { preset?: string }).preset, "tutorial");
      assert.equal(r.errors, 0);
      assert.ok((r.output_tokens_per_s ?? 0) > 0);
    }
    assert.deepEqual(await noneLeft(run.marker), []);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("Ctrl-C in the kvgate phase stops the demo, its replicas and the gateway; it still exits 0", async () => {
  let sent = false;
  const run = runDemo(
    [
      ...TINY,
      // One phase after the other: Ctrl-C comes once round-robin has finished.
      "--sequential",
      // Long enough answers at a slower clock that the kvgate phase is still running when Ctrl-C comes.
      "--time-scale",
      "4",
      "--output-len",
      "300",
      "--no-predict",
      "--json",
      join(tmpdir(), `kvgate-demo-ctrlc-${process.pid}.json`),
      "--report",
      join(tmpdir(), `kvgate-demo-ctrlc-${process.pid}.html`),
    ],
    (line, kill) => {
      if (!sent && line.startsWith("kvgate:") && line.includes("replicas ready")) {
        sent = true;
        setTimeout(kill, 300);
      }
    },
  );
  const { code } = await run.done;
  assert.ok(sent, `demo never got going: ${run.err()}`);
  assert.equal(code, 0, run.err());
  assert.deepEqual(await noneLeft(run.marker), []);
});

test("Barrier: opens when every party has arrived; abandoned, it rejects every wait with Abandoned", async () => {
  const state = (p: Promise<void>) =>
    Promise.race([
      p.then(
        () => "open",
        (e: Error) => e.name,
      ),
      new Promise((r) => setImmediate(() => r("waiting"))),
    ]);
  const b = new Barrier(2);
  const first = b.arrive();
  assert.equal(await state(first), "waiting", "one of two has arrived");
  const second = b.arrive();
  assert.equal(await state(first), "open");
  assert.equal(await state(second), "open");
  const c = new Barrier(2);
  const waiting = c.arrive();
  c.abandon("the kvgate phase did not start");
  await assert.rejects(
    waiting,
    (e: Error) => e instanceof Abandoned && /kvgate phase did not start/.test(e.message),
  );
  await assert.rejects(c.arrive(), Abandoned, "a later arrival is turned away too");
});
