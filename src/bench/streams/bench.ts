/**
 * bench:streams — thousands of concurrent streaming chat requests through one `kvgate serve` process.
 * A `kvgate sim-fleet` of simulated replicas runs slowed down (default --time-scale 0.05: the
 * replicas' engines step rarely, so their CPU leaves the gateway room on 2 cores, and every stream
 * stays open long enough for all of them to overlap); the gateway is a child process of its own,
 * whose resident memory is read from /proc and whose event-loop delay comes from its admin
 * /metrics (nodejs_eventloop_lag_p99_seconds, per scrape interval). Each client is a raw TCP
 * connection (stream-client.ts) that checks the status and the final `data: [DONE]`.
 *
 * Phase 1 holds --streams streams at once: no errors, the peak of streams open at the same time,
 * RSS (target < 1.5 GiB), event-loop delay. Phase 2 checks the limits: a second gateway with
 * --max-concurrent-requests L and --max-connections L + E/2 gets L long streams and then E more
 * requests, each of which must be a 503 in OpenAI's error format naming the flag to raise.
 *
 *   npm run bench:streams -- [--streams 10000] [--replicas 8] [--time-scale 0.05] [--max-tokens 64]
 *     [--ramp-per-s 1000] [--limit 500] [--extra 200] [--json results/bench-streams.json]
 *     [--http2 [--sessions 100]]
 *
 * --http2 sends phase 1's streams as HTTP/2 (h2c prior knowledge) over --sessions connections,
 * round-robin, so the gateway holds one socket per stream (the upstream; vLLM speaks HTTP/1.1) plus
 * the sessions. Phase 2 stays HTTP/1.1 (test/gateway-h2c.test.ts checks the limits over HTTP/2).
 *
 * Each stream needs two sockets in the gateway (client and upstream, HTTP/1.1 both ways), so a
 * process whose open-file limit is N holds at most about (N − 256)/2 streams (256 for the gateway's
 * own files: stdio, epoll, admin, scrape and event connections): the bench says so and lowers
 * --streams rather than measure EMFILE. Past that limit libuv accepts a new connection and closes it
 * at once (its EMFILE fallback), and since the client's request is unread the kernel answers RST.
 * That, not the listen queue (already 4096 then), fits the 988 of 9,968 streams reset at an
 * open-file limit of 20,000 with 64 files to spare; with 256 to spare, 9,872 ran with none reset.
 *
 * Clients connect at --ramp-per-s (default 1000/s, in batches of 100), as a real load test ramps,
 * rather than 10,000 SYNs at once; the gateway's and the replicas' accept queues are 8192 (kernel-
 * capped by net.core.somaxconn), which the bench reports with tcp_max_syn_backlog and the limit.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect as connectH2 } from "node:http2";
import os from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseBenchArgs } from "../cli-args.ts";
import { type StreamResult, streamRequest, streamRequestH2 } from "./stream-client.ts";

const USAGE = `usage: npm run bench:streams -- [--streams 10000] [--replicas 8] [--time-scale 0.05] [--max-tokens 64]
  [--ramp-per-s 1000] [--limit 500] [--extra 200] [--json results/bench-streams.json]
  [--http2 [--sessions 100]]`;

const KVGATE = fileURLToPath(new URL("../../../bin/kvgate", import.meta.url));

const { values: a } = parseBenchArgs("bench:streams", USAGE, {
  options: {
    streams: { type: "string", default: "10000" },
    replicas: { type: "string", default: "8" },
    "time-scale": { type: "string", default: "0.05" },
    "max-tokens": { type: "string", default: "64" },
    "ramp-per-s": { type: "string", default: "1000" },
    limit: { type: "string", default: "500" },
    extra: { type: "string", default: "200" },
    json: { type: "string", default: "results/bench-streams.json" },
    http2: { type: "boolean", default: false },
    sessions: { type: "string", default: "100" },
  },
});
const replicas = Number(a.replicas);
const maxTokens = Number(a["max-tokens"]);
const rampPerS = Number(a["ramp-per-s"]);
const limit = Number(a.limit);
const extra = Number(a.extra);

/** The soft open-file limit of processes started from here (children inherit it). */
function openFileLimit(): number {
  const m = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync("/proc/self/limits", "utf8"));
  return !m || m[1] === "unlimited" ? Number.POSITIVE_INFINITY : Number(m[1]);
}
const fdLimit = openFileLimit();
const FD_RESERVE = 256;
const http2 = a.http2 === true;
const sessions = Number(a.sessions);
if (http2 && !(Number.isInteger(sessions) && sessions >= 1))
  throw new Error(`--sessions must be a positive integer, got ${a.sessions}`);
// HTTP/2: the clients' streams share --sessions connections; each stream still has its own upstream.
const fdCap = http2 ? fdLimit - FD_RESERVE - sessions : Math.floor((fdLimit - FD_RESERVE) / 2);
let streams = Number(a.streams);
const requestedStreams = streams;
if (streams > fdCap) {
  console.error(
    `bench:streams: the open-file limit is ${fdLimit}; each stream needs ${http2 ? "an upstream socket" : "a client and an upstream socket"} in the ` +
      `gateway, so one process holds at most ${fdCap}: running ${fdCap} streams (raise \`ulimit -n\` for ${streams}${http2 ? "" : ", or use --http2"})`,
  );
  streams = fdCap;
}

interface Child {
  proc: ChildProcess;
  out: () => string;
  stop(): Promise<void>;
}

function start(
  args: string[],
  ready: RegExp,
  timeoutMs = 120_000,
): Promise<Child & { match: RegExpExecArray }> {
  const proc = spawn(process.execPath, [KVGATE, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const add = (d: string) => {
    if (out.length < 200_000) out += d;
  };
  proc.stdout!.setEncoding("utf8").on("data", add);
  proc.stderr!.setEncoding("utf8").on("data", add);
  const stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(t);
  };
  return new Promise((res, rej) => {
    const timer = setTimeout(
      () => rej(new Error(`kvgate ${args[0]} did not start in ${timeoutMs} ms:\n${out}`)),
      timeoutMs,
    );
    const check = () => {
      const m = ready.exec(out);
      if (m) {
        clearTimeout(timer);
        res({ proc, out: () => out, stop, match: m });
      }
    };
    proc.stdout!.on("data", check);
    proc.stderr!.on("data", check);
    proc.once("exit", (code) => rej(new Error(`kvgate ${args[0]} exited (code ${code}):\n${out}`)));
  });
}

function sysctl(name: string): number | null {
  try {
    return Number(readFileSync(`/proc/sys/${name}`, "utf8").trim());
  } catch {
    return null;
  }
}

function rssBytes(pid: number): { rss: number; hwm: number } {
  const s = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(s)?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
}

async function lagP99(adminUrl: string): Promise<{ p50: number; p99: number; max: number } | null> {
  try {
    const text = await (await fetch(`${adminUrl}/metrics`)).text();
    const v = (n: string) => Number(new RegExp(`^${n} (\\S+)`, "m").exec(text)?.[1] ?? Number.NaN);
    return {
      p50: v("nodejs_eventloop_lag_p50_seconds"),
      p99: v("nodejs_eventloop_lag_p99_seconds"),
      max: v("nodejs_eventloop_lag_max_seconds"),
    };
  } catch {
    return null;
  }
}

const body = (i: number) =>
  JSON.stringify({
    model: "sim-model",
    stream: true,
    max_tokens: maxTokens,
    ignore_eos: true,
    messages: [
      { role: "system", content: `You are assistant ${i % 16}. Answer in one short paragraph.` },
      { role: "user", content: `Question ${i}: what is the capital of country number ${i}?` },
    ],
  });

async function gateway(endpointsFile: string, flags: string[]) {
  const g = await start(
    [
      "serve",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--admin-port",
      "0",
      "--endpoints-file",
      endpointsFile,
      ...flags,
    ],
    /listening on http:\/\/127\.0\.0\.1:(\d+).*admin http:\/\/127\.0\.0\.1:(\d+)/,
  );
  return { ...g, port: Number(g.match[1]), adminUrl: `http://127.0.0.1:${g.match[2]}` };
}

async function waitReady(adminUrl: string, n: number): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const j = (await (await fetch(`${adminUrl}/endpoints`)).json()) as { ready: number };
    if (j.ready === n) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`the gateway did not see ${n} ready replicas in 60 s`);
}

const dir = mkdtempSync(join(os.tmpdir(), "kvgate-bench-streams-"));
const endpointsFile = join(dir, "fleet.yaml");
const perReplica = Math.ceil(streams / replicas) + 64;
const fleet = await start(
  [
    "sim-fleet",
    String(replicas),
    "--port",
    "0",
    "--no-kv-events",
    "--endpoints-file",
    endpointsFile,
    "--served-model-name",
    "sim-model",
    "--time-scale",
    String(a["time-scale"]),
    "--max-num-seqs",
    String(perReplica),
    "--max-num-batched-tokens",
    String(Math.max(8192, perReplica * 2)),
    "--num-gpu-blocks-override",
    String(perReplica * 8),
    "--max-model-len",
    "2048",
  ],
  /replica\(s\) ready/,
);
const results: Record<string, unknown> = {};
try {
  // Phase 1: every stream at once.
  const g = await gateway(endpointsFile, [
    "--max-concurrent-requests",
    String(streams + 100),
    "--max-connections",
    String(streams + 100),
  ]);
  try {
    await waitReady(g.adminUrl, replicas);
    const load0 = os.loadavg();
    const cpu0 = process.cpuUsage();
    let open = 0;
    let peak = 0;
    let rssMax = 0;
    const lags: number[] = [];
    const lags50: number[] = [];
    let lagMax = 0;
    const sampler = setInterval(async () => {
      rssMax = Math.max(rssMax, rssBytes(g.proc.pid!).rss);
      const l = await lagP99(g.adminUrl);
      if (l && Number.isFinite(l.p99)) {
        lags.push(l.p99);
        if (Number.isFinite(l.p50)) lags50.push(l.p50);
        lagMax = Math.max(lagMax, l.max);
      }
    }, 1000);
    const t0 = performance.now();
    const pending: Promise<StreamResult>[] = [];
    const h2 = http2 ? Array.from({ length: sessions }, () => connectH2(`http://127.0.0.1:${g.port}`)) : [];
    for (const s of h2) s.on("error", () => {}); // each stream reports its own failure
    for (let i = 0; i < streams; i++) {
      const hooks = {
        onHead: (status: number) => {
          if (status === 200) peak = Math.max(peak, ++open);
        },
      };
      pending.push(
        (http2
          ? streamRequestH2(h2[i % sessions]!, "/v1/chat/completions", body(i), hooks)
          : streamRequest(g.port, "/v1/chat/completions", body(i), hooks)
        ).then((r) => {
          if (r.status === 200) open--;
          return r;
        }),
      );
      if (i % 100 === 99) await new Promise((r) => setTimeout(r, (100 / rampPerS) * 1000));
    }
    const rs = await Promise.all(pending);
    const wall = (performance.now() - t0) / 1000;
    for (const s of h2) s.close();
    clearInterval(sampler);
    const hwm = rssBytes(g.proc.pid!).hwm;
    const bad = rs.filter((r) => r.status !== 200 || !r.done || r.events === 0 || r.error !== null);
    const ttfb = rs
      .filter((r) => r.status === 200)
      .map((r) => r.firstByteAt - r.startedAt)
      .sort((x, y) => x - y);
    lags.sort((x, y) => x - y);
    lags50.sort((x, y) => x - y);
    const kinds: Record<string, number> = {};
    for (const r of bad) {
      const k =
        r.status === 0
          ? `connection: ${r.error ?? "closed"}`
          : r.status !== 200
            ? `HTTP ${r.status}`
            : r.error
              ? `mid-stream: ${r.error}`
              : "no [DONE]";
      kinds[k] = (kinds[k] ?? 0) + 1;
    }
    const cpu = process.cpuUsage(cpu0);
    results.streams = {
      requested: requestedStreams,
      streams,
      protocol: http2 ? "h2c" : "http/1.1",
      clientConnections: http2 ? sessions : streams,
      openFileLimit: fdLimit,
      somaxconn: sysctl("net/core/somaxconn"),
      tcpMaxSynBacklog: sysctl("net/ipv4/tcp_max_syn_backlog"),
      rampPerSecond: rampPerS,
      opened: rs.filter((r) => r.status === 200).length,
      completed: rs.filter((r) => r.status === 200 && r.done).length,
      ok: rs.length - bad.length,
      errors: bad.length,
      errorsByKind: kinds,
      errorSamples: bad.slice(0, 5).map((r) => ({
        status: r.status,
        error: r.error,
        done: r.done,
        afterMs: Math.round(r.endedAt - r.startedAt),
        body: r.errorBody.slice(0, 300),
      })),
      peakConcurrentStreams: peak,
      wallSeconds: wall,
      gatewayRssMaxBytes: rssMax,
      gatewayRssHighWaterBytes: hwm,
      eventLoopDelayP50Seconds: {
        median: lags50[Math.floor(lags50.length / 2)] ?? null,
        max: lags50.at(-1) ?? null,
      },
      eventLoopDelayP99Seconds: {
        median: lags[Math.floor(lags.length / 2)] ?? null,
        max: lags.at(-1) ?? null,
      },
      eventLoopDelayMaxSeconds: lagMax,
      firstByteMsOfOk: {
        p50: ttfb[Math.floor(ttfb.length * 0.5)],
        p99: ttfb[Math.floor(ttfb.length * 0.99)],
      },
      loadAverage: { start: load0, end: os.loadavg() },
      loadGeneratorCpuSeconds: (cpu.user + cpu.system) / 1e6,
      gatewayLogTail: g.out().split("\n").slice(-8),
    };
    console.log(JSON.stringify(results.streams, null, 2));
  } finally {
    await g.stop();
  }

  // Phase 2: the limits answer 503 cleanly. One gateway whose stream limit is reached first (plenty
  // of connections), one whose connection limit is (plenty of streams): L long streams held, then E more.
  results.limits = [];
  for (const [which, streamsLimit, connLimit] of [
    ["streamLimit", limit, limit * 4],
    ["connectionLimit", limit * 4, limit],
  ] as const) {
    const g2 = await gateway(endpointsFile, [
      "--max-concurrent-requests",
      String(streamsLimit),
      "--max-connections",
      String(connLimit),
    ]);
    try {
      await waitReady(g2.adminUrl, replicas);
      let heads = 0;
      const held = Array.from({ length: limit }, (_, i) =>
        streamRequest(g2.port, "/v1/chat/completions", body(i), { onHead: () => heads++ }).then((r) => {
          heads--;
          return r;
        }),
      );
      const deadline = Date.now() + 120_000;
      while (heads < limit && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      const stillOpen = heads;
      const over = await Promise.all(
        Array.from({ length: extra }, (_, i) =>
          streamRequest(g2.port, "/v1/chat/completions", body(limit + i)),
        ),
      );
      const heldRs = await Promise.all(held);
      const kinds = { streamLimit: 0, connectionLimit: 0, other: 0 };
      for (const r of over) {
        let msg = "";
        try {
          const j = JSON.parse(r.errorBody) as { error: { code: number; message: string } };
          if (j.error.code === 503) msg = j.error.message;
        } catch {}
        if (r.status === 503 && /--max-concurrent-requests/.test(msg)) kinds.streamLimit++;
        else if (r.status === 503 && /--max-connections/.test(msg)) kinds.connectionLimit++;
        else kinds.other++;
      }
      const row = {
        limitReached: which,
        maxConcurrentRequests: streamsLimit,
        maxConnections: connLimit,
        heldStreams: limit,
        heldOpenWhenExtrasSent: stillOpen,
        heldOk: heldRs.filter((r) => r.status === 200 && r.done).length,
        extraRequests: extra,
        answered503: kinds,
      };
      (results.limits as unknown[]).push(row);
      console.log(JSON.stringify(row));
    } finally {
      await g2.stop();
    }
  }
} finally {
  await fleet.stop();
  rmSync(dir, { recursive: true, force: true });
}
const out = resolve(a.json);
mkdirSync(dirname(out), { recursive: true });
writeFileSync(
  out,
  `${JSON.stringify({ bench: "streams", date: new Date().toISOString(), cpus: os.cpus().length, ...results }, null, 2)}\n`,
);
console.log(`bench:streams: wrote ${a.json}`);
if (
  existsSync(out) &&
  ((results.streams as { errors: number }).errors > 0 ||
    (results.limits as Array<{ limitReached: string; answered503: Record<string, number> }>).some(
      (l) => l.answered503[l.limitReached] !== extra,
    ))
)
  process.exitCode = 1;
