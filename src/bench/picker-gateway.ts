/**
 * bench:picker, gateway half: the latency kvgate adds in front of a replica. One simulated replica
 * (its own process, huge --time-scale so the engine's simulated time is ~µs) and one `kvgate serve`
 * (its own process, that replica as its only endpoint, so routing cannot change the backend). Small
 * non-streaming completions (max_tokens 1) go directly to the replica and through the gateway,
 * interleaved pair by pair (random order within a pair) so both paths share the machine's noise;
 * sequential and at a small concurrency. Reports p50/p90/p99 per path and the added latency.
 */
import { Pool } from "undici";
import { createRng } from "../scheduler/rng.ts";
import { type Child, simReplicaArgs, spawnKvgate, stopAll } from "../sim/launcher.ts";
import { type Percentiles, percentiles } from "./picker-decision.ts";

export interface GatewayBenchOptions {
  /** Measured request pairs per concurrency level (after warm-up). */
  pairs: number;
  warmupPairs: number;
  concurrency: number[];
  timeScale: number;
  seed: number;
}

export interface GatewayLevel {
  concurrency: number;
  pairs: number;
  /** µs. */
  direct: Percentiles;
  gateway: Percentiles;
  /** gateway p50 − direct p50 (µs), and the same for p99. */
  addedP50: number;
  addedP99: number;
  /** Median over pairs of (gateway − direct), µs: robust to shared noise. */
  addedPairedMedian: number;
  errors: number;
}

export interface GatewayBenchResult {
  replica: string;
  gateway: string;
  model: string;
  timeScale: number;
  levels: GatewayLevel[];
}

/** POSTs `body` and reads the whole response; returns the status. */
async function post(pool: Pool, body: string): Promise<number> {
  const res = await pool.request({
    path: "/v1/completions",
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  await res.body.text();
  return res.statusCode;
}

async function timed(pool: Pool, body: string): Promise<{ ns: number; ok: boolean }> {
  const t0 = process.hrtime.bigint();
  const status = await post(pool, body);
  return { ns: Number(process.hrtime.bigint() - t0), ok: status === 200 };
}

async function waitUntilServing(pool: Pool, body: string, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  let last = 0;
  while (performance.now() < deadline) {
    last = await post(pool, body).catch(() => 0);
    if (last === 200) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`gateway did not serve a request within ${timeoutMs} ms (last status ${last})`);
}

/** Runs `pairs` direct/gateway pairs with `concurrency` workers; each worker alternates its pairs. */
async function level(
  direct: Pool,
  gateway: Pool,
  body: (i: number) => string,
  pairs: number,
  concurrency: number,
  seed: number,
): Promise<{ d: Float64Array; g: Float64Array; errors: number }> {
  const d = new Float64Array(pairs);
  const g = new Float64Array(pairs);
  let next = 0;
  let errors = 0;
  const rng = createRng(seed);
  const worker = async () => {
    for (let i = next++; i < pairs; i = next++) {
      const b = body(i);
      const gatewayFirst = rng.next() < 0.5;
      const first = await timed(gatewayFirst ? gateway : direct, b);
      const second = await timed(gatewayFirst ? direct : gateway, b);
      const [gr, dr] = gatewayFirst ? [first, second] : [second, first];
      g[i] = gr.ns;
      d[i] = dr.ns;
      if (!gr.ok || !dr.ok) errors++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { d, g, errors };
}

function medianOf(xs: Float64Array): number {
  const s = Float64Array.from(xs).sort();
  return s[Math.floor((s.length - 1) / 2)];
}

export async function runGatewayBench(
  o: GatewayBenchOptions,
  log: (s: string) => void,
): Promise<GatewayBenchResult> {
  const replica = await spawnKvgate(
    "sim-replica",
    simReplicaArgs({ "time-scale": o.timeScale, seed: o.seed }),
  );
  let gw: Child | null = null;
  const pools: Pool[] = [];
  try {
    const replicaHost = new URL(replica.url).host;
    gw = await spawnKvgate("gateway", [
      "serve",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--admin-port",
      "0",
      "--endpoints",
      replicaHost,
    ]);
    const maxConc = Math.max(...o.concurrency);
    const direct = new Pool(replica.url, { connections: maxConc, keepAliveTimeout: 60_000 });
    const gateway = new Pool(gw.url, { connections: maxConc, keepAliveTimeout: 60_000 });
    pools.push(direct, gateway);
    const models = (await (await direct.request({ path: "/v1/models", method: "GET" })).body.json()) as {
      data: { id: string }[];
    };
    const model = models.data[0].id;
    // A short prompt varied per request (no cache effects worth measuring), one output token.
    const body = (i: number) =>
      JSON.stringify({ model, prompt: `Say something about the number ${i}.`, max_tokens: 1, stream: false });
    await waitUntilServing(gateway, body(-1));
    const levels: GatewayLevel[] = [];
    for (const c of o.concurrency) {
      log(`gateway latency: concurrency ${c}, ${o.warmupPairs} warm-up + ${o.pairs} measured pairs`);
      await level(direct, gateway, body, o.warmupPairs, c, o.seed + c);
      const r = await level(direct, gateway, body, o.pairs, c, o.seed + 1000 + c);
      const diff = new Float64Array(o.pairs);
      for (let i = 0; i < o.pairs; i++) diff[i] = r.g[i] - r.d[i];
      const addedPairedMedian = medianOf(diff) / 1000;
      const dp = percentiles(r.d);
      const gp = percentiles(r.g);
      levels.push({
        concurrency: c,
        pairs: o.pairs,
        direct: dp,
        gateway: gp,
        addedP50: gp.p50 - dp.p50,
        addedP99: gp.p99 - dp.p99,
        addedPairedMedian,
        errors: r.errors,
      });
    }
    return { replica: replica.banner, gateway: gw.banner, model, timeScale: o.timeScale, levels };
  } finally {
    await Promise.all(pools.map((p) => p.close().catch(() => {})));
    await stopAll(gw === null ? [replica] : [gw, replica]);
  }
}
