/**
 * bench:ext-proc's fixtures: cheap fake model servers (only `/metrics` in vLLM's format and
 * `/v1/models`, so the EPP's data layer scrapes them and counts them ready; no inference traffic goes
 * to them, because the bench measures decisions, not replicas), run in a process of their own, and
 * one `kvgate epp` child process (its own process, so its CPU is separate from the load generator's
 * and can be read from /proc).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import { EXT_PROC_SERVICE } from "./protos.ts";

const KVGATE = fileURLToPath(new URL("../../../bin/kvgate", import.meta.url));

function metricsText(model: string): string {
  const l = `engine="0",model_name="${model}"`;
  return [
    "# TYPE vllm:num_requests_running gauge",
    `vllm:num_requests_running{${l}} 0.0`,
    "# TYPE vllm:num_requests_waiting gauge",
    `vllm:num_requests_waiting{${l}} 0.0`,
    "# TYPE vllm:kv_cache_usage_perc gauge",
    `vllm:kv_cache_usage_perc{${l}} 0.1`,
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="20000"} 1.0',
    "",
  ].join("\n");
}

export interface FakeFleet {
  endpoints: string[];
  close(): Promise<void>;
}

const COMPLETION = JSON.stringify({
  id: "chatcmpl-fake",
  object: "chat.completion",
  model: "m",
  choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 8192, completion_tokens: 1, total_tokens: 8193 },
});

/** `n` loopback servers answering `/metrics` and `/v1/models` for `model`, and (for the proxy
 *  demonstration only) `POST /v1/chat/completions` with a fixed reply after `holdMs`. */
export async function startFakeFleet(n: number, model: string, holdMs = 0): Promise<FakeFleet> {
  const metrics = metricsText(model);
  const models = JSON.stringify({ object: "list", data: [{ id: model, object: "model", owned_by: "vllm" }] });
  const servers: Server[] = [];
  for (let i = 0; i < n; i++) {
    const s = createServer((req, res) => {
      req.resume();
      if (req.url === "/metrics") res.writeHead(200, { "content-type": "text/plain" }).end(metrics);
      else if (req.url === "/v1/models")
        res.writeHead(200, { "content-type": "application/json" }).end(models);
      else if (req.method === "POST" && req.url === "/v1/chat/completions") {
        req.on("end", () =>
          setTimeout(
            () => res.writeHead(200, { "content-type": "application/json" }).end(COMPLETION),
            holdMs,
          ),
        );
      } else
        res.writeHead(404).end("the bench's fake endpoints serve /metrics, /v1/models and chat completions");
    });
    await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", () => resolve()));
    servers.push(s);
  }
  return {
    endpoints: servers.map((s) => `127.0.0.1:${(s.address() as AddressInfo).port}`),
    close: async () => {
      for (const s of servers) {
        s.closeAllConnections();
        await new Promise<void>((r) => s.close(() => r()));
      }
    },
  };
}

/** The fake endpoints in a child process of their own (fake-fleet-main.ts). */
export async function spawnFakeFleet(n: number, model: string, holdMs = 0): Promise<FakeFleet> {
  const main = fileURLToPath(new URL("./fake-fleet-main.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", main, String(n), model, String(holdMs)], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  const endpoints = await new Promise<string[]>((resolve, reject) => {
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      out += d;
      const line = out.split("\n").find((l) => l.startsWith("{"));
      if (line) resolve((JSON.parse(line) as { endpoints: string[] }).endpoints);
    });
    child.once("exit", (code) =>
      reject(new Error(`the fake endpoints exited (code ${code}) before starting`)),
    );
  });
  return {
    endpoints,
    close: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

export interface EppChild {
  child: ChildProcess;
  /** ext_proc `host:port` and whether it speaks TLS. */
  target: string;
  secure: boolean;
  metricsUrl: string;
  /** CPU seconds (user + system) the EPP has used so far, from /proc; null where unavailable. */
  cpuSeconds(): number | null;
  /** Resident memory in MiB, from /proc; null where unavailable. */
  rssMiB(): number | null;
  /** The EPP's own count of open ext_proc streams, from its /metrics; null when unreadable. */
  activeStreams(): Promise<number | null>;
  close(): Promise<void>;
}

function procStat(pid: number): { cpu: number; rss: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const ticks = Number(fields[11]) + Number(fields[12]); // utime, stime (fields 14, 15)
    const rssPages = Number(fields[21]); // field 24
    return { cpu: ticks / 100, rss: (rssPages * 4096) / 2 ** 20 };
  } catch {
    return null;
  }
}

/** Starts `kvgate epp` on free loopback ports and waits until its health service says SERVING. */
export async function spawnEpp(opts: {
  endpoints: string[];
  secure: boolean;
  args: string[];
}): Promise<EppChild> {
  const argv = [
    KVGATE,
    "epp",
    "--host",
    "127.0.0.1",
    "--grpc-port",
    "0",
    "--grpc-health-port",
    "0",
    "--metrics-port",
    "0",
    "--endpoints",
    opts.endpoints.join(","),
    "--secure-serving",
    String(opts.secure),
    ...opts.args,
  ];
  const child = spawn(process.execPath, argv, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d.slice(0, 10_000)));
  const banner = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`kvgate epp did not start in 60 s; stderr: ${err}`)),
      60_000,
    );
    const check = () => {
      const line = out.split("\n").find((l) => l.startsWith("kvgate epp: ext_proc on "));
      if (line) {
        clearTimeout(timer);
        resolve(line);
      }
    };
    child.stdout!.on("data", check);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`kvgate epp exited (code ${code}) before starting; stderr: ${err}`));
    });
  });
  const m = /ext_proc on (\S+) .*health on (\S+), metrics (\S+)\/metrics/.exec(banner);
  if (!m) throw new Error(`cannot read kvgate epp's startup line: ${banner}`);
  const [, target, health, metricsUrl] = m;
  await waitServing(health!, 60_000);
  return {
    child,
    target: target!,
    secure: opts.secure,
    metricsUrl: metricsUrl!,
    cpuSeconds: () => procStat(child.pid!)?.cpu ?? null,
    rssMiB: () => procStat(child.pid!)?.rss ?? null,
    activeStreams: async () => {
      try {
        const text = await (
          await fetch(`${metricsUrl}/metrics`, { signal: AbortSignal.timeout(2000) })
        ).text();
        const m = /^kvgate_ext_proc_active_streams(?:\{[^}]*\})? (\S+)$/m.exec(text);
        return m ? Number(m[1]) : null;
      } catch {
        return null;
      }
    },
    close: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    },
  };
}

type HealthClient = grpc.Client & {
  Check(req: { service: string }, cb: (e: Error | null, r?: { status: string | number }) => void): void;
};

/** Polls grpc.health.v1.Health/Check for the ext_proc service until SERVING. */
async function waitServing(address: string, timeoutMs: number): Promise<void> {
  const Health = grpc.makeGenericClientConstructor(healthService, "Health");
  const client = new Health(address, grpc.credentials.createInsecure()) as unknown as HealthClient;
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      const status = await new Promise<string | null>((resolve) =>
        client.Check({ service: EXT_PROC_SERVICE }, (e, r) => resolve(e ? null : String(r?.status))),
      );
      if (status === "SERVING" || status === "1") return;
      if (Date.now() > deadline) {
        throw new Error(
          `kvgate epp did not report SERVING within ${timeoutMs} ms (its endpoints are not ready)`,
        );
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    client.close();
  }
}
