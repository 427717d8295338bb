/**
 * bench:flow, the scenarios: streaming completions sent through an in-process gateway, timed at the
 * client (first token, end) and converted to the replica's simulated seconds (wall × time scale).
 *   noisy neighbour — tenant B's short requests in turn, alone and then while tenant A floods long
 *                     prompts all at once;
 *   priority mix    — sheddable, then standard, then critical requests all at once (overload).
 */
import type { Pool } from "undici";
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
  /** Simulated seconds B waits after each answer before its next request. */
  bThinkS: number;
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

/** B's requests one after another (each after the previous answer and a think time). */
async function tenantB(t: Target, o: NoisyOptions, t0: number, seedBase: number): Promise<Timed[]> {
  const out: Timed[] = [];
  for (let i = 0; i < o.bRequests; i++) {
    out.push(
      await send(
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
    await sleepSim(t, o.bThinkS);
  }
  return out;
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
