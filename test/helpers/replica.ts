/**
 * Shared test helpers for the simulated vLLM replica: start one in-process on an ephemeral loopback
 * port, or spawn `bin/kvgate sim-replica` as a child process; plus small HTTP/SSE/metrics helpers.
 * Gateway and benchmark tests reuse these. Every helper bounds its waits so tests cannot hang.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { type PromFamilies, parsePromText } from "../../src/datalayer/prom-text.ts";
import type { ReplicaSettings } from "../../src/sim/replica-options.ts";
import { ReplicaServer } from "../../src/sim/replica-server.ts";

/** A JSON value under test: tests index into response bodies freely and let assertions do the checking. */
// biome-ignore lint/suspicious/noExplicitAny: response bodies are checked by assertions, not types
export type Json = any;

export const KVGATE_BIN = fileURLToPath(new URL("../../bin/kvgate", import.meta.url));

/** Test defaults: loopback, ephemeral port, 100× time scale, a small KV pool, logs kept quiet. */
export const TEST_REPLICA_DEFAULTS: ReplicaSettings = {
  host: "127.0.0.1",
  port: 0,
  timeScale: 100,
  numGpuBlocksOverride: 2048,
  maxModelLen: 8192,
  seed: 1,
};

export interface TestReplica {
  server: ReplicaServer;
  /** e.g. http://127.0.0.1:41234 */
  url: string;
  port: number;
  /** Lines the replica logged (instead of stderr). */
  logs: string[];
  close(): Promise<void>;
}

/** Requests the replica's engine finished successfully so far. */
export const requestsServed = (r: TestReplica): number =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);

/** Requests served by a group of replicas (a pool). */
export const poolServed = (rs: readonly TestReplica[]): number =>
  rs.reduce((a, r) => a + requestsServed(r), 0);

/** A replica's endpoint id, host:port. */
export const replicaId = (r: { port: number }): string => `127.0.0.1:${r.port}`;

/** The multi-pool tests' InferenceModelRewrite: model `chat` split 70/30 between `alpha` and `beta`. */
export const SPLIT_CHAT_REWRITES = `
- apiVersion: llm-d.ai/v1alpha2
  kind: InferenceModelRewrite
  metadata: { name: split-chat }
  spec:
    rules:
      - matches: [{ model: { value: chat } }]
        targets:
          - { modelRewrite: alpha, weight: 70 }
          - { modelRewrite: beta, weight: 30 }
`;

/**
 * Starts a replica in this process. Override anything in `settings`; defaults are
 * TEST_REPLICA_DEFAULTS. Always `await replica.close()` (e.g. in `after` / `t.after`).
 *
 * @example
 *   const r = await startTestReplica({ timeScale: 200, servedModelName: "m" });
 *   t.after(() => r.close());
 *   const res = await postJson(`${r.url}/v1/completions`, { prompt: "hi", max_tokens: 4 });
 */
export async function startTestReplica(settings: ReplicaSettings = {}): Promise<TestReplica> {
  const logs: string[] = [];
  const server = await ReplicaServer.start({
    ...TEST_REPLICA_DEFAULTS,
    log: (line) => logs.push(line),
    ...settings,
  });
  return { server, url: server.url, port: server.port, logs, close: () => server.close() };
}

export interface SpawnedReplica {
  child: ChildProcess;
  url: string;
  port: number;
  /** The startup line. */
  banner: string;
  stdout: () => string;
  stderr: () => string;
  /** Resolves when the process exits. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status. */
  close(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Spawns `bin/kvgate sim-replica --host 127.0.0.1 --port 0 --time-scale 100 <args>` and waits for its
 * startup line. Later flags win, so `args` may override the defaults.
 */
export async function spawnReplica(
  args: string[] = [],
  opts: { env?: NodeJS.ProcessEnv; startTimeoutMs?: number } = {},
): Promise<SpawnedReplica> {
  const child = spawn(
    process.execPath,
    [KVGATE_BIN, "sim-replica", "--host", "127.0.0.1", "--port", "0", "--time-scale", "100", ...args],
    { env: { ...process.env, ...opts.env }, stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const banner = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`replica did not start in time; stderr: ${err}`));
    }, opts.startTimeoutMs ?? 20_000);
    const check = () => {
      const line = out.split("\n").find((l) => l.includes(" listening on "));
      if (line) {
        clearTimeout(timer);
        child.stdout!.off("data", check);
        resolve(line);
      }
    };
    child.stdout!.on("data", check);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`replica exited before starting (code ${code}, signal ${signal}); stderr: ${err}`));
    });
  });
  const url = /listening on (http:\/\/\S+)/.exec(banner)![1]!;
  const close = async (graceMs = 5000) => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), graceMs);
      const status = await exited;
      clearTimeout(t);
      return status;
    }
    return exited;
  };
  return {
    child,
    url,
    port: Number(new URL(url).port),
    banner,
    stdout: () => out,
    stderr: () => err,
    exited,
    close,
  };
}

/** Runs `bin/kvgate <args>` to completion (killed after `timeoutMs`). */
export function runKvgate(
  args: string[],
  opts: { timeoutMs?: number; cwd?: string } = {},
): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [KVGATE_BIN, ...args], {
      cwd: opts.cwd,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 20_000);
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** POSTs JSON (or a raw string body) and returns the status and parsed JSON (or text if not JSON). */
export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: Json; headers: Headers; text: string }> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {}
  return { status: res.status, body: parsed, headers: res.headers, text };
}

/** Splits an SSE body into its `data:` payloads: parsed JSON objects, and the string "[DONE]". */
export function parseSse(text: string): Json[] {
  const events: Json[] = [];
  for (const block of text.split("\n\n")) {
    if (!block.trim()) continue;
    const data = block
      .split("\n")
      .filter((l) => l.startsWith("data: "))
      .map((l) => l.slice(6))
      .join("\n");
    events.push(data === "[DONE]" ? data : JSON.parse(data));
  }
  return events;
}

/** Fetches and parses /metrics (strict parser: a malformed exposition fails the test). */
export async function scrapeMetrics(baseUrl: string): Promise<PromFamilies> {
  const res = await fetch(`${baseUrl}/metrics`, { signal: AbortSignal.timeout(10_000) });
  return parsePromText(await res.text()).families;
}

/** Polls `check` every `intervalMs` until it returns true or `timeoutMs` passes (then throws). */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  timeoutMs = 10_000,
  intervalMs = 10,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
