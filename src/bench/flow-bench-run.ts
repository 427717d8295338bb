/**
 * bench:flow, the scenarios: streaming completions sent through an in-process gateway, timed at the
 * client (first token, end) and converted to the replica's simulated seconds (wall × time scale).
 *   noisy neighbour — tenant B's short requests at a steady pace, alone and then while tenant A floods long
 *                     prompts all at once;
 *   priority mix    — sheddable, then standard, then critical requests all at once (overload).
 */
import { Pool } from "undici";
import { startGateway } from "../gateway/gateway.ts";
import { createRng } from "../scheduler/rng.ts";
import { seededPrompt, type Timed } from "./flow-bench-stats.ts";

export interface Target {
  pool: Pool;
  model: string;
  /** Simulated seconds per wall second (the replica's --time-scale). */
  timeScale: number;
}

export interface Send {
  cls: string;
  headers: Record<string, string>;
  promptTokens: number;
  maxTokens: number;
  seed: number;
}

/** Sends one streaming completion; times are simulated seconds since `t0` (performance.now() ms). */
export async function send(t: Target, s: Send, t0: number): Promise<Timed> {
  const sim = () => ((performance.now() - t0) / 1000) * t.timeScale;
  const body = JSON.stringify({
    model: t.model,
    prompt: seededPrompt(s.promptTokens, s.seed),
    max_tokens: s.maxTokens,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  });
  const sentAt = sim();
  let firstTokenAt: number | null = null;
  let outputTokens = 0;
  let status = 0;
  let reason: string | null = null;
  try {
    const res = await t.pool.request({
      path: "/v1/completions",
      method: "POST",
      headers: { "content-type": "application/json", ...s.headers },
      body,
    });
    status = res.statusCode;
    const r = res.headers["x-llm-d-request-dropped-reason"];
    reason = typeof r === "string" ? r : null;
    let tail = "";
    for await (const chunk of res.body) {
      const text = tail + (chunk as Buffer).toString("utf8");
      if (status === 200 && firstTokenAt === null && text.includes('"text":')) firstTokenAt = sim();
      const m = text.match(/"completion_tokens":\s*(\d+)/);
      if (m) outputTokens = Number(m[1]);
      tail = text.slice(-64);
    }
  } catch (err) {
    reason = `client error: ${(err as Error).message}`;
  }
  return { cls: s.cls, sentAt, status, reason, firstTokenAt, doneAt: sim(), outputTokens };
}

const sleepSim = (t: Target, simS: number) => new Promise((r) => setTimeout(r, (simS / t.timeScale) * 1000));

export interface NoisyOptions {
  aRequests: number;
  aPromptTokens: number;
  /** A's output lengths: seeded, uniform in [min, max] (equal lengths would finish in lock-step batches). */
  aMaxTokens: [number, number];
  bRequests: number;
  bPromptTokens: number;
  bMaxTokens: number;
  /** Simulated seconds between B's requests. */
  bIntervalS: number;
  seed: number;
}

/**
 * `n` tiny requests at once, so the pool holds `n` open keep-alive connections before a burst: a
 * burst then reaches the gateway at once instead of behind `n` TCP handshakes.
 */
export async function warmConnections(t: Target, n: number): Promise<void> {
  await Promise.all(
    Array.from({ length: n }, (_, i) =>
      send(t, { cls: "warm", headers: {}, promptTokens: 4, maxTokens: 1, seed: i }, performance.now()),
    ),
  );
}

const tenant = (id: string) => ({ "x-llm-d-inference-fairness-id": id });

/**
 * B's requests at a steady pace (one every `bIntervalS`, whether or not the last was answered: an
 * interactive client does not wait for the gateway to be free), so each one meets the flood.
 */
async function tenantB(t: Target, o: NoisyOptions, t0: number, seedBase: number): Promise<Timed[]> {
  const out: Promise<Timed>[] = [];
  for (let i = 0; i < o.bRequests; i++) {
    if (i > 0) await sleepSim(t, o.bIntervalS);
    out.push(
      send(
        t,
        {
          cls: "B",
          headers: tenant("tenant-b"),
          promptTokens: o.bPromptTokens,
          maxTokens: o.bMaxTokens,
          seed: seedBase + i,
        },
        t0,
      ),
    );
  }
  return Promise.all(out);
}

/** B alone (after a few unmeasured warm-up requests), then A's flood (all at once) with B starting just after it. */
export async function noisyNeighbour(t: Target, o: NoisyOptions) {
  await tenantB(t, { ...o, bRequests: 3 }, performance.now(), o.seed + 5000);
  const rng = createRng(o.seed);
  const [lo, hi] = o.aMaxTokens;
  const aLengths = Array.from({ length: o.aRequests }, () => lo + Math.floor(rng.next() * (hi - lo + 1)));
  const alone = await tenantB(t, o, performance.now(), o.seed);
  await warmConnections(t, o.aRequests + 2);
  const t0 = performance.now();
  const flood = Array.from({ length: o.aRequests }, (_, i) =>
    send(
      t,
      {
        cls: "A",
        headers: tenant("tenant-a"),
        promptTokens: o.aPromptTokens,
        maxTokens: aLengths[i],
        seed: o.seed + 10_000 + i,
      },
      t0,
    ),
  );
  await sleepSim(t, 0.05);
  const [a, b] = await Promise.all([Promise.all(flood), tenantB(t, o, t0, o.seed + 1000)]);
  return { alone, a, b };
}

export interface MixOptions {
  /** Sent in this order, all at once. */
  classes: { cls: string; n: number }[];
  promptTokens: number;
  maxTokens: number;
  seed: number;
}

export async function priorityMix(t: Target, o: MixOptions): Promise<Timed[]> {
  await warmConnections(
    t,
    o.classes.reduce((a, c) => a + c.n, 0),
  );
  const t0 = performance.now();
  const all: Promise<Timed>[] = [];
  let k = 0;
  for (const c of o.classes)
    for (let i = 0; i < c.n; i++)
      all.push(
        send(
          t,
          {
            cls: c.cls,
            headers: { "x-llm-d-inference-objective": c.cls },
            promptTokens: o.promptTokens,
            maxTokens: o.maxTokens,
            seed: o.seed + 20_000 + k++,
          },
          t0,
        ),
      );
  return Promise.all(all);
}

/** The replica's step-delivery lag histogram so far (kvgate:sim_delivery_lag_seconds): sum, count, ≤ 0.1 s. */
export interface LagSample {
  sum: number;
  count: number;
  within100ms: number;
}

/** The histogram summed over the replicas at `replicaUrls`. */
export async function replicaLag(replicaUrls: readonly string[]): Promise<LagSample> {
  const total: LagSample = { sum: 0, count: 0, within100ms: 0 };
  for (const url of replicaUrls) {
    const pool = new Pool(url);
    try {
      const text = await (await pool.request({ path: "/metrics", method: "GET" })).body.text();
      const value = (re: RegExp) => Number(text.match(re)?.[1] ?? Number.NaN);
      total.sum += value(/^kvgate:sim_delivery_lag_seconds_sum\{[^}]*\} (\S+)$/m);
      total.count += value(/^kvgate:sim_delivery_lag_seconds_count\{[^}]*\} (\S+)$/m);
      total.within100ms += value(/^kvgate:sim_delivery_lag_seconds_bucket\{[^}]*le="0\.1"[^}]*\} (\S+)$/m);
    } finally {
      await pool.close();
    }
  }
  return total;
}

/** Mean lag and the share of step deliveries more than 0.1 simulated s late, between two samples. */
export function lagBetween(a: LagSample, b: LagSample): { meanS: number | null; lateShare: number | null } {
  const n = b.count - a.count;
  if (!(n > 0)) return { meanS: null, lateShare: null };
  return { meanS: (b.sum - a.sum) / n, lateShare: 1 - (b.within100ms - a.within100ms) / n };
}

/**
 * A fresh in-process gateway on `config` in front of the replicas (`replicaHosts`: host:port, comma
 * separated), serving before `fn` runs; closed after.
 */
export async function withGateway<T>(
  replicaHosts: string,
  config: string,
  timeScale: number,
  model: string,
  fn: (t: Target) => Promise<T>,
): Promise<{ result: T; warnings: string[] }> {
  const warnings: string[] = [];
  const gw = await startGateway({
    endpoints: replicaHosts,
    config,
    scrapeIntervalMs: 100,
    log: (l) => warnings.push(l),
  });
  const pool = new Pool(gw.url, { connections: 256, keepAliveTimeout: 60_000 });
  try {
    const t: Target = { pool, model, timeScale };
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await send(t, { cls: "warm", headers: {}, promptTokens: 8, maxTokens: 1, seed: 0 }, 0);
      if (r.status === 200) break;
      if (performance.now() > deadline)
        throw new Error(`gateway did not serve within 30 s (last ${r.status})`);
      await new Promise((res) => setTimeout(res, 100));
    }
    return { result: await fn(t), warnings };
  } finally {
    await pool.close().catch(() => {});
    await gw.close();
  }
}
