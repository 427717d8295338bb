/**
 * Starts kvgate processes (simulated replicas, the gateway) as children of this process, waits for
 * each one's startup line, and makes sure none outlives its parent: `stopAll()` sends SIGTERM then
 * SIGKILL, and a process-exit hook kills whatever is left. Used by the demo and bench:picker.
 */
import { type ChildProcess, spawn } from "node:child_process";
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

const live = new Set<ChildProcess>();
let hooked = false;

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", () => {
    for (const p of live) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
  });
}

/**
 * Spawns `bin/kvgate <args>` and resolves once it prints a line containing `listening on URL`.
 * Rejects (and kills the child) if it exits first or does not start within `timeoutMs`.
 */
export function spawnKvgate(name: string, args: string[], timeoutMs = 30_000): Promise<Child> {
  hookExit();
  const proc = spawn(process.execPath, [KVGATE_BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
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
      proc.kill("SIGKILL");
      reject(new Error(`${name} did not start within ${timeoutMs} ms; stderr: ${err.trim()}`));
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
      reject(new Error(`${name} exited before starting (code ${code}, signal ${signal}): ${err.trim()}`));
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
