/**
 * Starts kvgate processes (simulated replicas, the gateway) as children of this process, waits for
 * each one's startup line, and makes sure none outlives its parent: `stopAll()` sends SIGTERM then
 * SIGKILL, and a process-exit hook kills whatever is left. Used by the demo and bench:picker.
 *
 * The start timeout adapts to the machine: its base (60 s unless given) is stretched by the load
 * average per CPU, so a busy 2-core machine gets longer. A timeout names the process, what was
 * awaited (its "listening on" line), how long, how much CPU the child got meanwhile, and what to do.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { availableParallelism, loadavg } from "node:os";
import { fileURLToPath } from "node:url";

export const KVGATE_BIN = fileURLToPath(new URL("../../bin/kvgate", import.meta.url));

export interface Child {
  name: string;
  proc: ChildProcess;
  /** The URL from the startup line ("... listening on http://host:port ..."). */
  url: string;
  /** That startup line. */
  banner: string;
  /** Everything the process wrote to stderr (kept for error messages). */
  stderr(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface SpawnOptions {
  /** Fixed start timeout, ms. Default: adaptiveStartTimeoutMs(). */
  timeoutMs?: number;
  /** What the user can do about a timeout (appended to its message). */
  hint?: string;
  /** Another tree's bin/kvgate (bench:relay's baseline); default this tree's. */
  bin?: string;
  /** Node flags before the script (e.g. --cpu-prof). */
  nodeArgs?: string[];
}

const live = new Set<ChildProcess>();
let hooked = false;

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", () => {
    for (const p of live) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  });
}

/** The machine's 1-minute load average per CPU (0 where the OS does not report one). */
export function loadPerCpu(): number {
  return loadavg()[0] / Math.max(1, availableParallelism());
}

/**
 * `baseMs` stretched by the load per CPU (a loaded machine gives each starting process a smaller
 * share), at most 10 × `baseMs`.
 */
export function adaptiveStartTimeoutMs(baseMs = 60_000, load = loadPerCpu()): number {
  return Math.round(baseMs * Math.min(10, Math.max(1, load)));
}

/** CPU seconds a process has used, from /proc (Linux); null where unavailable. */
export function cpuSecondsOf(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // Fields 14 and 15 (utime, stime) in clock ticks; after the ")" they are at 11 and 12.
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return null;
  }
}

function timeoutMessage(name: string, args: string[], pid: number | undefined, ms: number, err: string) {
  const cpu = cpuSecondsOf(pid);
  const load = loadavg()[0];
  const cpus = availableParallelism();
  const got =
    cpu === null
      ? ""
      : cpu < 0.2
        ? `; it got ${cpu.toFixed(1)} s of CPU in that time, so it was starved or stuck before running`
        : `; it got ${cpu.toFixed(1)} s of CPU in that time (still starting up: the machine is busy)`;
  return (
    `${name} (pid ${pid ?? "?"}, \`kvgate ${args.join(" ")}\`) did not print its "listening on http://..." ` +
    `startup line on stdout within ${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s (load average ${load.toFixed(1)} on ${cpus} CPUs${got}). ` +
    `Its stderr: ${err.trim() || "(empty)"}.`
  );
}

/**
 * The argv of `kvgate sim-replica` on a free loopback port, then `--flag value` for each entry of
 * `flags` that is not undefined (e.g. `{ profile: "llama-3.1-8b-h100", "time-scale": 2 }`).
 */
export function simReplicaArgs(flags: Record<string, string | number | undefined> = {}): string[] {
  const args = ["sim-replica", "--host", "127.0.0.1", "--port", "0"];
  for (const [name, value] of Object.entries(flags))
    if (value !== undefined) args.push(`--${name}`, String(value));
  return args;
}

/**
 * Spawns `bin/kvgate <args>` and resolves once it prints a line containing `listening on URL`.
 * Rejects (and kills the child) if it exits first or does not start within the timeout
 * (a number is a fixed timeout in ms, as before).
 */
export function spawnKvgate(name: string, args: string[], opts: number | SpawnOptions = {}): Promise<Child> {
  const o: SpawnOptions = typeof opts === "number" ? { timeoutMs: opts } : opts;
  const timeoutMs = o.timeoutMs ?? adaptiveStartTimeoutMs();
  hookExit();
  const proc = spawn(process.execPath, [...(o.nodeArgs ?? []), o.bin ?? KVGATE_BIN, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  live.add(proc);
  let out = "";
  let err = "";
  proc.stdout!.setEncoding("utf8");
  proc.stderr!.setEncoding("utf8").on("data", (d: string) => {
    err = (err + d).slice(-20_000);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once("exit", (code, signal) => {
      live.delete(proc);
      resolve({ code, signal });
    }),
  );
  return new Promise<Child>((resolve, reject) => {
    const timer = setTimeout(() => {
      const msg = timeoutMessage(name, args, proc.pid, timeoutMs, err);
      proc.kill("SIGKILL");
      reject(new Error(o.hint ? `${msg} ${o.hint}` : msg));
    }, timeoutMs);
    const onData = (d: string) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m === null) return;
      clearTimeout(timer);
      proc.stdout!.off("data", onData);
      proc.stdout!.resume();
      const banner = out.split("\n").find((l) => l.includes(m[0])) ?? m[0];
      resolve({ name, proc, url: m[1].replace(/[,;]$/, ""), banner, stderr: () => err, exited });
    };
    proc.stdout!.on("data", onData);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(
        new Error(
          `${name} (\`kvgate ${args.join(" ")}\`) exited before starting (code ${code}, signal ${signal}); its stderr: ${err.trim() || "(empty)"}`,
        ),
      );
    });
  });
}

/** Stops children: SIGTERM, then SIGKILL after `graceMs`. Resolves when all have exited. */
export async function stopAll(children: Child[], graceMs = 3000): Promise<void> {
  await Promise.all(
    children.map(async (c) => {
      if (c.proc.exitCode !== null || c.proc.signalCode !== null) return;
      c.proc.kill("SIGTERM");
      const t = setTimeout(() => c.proc.kill("SIGKILL"), graceMs);
      await c.exited;
      clearTimeout(t);
    }),
  );
}
