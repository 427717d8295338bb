/**
 * bench:gateways — the live counterpart of scenarios/gateways-sync.yaml: 1, 2, 4 and 8 `kvgate
 * serve` processes in front of one small fleet of simulated replicas, synced over a local
 * nats-server (`--nats`) and not, with the client spreading a shared-prefix workload over the
 * gateways round-robin as an L4 load balancer would. Each run gets fresh replicas (no cache carried
 * over) and its own NATS subject. Per run: the fleet's prefix-cache hit rate from the replicas' own
 * vllm:prefix_cache_{hits,queries}_total, output tok/s and TTFT p90 (simulated seconds), the
 * replicas' worst clock lag (kvgate:sim_lag_max_seconds: the 2-core machine could not keep their
 * time scale when it is large), and the CPU seconds the gateway processes used.
 *
 *   npm run bench:gateways -- [--gateways 1,2,4,8] [--replicas 4] [--profile llama-3.1-8b-h100]
 *     [--time-scale 0.5] [--requests 480] [--rate 32] [--groups 24] [--json results/bench-gateways.json]
 *
 * All gateways, replicas, the NATS server and the client share the machine's cores: with 8
 * gateways on 2 cores, CPU contention is part of what is measured.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { availableParallelism, loadavg } from "node:os";
import { dirname, resolve } from "node:path";
import { parsePromText, sumOf } from "../../datalayer/prom-text.ts";
import { type Child, cpuSecondsOf, simReplicaArgs, spawnKvgate, stopAll } from "../../sim/launcher.ts";
import { parseBenchArgs } from "../cli-args.ts";
import { runBench } from "../driver.ts";
import { buildRun } from "../run.ts";
import { generateWorkload, resolveWorkloadSpec } from "../workloads/spec.ts";
import { formatTable, type GatewayRun } from "./table.ts";

const USAGE = `usage: npm run bench:gateways -- [--gateways 1,2,4,8] [--replicas 4] [--profile llama-3.1-8b-h100]
  [--time-scale 0.5] [--requests 480] [--rate 32] [--groups 24] [--seed 42] [--nats-server PATH]
  [--json results/bench-gateways.json]`;

const { values: a } = parseBenchArgs("bench:gateways", USAGE, {
  options: {
    gateways: { type: "string", default: "1,2,4,8" },
    replicas: { type: "string", default: "4" },
    profile: { type: "string", default: "llama-3.1-8b-h100" },
    "time-scale": { type: "string", default: "0.5" },
    requests: { type: "string", default: "480" },
    rate: { type: "string", default: "32" },
    groups: { type: "string", default: "24" },
    seed: { type: "string", default: "42" },
    "nats-server": { type: "string", default: "nats-server" },
    json: { type: "string", default: "results/bench-gateways.json" },
  },
});
const counts = a.gateways.split(",").map(Number);
const replicas = Number(a.replicas);
const timeScale = Number(a["time-scale"]);
for (const [k, v] of Object.entries({ replicas, "time-scale": timeScale, gateways: Math.min(...counts) }))
  if (!(v > 0)) throw new Error(`bench:gateways: --${k} must be a positive number; fix the flag and re-run`);

const spec = resolveWorkloadSpec({
  workload: "shared-prefix",
  seed: Number(a.seed),
  numRequests: Number(a.requests),
  options: {
    numGroups: Number(a.groups),
    promptsPerGroup: Math.ceil(Number(a.requests) / Number(a.groups)),
    systemPromptLen: 3000,
    questionLen: 200,
    outputLen: 64,
  },
  arrival: { type: "poisson", rate: Number(a.rate) },
});
const workload = generateWorkload(spec);

function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => res(p));
    });
  });
}

async function startNats(): Promise<{ url: string; proc: ChildProcess }> {
  const port = await freePort();
  const proc = spawn(a["nats-server"], ["-a", "127.0.0.1", "-p", String(port)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  await new Promise<void>((res, rej) => {
    const t = setTimeout(() => rej(new Error(`nats-server did not start in 20 s:\n${out}`)), 20_000);
    const on = (d: Buffer) => {
      out += d.toString();
      if (out.includes("Server is ready")) {
        clearTimeout(t);
        res();
      }
    };
    proc.stdout?.on("data", on);
    proc.stderr?.on("data", on);
    proc.once("error", (e) => {
      clearTimeout(t);
      rej(
        new Error(
          `cannot run ${a["nats-server"]} (${e.message}): install it (apt-get install nats-server) or pass --nats-server PATH`,
        ),
      );
    });
  });
  return { url: `nats://127.0.0.1:${port}`, proc };
}

async function metric(url: string, name: string): Promise<number> {
  try {
    const res = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5000) });
    return sumOf(parsePromText(await res.text(), { lenient: true }).families, name) ?? Number.NaN;
  } catch {
    return Number.NaN;
  }
}

async function until(what: string, ok: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await ok()) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`bench:gateways: ${what} within ${timeoutMs / 1000} s; re-run on a less loaded machine`);
}

async function run(n: number, synced: boolean, nats: string, k: number): Promise<GatewayRun> {
  const children: Child[] = [];
  const w0 = performance.now();
  try {
    const reps = await Promise.all(
      Array.from({ length: replicas }, (_, i) =>
        spawnKvgate(
          `replica ${i}`,
          simReplicaArgs({
            profile: a.profile,
            "time-scale": timeScale,
            seed: Number(a.seed) + i,
            "max-model-len": 8192,
          }),
        ),
      ),
    );
    children.push(...reps);
    const urls = reps.map((r) => r.url);
    const scrapeMs = String(Math.max(5, Math.round(100 / timeScale)));
    const gws = await Promise.all(
      Array.from({ length: n }, (_, g) =>
        spawnKvgate(`gateway ${g}`, [
          "serve",
          "--host",
          "127.0.0.1",
          "--port",
          "0",
          "--admin-port",
          "0",
          "--scrape-interval-ms",
          scrapeMs,
          "--endpoints",
          urls.map((u) => new URL(u).host).join(","),
          ...(synced ? ["--nats", nats, "--nats-subject", `kvgate.bench.run${k}`] : []),
        ]),
      ),
    );
    children.push(...gws);
    const admins = gws.map((g) => /admin (http:\/\/\S+?)[,;]/.exec(g.banner)?.[1] ?? "");
    await until("the gateways did not list a model", async () => {
      const ok = await Promise.all(
        gws.map(async (g) => {
          try {
            const b = (await (await fetch(`${g.url}/v1/models`)).json()) as { data?: unknown[] };
            return (b.data?.length ?? 0) > 0;
          } catch {
            return false;
          }
        }),
      );
      return ok.every(Boolean);
    });
    if (synced && n > 1)
      await until("the gateways did not see each other over NATS", async () => {
        const peers = await Promise.all(admins.map((u) => metric(u, "kvgate_sync_peers")));
        return peers.every((p) => p === n - 1);
      });
    const cpu0 = gws.map((g) => cpuSecondsOf(g.proc.pid) ?? 0);
    const t0 = performance.now();
    const result = await runBench(workload, {
      targets: gws.map((g) => g.url),
      timeScale,
      metricsEndpoints: urls,
    });
    const wall = (performance.now() - t0) / 1000;
    const gatewayCpu = gws.reduce((s, g, i) => s + (cpuSecondsOf(g.proc.pid) ?? 0) - cpu0[i], 0);
    const r = buildRun(spec, workload, result, {
      router: `${n} gateway(s) ${synced ? "synced" : "unsynced"}`,
      timeScale,
      target: { mode: n > 1 ? "round-robin" : "single", urls: gws.map((g) => g.url) },
    });
    const lags = await Promise.all(urls.map((u) => metric(u, "kvgate:sim_lag_max_seconds")));
    const out: GatewayRun = {
      gateways: n,
      synced,
      requests: r.requests,
      errors: r.errors,
      hit_rate: r.prefix_cache_hit_rate,
      hit_rate_source: r.prefix_cache_hit_rate_source,
      output_tokens_per_s: r.output_tokens_per_s,
      ttft_p90_s: r.ttft_p90_s,
      replica_lag_max_s: Math.max(...lags.filter(Number.isFinite), 0),
      gateway_cpu_s: gatewayCpu,
      bench_wall_s: wall,
      run_wall_s: (performance.now() - w0) / 1000,
      load_avg_1m: loadavg()[0],
    };
    console.log(
      `${n} gateway(s) ${synced ? "synced" : "unsynced"}: hit ${((out.hit_rate ?? 0) * 100).toFixed(1)}%, ` +
        `${(out.output_tokens_per_s ?? 0).toFixed(0)} out tok/s, TTFT p90 ${(out.ttft_p90_s ?? 0).toFixed(3)} s, ` +
        `${out.errors} errors, lag ${out.replica_lag_max_s.toFixed(2)} s, gateway CPU ${gatewayCpu.toFixed(1)} s in ${wall.toFixed(0)} s`,
    );
    return out;
  } finally {
    await stopAll(children);
  }
}

const t0 = performance.now();
const nats = await startNats();
const runs: GatewayRun[] = [];
try {
  let k = 0;
  for (const n of counts)
    for (const synced of n === 1 ? [false] : [false, true]) runs.push(await run(n, synced, nats.url, k++));
} finally {
  nats.proc.kill("SIGTERM");
}
const file = {
  bench: "gateways",
  created: new Date().toISOString(),
  simulated: true,
  machine: `${availableParallelism()} cores`,
  replicas,
  profile: a.profile,
  time_scale: timeScale,
  workload: spec,
  total_wall_s: (performance.now() - t0) / 1000,
  runs,
};
const json = resolve(a.json);
mkdirSync(dirname(json), { recursive: true });
writeFileSync(json, `${JSON.stringify(file, null, 2)}\n`);
writeFileSync(json.replace(/\.json$/, ".md"), `${formatTable(runs)}\n`);
console.log(
  `\n${formatTable(runs)}\n\nwhole run ${file.total_wall_s.toFixed(0)} s; results in ${json} (+ .md)`,
);
