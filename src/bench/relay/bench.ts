/**
 * bench:relay — the CPU one `kvgate serve` process spends per request and per relayed SSE event,
 * read from /proc (CPU time, not wall time, so a shared machine inflates neither), for the demo's
 * shape: the tutorial's ~7,000-token completion prompts, streamed answers with usage, scraped at the
 * demo's 100 ms. The upstreams are near-free stand-ins for vLLM (upstream.ts) that emit one token
 * per stream per --step-ms, one event per socket write as a replica does.
 *
 * Per round and gateway: an idle spell (scrapes only: CPU per wall second), --requests one-token
 * requests --concurrency at a time (CPU per request, idle share removed), then --streams streams of
 * --tokens tokens at once (CPU per relayed event: idle share and the streams' per-request share
 * removed, divided by the events the upstreams wrote). Every response is checked for status 200 and
 * a final `data: [DONE]`.
 *
 * --baseline REV runs the gateway of that git revision as well (extracted with `git archive`,
 * sharing this tree's node_modules), alternating with this tree's round by round, so both are
 * measured side by side under the same load; the summary gives each one's medians and their ratio.
 *
 *   npm run bench:relay -- [--baseline REV] [--rounds 5] [--upstreams 4] [--streams 150]
 *     [--tokens 300] [--step-ms 20] [--requests 300] [--concurrency 50] [--idle-s 2]
 *     [--cpu-prof DIR] [--json results/bench-relay.json]
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Agent, request } from "undici";
import { type Child, cpuSecondsOf, spawnKvgate, stopAll } from "../../sim/launcher.ts";
import { parseBenchArgs } from "../cli-args.ts";
import { generateWorkload, resolveWorkloadSpec } from "../workloads/spec.ts";

const USAGE = `usage: npm run bench:relay -- [--baseline REV] [--rounds 5] [--upstreams 4] [--streams 150]
  [--tokens 300] [--step-ms 20] [--requests 300] [--concurrency 50] [--idle-s 2]
  [--cpu-prof DIR] [--json results/bench-relay.json]`;

const REPO = fileURLToPath(new URL("../../../", import.meta.url));
const UPSTREAM = fileURLToPath(new URL("./upstream.ts", import.meta.url));

const { values: a } = parseBenchArgs("bench:relay", USAGE, {
  options: {
    baseline: { type: "string" },
    rounds: { type: "string", default: "5" },
    upstreams: { type: "string", default: "4" },
    streams: { type: "string", default: "150" },
    tokens: { type: "string", default: "300" },
    "step-ms": { type: "string", default: "20" },
    requests: { type: "string", default: "300" },
    concurrency: { type: "string", default: "50" },
    "idle-s": { type: "string", default: "2" },
    "cpu-prof": { type: "string" },
    json: { type: "string", default: "results/bench-relay.json" },
  },
});
const n = (k: keyof typeof a) => {
  const v = Number(a[k]);
  if (!(v > 0)) throw new Error(`bench:relay: --${k} must be a positive number (got ${a[k]}); fix the flag`);
  return v;
};
const rounds = n("rounds");
const upstreams = n("upstreams");
const streams = n("streams");
const tokens = n("tokens");
const stepMs = n("step-ms");
const requests = n("requests");
const concurrency = n("concurrency");
const idleS = n("idle-s");

// The demo's prompts: the tutorial preset's 6,000-token system prompts plus 1,000-token questions.
const workload = generateWorkload(
  resolveWorkloadSpec({ preset: "tutorial", seed: 42, numRequests: 750, options: { outputLen: 1 } }),
);
const prompts = workload.requests.map((r) => r.prompt ?? "");

interface Variant {
  name: string;
  bin?: string;
}

/** `rev`'s tree in a temporary directory, using this tree's node_modules. */
function extract(rev: string): { dir: string; bin: string } {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-relay-baseline-"));
  const tar = execFileSync("git", ["-C", REPO, "archive", "--format=tar", rev, "bin", "src", "config"], {
    maxBuffer: 1 << 30,
  });
  execFileSync("tar", ["-x", "-C", dir], { input: tar });
  for (const f of ["package.json", "tsconfig.json"])
    writeFileSync(join(dir, f), execFileSync("git", ["-C", REPO, "show", `${rev}:${f}`]));
  symlinkSync(realpathSync(join(REPO, "node_modules")), join(dir, "node_modules"));
  return { dir, bin: join(dir, "bin", "kvgate") };
}

function startUpstream(): Promise<{ proc: ChildProcess; url: string }> {
  const proc = spawn(process.execPath, ["--import", "tsx", UPSTREAM, "--step-ms", String(stepMs)], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((res, rej) => {
    let out = "";
    proc.stdout!.setEncoding("utf8").on("data", (d: string) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) res({ proc, url: m[1] });
    });
    proc.once("exit", (code) => rej(new Error(`the relay upstream exited (code ${code}) before starting`)));
  });
}

const dispatcher = new Agent({ connections: null, pipelining: 1, keepAliveTimeout: 60_000 });

/** Body reads by the client: about one per gateway socket write, the unit the kernel charges for. */
let clientReads = 0;

/** One streamed completion; throws unless it is a 200 ending in `data: [DONE]`. */
async function complete(base: string, prompt: string, maxTokens: number): Promise<void> {
  const res = await request(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "relay-bench",
      prompt,
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
      ignore_eos: true,
    }),
    dispatcher,
  });
  let tail = "";
  for await (const c of res.body) {
    clientReads++;
    tail = (tail + (c as Buffer).toString("latin1")).slice(-64);
  }
  if (res.statusCode !== 200 || !tail.endsWith("data: [DONE]\n\n"))
    throw new Error(`bench:relay: HTTP ${res.statusCode}, stream ended with ${JSON.stringify(tail)}`);
}

async function pool(count: number, width: number, maxTokens: number, base: string): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, count) }, async () => {
      while (next < count) {
        const i = next++;
        await complete(base, prompts[i % prompts.length]!, maxTokens);
      }
    }),
  );
}

async function eventsWritten(urls: string[]): Promise<number> {
  let total = 0;
  for (const u of urls) {
    const text = await (await fetch(`${u}/metrics`)).text();
    total += Number(/^relay_bench_events_written_total (\d+)/m.exec(text)?.[1] ?? Number.NaN);
  }
  return total;
}

async function ready(url: string): Promise<void> {
  for (let i = 0; i < 600; i++) {
    try {
      const body = (await (await fetch(`${url}/v1/models`)).json()) as { data?: unknown[] };
      if (Array.isArray(body.data) && body.data.length > 0) return;
    } catch {
      /* not up yet */
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`bench:relay: the gateway at ${url} admitted no upstream in 60 s; see its stderr`);
}

interface Measure {
  variant: string;
  round: number;
  idle_cpu_ms_per_s: number;
  cpu_us_per_request: number;
  cpu_us_per_event: number;
  events: number;
  /** Relayed events per client read: above 1 when the gateway fell behind and wrote several at once. */
  events_per_read: number;
  streams_cpu_s: number;
  streams_wall_s: number;
}

async function measure(v: Variant, round: number, ups: string[]): Promise<Measure> {
  const nodeArgs = a["cpu-prof"]
    ? ["--cpu-prof", `--cpu-prof-dir=${resolve(a["cpu-prof"], `${v.name.replace(/\W+/g, "-")}-${round}`)}`]
    : [];
  const gw: Child = await spawnKvgate(
    `${v.name} gateway`,
    [
      "serve",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--admin-port",
      "0",
      "--scrape-interval-ms",
      "100",
      "--drain-timeout-ms",
      "1000",
      "--endpoints",
      ups.map((u) => new URL(u).host).join(","),
    ],
    { bin: v.bin, nodeArgs },
  );
  try {
    await ready(gw.url);
    const cpu = () => cpuSecondsOf(gw.proc.pid) ?? Number.NaN;
    await pool(Math.min(100, requests), concurrency, 1, gw.url); // warm-up: JIT, connections
    await new Promise((r) => setTimeout(r, 1000)); // let the warm-up's GC and compiles settle
    let c0 = cpu();
    let w0 = performance.now();
    await new Promise((r) => setTimeout(r, idleS * 1000));
    const idlePerS = (cpu() - c0) / ((performance.now() - w0) / 1000);

    c0 = cpu();
    w0 = performance.now();
    await pool(requests, concurrency, 1, gw.url);
    const perRequest = (cpu() - c0 - idlePerS * ((performance.now() - w0) / 1000)) / requests;

    const e0 = await eventsWritten(ups);
    const r0 = clientReads;
    c0 = cpu();
    w0 = performance.now();
    await pool(streams, streams, tokens, gw.url);
    const cpuS = cpu() - c0;
    const wallS = (performance.now() - w0) / 1000;
    const reads = clientReads - r0;
    const events = (await eventsWritten(ups)) - e0;
    const perEvent = (cpuS - idlePerS * wallS - streams * perRequest) / events;
    return {
      variant: v.name,
      round,
      idle_cpu_ms_per_s: idlePerS * 1e3,
      cpu_us_per_request: perRequest * 1e6,
      cpu_us_per_event: perEvent * 1e6,
      events,
      events_per_read: events / reads,
      streams_cpu_s: cpuS,
      streams_wall_s: wallS,
    };
  } finally {
    await stopAll([gw], 20_000); // time to write a --cpu-prof profile on the way out
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

async function main(): Promise<void> {
  const variants: Variant[] = [{ name: "this tree" }];
  let baselineDir: string | null = null;
  if (a.baseline) {
    const b = extract(a.baseline);
    baselineDir = b.dir;
    variants.unshift({ name: `baseline ${a.baseline}`, bin: b.bin });
  }
  const ups = await Promise.all(Array.from({ length: upstreams }, startUpstream));
  const load0 = loadavg()[0];
  const results: Measure[] = [];
  try {
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? variants : [...variants].reverse();
      for (const v of order) {
        const m = await measure(
          v,
          r,
          ups.map((u) => u.url),
        );
        results.push(m);
        console.log(
          `round ${r + 1}/${rounds} ${v.name}: ${m.cpu_us_per_request.toFixed(0)} µs CPU/request, ` +
            `${m.cpu_us_per_event.toFixed(2)} µs CPU/event (${m.events} events, ${m.events_per_read.toFixed(2)} per client read, ${m.streams_cpu_s.toFixed(2)} s CPU ` +
            `in ${m.streams_wall_s.toFixed(1)} s wall), idle ${m.idle_cpu_ms_per_s.toFixed(1)} ms CPU/s`,
        );
      }
    }
  } finally {
    for (const u of ups) u.proc.kill("SIGTERM");
    await dispatcher.close();
    if (baselineDir) rmSync(baselineDir, { recursive: true, force: true });
  }
  const summary = variants.map((v) => {
    const mine = results.filter((m) => m.variant === v.name);
    return {
      variant: v.name,
      median_cpu_us_per_request: median(mine.map((m) => m.cpu_us_per_request)),
      median_cpu_us_per_event: median(mine.map((m) => m.cpu_us_per_event)),
      median_idle_cpu_ms_per_s: median(mine.map((m) => m.idle_cpu_ms_per_s)),
      median_events_per_read: median(mine.map((m) => m.events_per_read)),
    };
  });
  console.log("\nmedians (CPU time of the gateway process, from /proc):");
  for (const s of summary)
    console.log(
      `  ${s.variant.padEnd(24)} ${s.median_cpu_us_per_request.toFixed(0).padStart(6)} µs/request  ` +
        `${s.median_cpu_us_per_event.toFixed(2).padStart(7)} µs/event  ${s.median_events_per_read.toFixed(2)} events/read  ` +
        `idle ${s.median_idle_cpu_ms_per_s.toFixed(1)} ms/s`,
    );
  if (summary.length === 2) {
    const [b, t] = summary as [(typeof summary)[0], (typeof summary)[0]];
    console.log(
      `  this tree / baseline: ${(t.median_cpu_us_per_request / b.median_cpu_us_per_request).toFixed(2)}x per request, ` +
        `${(t.median_cpu_us_per_event / b.median_cpu_us_per_event).toFixed(2)}x per event`,
    );
  }
  const load1 = loadavg()[0];
  console.log(`load average ${load0.toFixed(1)} at the start, ${load1.toFixed(1)} at the end`);
  const file = resolve(a.json);
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(
    file,
    `${JSON.stringify(
      {
        benchmark: "relay",
        created: new Date().toISOString(),
        options: {
          baseline: a.baseline ?? null,
          rounds,
          upstreams,
          streams,
          tokens,
          stepMs,
          requests,
          concurrency,
        },
        load_average: [load0, load1],
        summary,
        rounds: results,
      },
      null,
      2,
    )}\n`,
  );
  console.log(`results: ${file}`);
}

await main();
