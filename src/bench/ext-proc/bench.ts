/**
 * bench:ext-proc — decisions per second and decision latency of one `kvgate epp` process, driven the
 * way Envoy drives an endpoint picker: N concurrent ext_proc streams (FULL_DUPLEX_STREAMED, TLS as
 * the EPP serves by default), each sending request headers and an ~8k-token chat body (~40 KB of
 * JSON, one 62,000-byte chunk at most per message) and waiting for the header reply that carries the
 * pick, then finishing the body and response phases as Envoy would (bench-load.ts). Latency is from
 * the request's end-of-stream to the header reply, measured in the load generator.
 *
 * The EPP runs as a child process (its CPU is read from /proc, apart from the load generator's) in
 * front of cheap fake endpoints that only answer /metrics and /v1/models (bench-fleet.ts): the bench
 * measures decisions, not replicas. Load generator and EPP share the machine's cores.
 *
 * Targets (from the issue): ≥ 3,000 decisions/s with p99 < 5 ms at 1,024 streams, and 10,000
 * concurrent streams held with no errors. Anchors: one llm-d EPP ≈ 324–388 req/s; Envoy's ext_proc
 * cluster overflows at its default 1,024 concurrent streams (its circuit breaker, which the test
 * proxy's maxStreams reproduces). The levels talk to the EPP directly; after them, --proxy-demo
 * simultaneous requests go through the Envoy-like proxy with its stream cap at Envoy's 1,024 and at
 * the 40,000 llm-d's reference Envoy sets, and the table shows how many overflowed (FailClose 500).
 *
 *   npm run bench:ext-proc -- [--levels 1,64,1024,10000] [--duration 10] [--warmup 3] [--endpoints 8]
 *     [--streams-per-connection 256] [--body-bytes 40000] [--chunk-bytes 62000] [--plaintext]
 *     [--request-timeout 600] [--proxy-demo 2048] [--proxy-hold-ms 3000]
 *     [--json results/bench-ext-proc.json] [-- <extra kvgate epp flags>]
 */
import { mkdirSync, writeFileSync } from "node:fs";
import os from "node:os";
import { dirname, resolve } from "node:path";
import { parseBenchArgs } from "../cli-args.ts";
import { table } from "../format.ts";
import { chatBodies, encodeBodies } from "./bench-bodies.ts";
import { spawnEpp, spawnFakeFleet } from "./bench-fleet.ts";
import { type LevelResult, runLevel } from "./bench-load.ts";
import { type CapResult, proxyCapDemo } from "./bench-proxy-cap.ts";

const USAGE = `usage: npm run bench:ext-proc -- [--levels 1,64,1024,10000] [--duration 10] [--warmup 3] [--endpoints 8]
  [--streams-per-connection 256] [--body-bytes 40000] [--chunk-bytes 62000] [--groups 16] [--plaintext]
  [--request-timeout 600] [--proxy-demo 2048] [--proxy-hold-ms 3000]
  [--json results/bench-ext-proc.json] [-- <extra kvgate epp flags>]`;

const TARGET_RATE = 3000;
const TARGET_P99_MS = 5;

const { values: args, positionals } = parseBenchArgs("bench:ext-proc", USAGE, {
  allowPositionals: true,
  options: {
    levels: { type: "string", default: "1,64,1024,10000" },
    duration: { type: "string", default: "10" },
    warmup: { type: "string", default: "3" },
    endpoints: { type: "string", default: "8" },
    "streams-per-connection": { type: "string", default: "256" },
    "body-bytes": { type: "string", default: "40000" },
    "chunk-bytes": { type: "string", default: "62000" },
    groups: { type: "string", default: "16" },
    "request-timeout": { type: "string", default: "600" },
    "proxy-demo": { type: "string", default: "2048" },
    "proxy-hold-ms": { type: "string", default: "3000" },
    plaintext: { type: "boolean", default: false },
    json: { type: "string", default: "results/bench-ext-proc.json" },
  },
});

function num(name: string, v: string | undefined): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${name} must be a non-negative number, got ${v}`);
  return n;
}

const f = (n: number, d = 1) => (Number.isFinite(n) ? n.toFixed(d) : "-");

async function main() {
  const started = new Date().toISOString();
  const loadStart = os.loadavg();
  const levels = args.levels!.split(",").map((l) => num("levels", l));
  const fleet = await spawnFakeFleet(
    num("endpoints", args.endpoints),
    "m",
    num("proxy-hold-ms", args["proxy-hold-ms"]),
  );
  const bodies = chatBodies(512, num("groups", args.groups), num("body-bytes", args["body-bytes"]));
  const avgBody = bodies.reduce((a, b) => a + b.length, 0) / bodies.length;
  const chunkBytes = num("chunk-bytes", args["chunk-bytes"]);
  const encoded = encodeBodies(bodies, chunkBytes);
  const epp = await spawnEpp({ endpoints: fleet.endpoints, secure: !args.plaintext, args: positionals });
  console.log(
    `kvgate epp (pid ${epp.child.pid}) on ${epp.target} (${epp.secure ? "TLS" : "plaintext"}), ` +
      `${fleet.endpoints.length} fake endpoints; bodies ${f(avgBody / 1000)} KB in ≤${args["chunk-bytes"]}-byte chunks; ` +
      `${os.cpus().length} CPUs shared by the EPP and this load generator, load average ${loadStart.map((l) => f(l, 2)).join(" ")}`,
  );
  type Row = LevelResult & {
    eppCpuPercent: number | null;
    eppCpuMsPerDecision: number | null;
    eppRssMiB: number | null;
    /** Most streams the EPP itself reported open (kvgate_ext_proc_active_streams), sampled. */
    eppMaxActiveStreams: number | null;
  };
  const results: Row[] = [];
  let capResults: CapResult[] = [];
  try {
    for (const concurrency of levels) {
      const cpu0 = epp.cpuSeconds();
      const t0 = performance.now();
      let eppMax: number | null = null;
      const sampler = setInterval(() => {
        void epp.activeStreams().then((n) => {
          if (n !== null) eppMax = Math.max(eppMax ?? 0, n);
        });
      }, 250);
      const r = await runLevel({
        target: epp.target,
        secure: epp.secure,
        concurrency,
        durationMs: num("duration", args.duration) * 1000,
        warmupMs: num("warmup", args.warmup) * 1000,
        streamsPerConnection: num("streams-per-connection", args["streams-per-connection"]),
        encoded,
        requestTimeoutMs: num("request-timeout", args["request-timeout"]) * 1000,
      });
      clearInterval(sampler);
      const cpu1 = epp.cpuSeconds();
      const wall = (performance.now() - t0) / 1000;
      const used = cpu0 !== null && cpu1 !== null ? cpu1 - cpu0 : null;
      results.push({
        ...r,
        eppCpuPercent: used === null ? null : (used / wall) * 100,
        eppCpuMsPerDecision: used === null || r.allDecisions === 0 ? null : (used * 1000) / r.allDecisions,
        eppRssMiB: epp.rssMiB(),
        eppMaxActiveStreams: eppMax,
      });
      console.log(
        `  ${concurrency} streams: ${f(r.decisionsPerSec, 0)} decisions/s, p50 ${f(r.latencyMs.p50, 2)} ms, ` +
          `p99 ${f(r.latencyMs.p99, 2)} ms, ${r.errorCount} errors${r.errorCount ? ` ${JSON.stringify(r.errors)}` : ""}`,
      );
    }
    const demo = num("proxy-demo", args["proxy-demo"]);
    if (demo > 0) {
      console.log(
        `  ${demo} simultaneous requests through the Envoy-like proxy at stream caps 1,024 and 40,000 ...`,
      );
      capResults = await proxyCapDemo({
        target: epp.target,
        secure: epp.secure,
        requests: demo,
        caps: [1024, 40_000],
        body: bodies[0]!,
      });
    }
  } finally {
    await epp.close();
    await fleet.close();
  }

  console.log(
    `\n${table(
      [
        "streams",
        "conns",
        "ramp s",
        "decisions/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "errors",
        "max open",
        "EPP max active",
        "EPP CPU %",
        "EPP CPU ms/decision",
        "EPP RSS MiB",
        "load gen CPU %",
      ],
      results.map((r) => [
        String(r.concurrency),
        String(r.connections),
        f(r.rampS, 1),
        f(r.decisionsPerSec, 0),
        f(r.latencyMs.p50, 2),
        f(r.latencyMs.p90, 2),
        f(r.latencyMs.p99, 2),
        f(r.latencyMs.max, 1),
        String(r.errorCount),
        String(r.maxOpenStreams),
        r.eppMaxActiveStreams === null ? "-" : String(r.eppMaxActiveStreams),
        r.eppCpuPercent === null ? "-" : f(r.eppCpuPercent, 0),
        r.eppCpuMsPerDecision === null ? "-" : f(r.eppCpuMsPerDecision, 2),
        r.eppRssMiB === null ? "-" : f(r.eppRssMiB, 0),
        f(r.loadGenCpuPercent, 0),
      ]),
    )}`,
  );
  if (capResults.length) {
    console.log(
      `\nEnvoy's ext_proc stream cap (the cluster circuit breaker), through the Envoy-like proxy:\n${table(
        ["stream cap", "requests", "served", "overflowed (500)", "other"],
        capResults.map((c) => [
          String(c.cap),
          String(c.requests),
          String(c.served),
          String(c.overflowed),
          Object.keys(c.other).length ? JSON.stringify(c.other) : "-",
        ]),
      )}`,
    );
  }
  const at1024 = results.find((r) => r.concurrency === 1024);
  const at10k = results.find((r) => r.concurrency === 10_000);
  const verdicts = {
    rateAndP99At1024:
      at1024 === undefined
        ? null
        : at1024.decisionsPerSec >= TARGET_RATE &&
          at1024.latencyMs.p99 < TARGET_P99_MS &&
          at1024.errorCount === 0,
    held10000:
      at10k === undefined
        ? null
        : at10k.errorCount === 0 && at10k.maxOpenStreams >= 10_000 && at10k.completed > 0,
  };
  if (at1024) {
    console.log(
      `target ≥ ${TARGET_RATE} decisions/s with p99 < ${TARGET_P99_MS} ms at 1,024 streams: ` +
        `${f(at1024.decisionsPerSec, 0)}/s, p99 ${f(at1024.latencyMs.p99, 2)} ms → ${verdicts.rateAndP99At1024 ? "PASS" : "FAIL"}`,
    );
  }
  if (at10k) {
    console.log(
      `target 10,000 concurrent streams held with no errors: ${at10k.maxOpenStreams} open at most ` +
        `(the EPP counted ${at10k.eppMaxActiveStreams ?? "?"}), ` +
        `${at10k.errorCount} errors → ${verdicts.held10000 ? "PASS" : "FAIL"}`,
    );
  }
  const cpus = os.cpus();
  const out = {
    benchmark: "ext-proc",
    started,
    finished: new Date().toISOString(),
    machine: {
      cpuModel: cpus[0]?.model ?? "unknown",
      cpus: cpus.length,
      totalMemBytes: os.totalmem(),
      platform: os.platform(),
      kernel: os.release(),
      loadavgStart: loadStart,
      loadavgEnd: os.loadavg(),
      note: "the EPP (a child process) and the load generator share these CPUs",
    },
    node: { version: process.version },
    params: {
      levels,
      durationS: num("duration", args.duration),
      warmupS: num("warmup", args.warmup),
      endpoints: fleet.endpoints.length,
      streamsPerConnection: num("streams-per-connection", args["streams-per-connection"]),
      avgBodyBytes: Math.round(avgBody),
      chunkBytes: num("chunk-bytes", args["chunk-bytes"]),
      tls: epp.secure,
      eppArgs: positionals,
    },
    targets: { decisionsPerSecAt1024: TARGET_RATE, p99MsAt1024: TARGET_P99_MS, held: 10_000 },
    verdicts,
    levels: results,
    proxyCap: capResults,
  };
  const path = resolve(args.json!);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(out, null, 2)}\n`);
  console.log(`\nwrote ${path}`);
}

main().catch((err) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
