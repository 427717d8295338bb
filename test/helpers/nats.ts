/**
 * A real NATS server for the gateway-sync tests: Debian's `nats-server` on a free loopback port,
 * stopped (SIGTERM) and restartable on the same port. Without the binary the tests are skipped on
 * a developer machine and FAIL in CI (CI=true), as the Chromium and kubectl tests do; `.ci/run`
 * installs it.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { createServer } from "node:net";

const BIN = process.env.NATS_SERVER ?? "nats-server";

export const natsMissing: string | undefined =
  spawnSync(BIN, ["--version"], { stdio: "ignore" }).status === 0
    ? undefined
    : `${BIN} not found (apt-get install -y nats-server, or run .ci/run)`;

/** Skip outside CI when nats-server is missing; in CI the test runs and fails on it. */
export const natsSkip: string | false =
  natsMissing !== undefined && process.env.CI !== "true" ? natsMissing : false;

export interface NatsServer {
  url: string;
  port: number;
  readonly running: boolean;
  stop(): Promise<void>;
  /** Starts again on the same port. */
  start(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

export async function startNats(): Promise<NatsServer> {
  if (natsMissing !== undefined)
    throw new Error(`${natsMissing}; CI=true, so this test fails instead of skipping`);
  const port = await freePort();
  let child: ChildProcess | null = null;
  const start = () =>
    new Promise<void>((resolve, reject) => {
      const c = spawn(BIN, ["-a", "127.0.0.1", "-p", String(port)], { stdio: ["ignore", "ignore", "pipe"] });
      child = c;
      let err = "";
      const timer = setTimeout(() => reject(new Error(`nats-server did not start: ${err}`)), 10_000);
      c.stderr?.on("data", (d: Buffer) => {
        err += d.toString();
        if (/Server is ready/.test(err)) {
          clearTimeout(timer);
          resolve();
        }
      });
      c.once("exit", (code) => {
        clearTimeout(timer);
        if (child === c) child = null;
        reject(new Error(`nats-server exited (${code}): ${err}`));
      });
    });
  await start();
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    get running() {
      return child !== null;
    },
    stop: () =>
      new Promise<void>((resolve) => {
        const c = child;
        if (c === null) return resolve();
        child = null;
        c.once("exit", () => resolve());
        c.kill("SIGKILL");
      }),
    start,
  };
}
