/**
 * bench:replica-cpu — the CPU one `kvgate sim-replica` process spends per request of the demo's
 * shape (the tutorial's ~7,000-token completion prompts, streamed), read from /proc (CPU time, not
 * wall time, so a shared machine inflates neither). The demo's replicas must take each turn
 * boundary's burst (150 such prompts within about a second on 8 replicas) without falling behind
 * their timeline; this is the part of that burst a replica pays. The replica runs at a high
 * --time-scale so the engine's modelled time is not what is measured. Medians over rounds.
 *
 *   npm run bench:replica-cpu -- [--requests 600] [--concurrency 8] [--max-tokens 1]
 *     [--stream-interval 10] [--rounds 3] [--json results/bench-replica-cpu.json]
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { Agent, request } from "undici";
import { cpuSecondsOf, simReplicaArgs, spawnKvgate, stopAll } from "../sim/launcher.ts";
import { parseBenchArgs } from "./cli-args.ts";
import { DEMO_DEFAULTS, DEMO_MAX_MODEL_LEN, demoWorkloadSpec } from "./demo.ts";
import { generateWorkload } from "./workloads/spec.ts";

const USAGE = `usage: npm run bench:replica-cpu -- [--requests 600] [--concurrency 8] [--max-tokens 1]
  [--stream-interval 10] [--rounds 3] [--json results/bench-replica-cpu.json]`;

const { values: a } = parseBenchArgs("bench:replica-cpu", USAGE, {
  options: {
    requests: { type: "string", default: "600" },
    concurrency: { type: "string", default: "8" },
    "max-tokens": { type: "string", default: "1" },
    "stream-interval": { type: "string", default: String(DEMO_DEFAULTS.streamInterval) },
    rounds: { type: "string", default: "3" },
    json: { type: "string", default: "results/bench-replica-cpu.json" },
  },
});
const positive = (name: string, v: string | undefined): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) {
    console.error(`bench:replica-cpu: --${name} must be a positive integer, got ${v}`);
    process.exit(2);
  }
  return n;
};
const requests = positive("requests", a.requests);
const concurrency = positive("concurrency", a.concurrency);
const maxTokens = positive("max-tokens", a["max-tokens"]);
const streamInterval = positive("stream-interval", a["stream-interval"]);
const rounds = positive("rounds", a.rounds);

const prompts = generateWorkload(demoWorkloadSpec(DEMO_DEFAULTS)).requests.map((r) => r.prompt ?? "");
const agent = new Agent({ connections: concurrency * 2 });
const perRequestMs: number[] = [];

for (let round = 0; round < rounds; round++) {
  const replica = await spawnKvgate(
    "replica",
    simReplicaArgs({
      profile: DEMO_DEFAULTS.profile,
      "time-scale": 1000,
      "max-model-len": DEMO_MAX_MODEL_LEN,
      "stream-interval": streamInterval,
    }),
    { timeoutMs: 60_000, hint: "What to do: re-run when the machine is less loaded." },
  );
  try {
    const send = async (i: number) => {
      const res = await request(`${replica.url}/v1/completions`, {
        dispatcher: agent,
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          prompt: prompts[i % prompts.length],
          max_tokens: maxTokens,
          ignore_eos: true,
          stream: true,
          stream_options: { include_usage: true },
        }),
      });
      const text = await res.body.text();
      if (res.statusCode !== 200 || !text.endsWith("data: [DONE]\n\n"))
        throw new Error(`request ${i}: HTTP ${res.statusCode}, stream not ended by [DONE]`);
    };
    // Warm the process (JIT, module loading) on prompts outside the measured ones.
    for (let i = 0; i < 20; i++) await send(prompts.length - 1 - i);
    const c0 = cpuSecondsOf(replica.proc.pid);
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < requests) await send(next++);
      }),
    );
    const c1 = cpuSecondsOf(replica.proc.pid);
    if (c0 === null || c1 === null) throw new Error("cannot read the replica's CPU time from /proc");
    const ms = ((c1 - c0) / requests) * 1000;
    perRequestMs.push(ms);
    console.log(`round ${round + 1}/${rounds}: ${ms.toFixed(2)} ms CPU per request`);
  } finally {
    await stopAll([replica]);
  }
}
await agent.close();
const sorted = [...perRequestMs].sort((x, y) => x - y);
const median = sorted[Math.floor(sorted.length / 2)]!;
console.log(`median: ${median.toFixed(2)} ms CPU per request (${requests} requests × ${rounds} rounds)`);
mkdirSync(dirname(a.json), { recursive: true });
writeFileSync(
  a.json,
  `${JSON.stringify(
    {
      bench: "replica-cpu",
      requests,
      concurrency,
      max_tokens: maxTokens,
      stream_interval: streamInterval,
      per_request_cpu_ms: perRequestMs,
      median_cpu_ms: median,
    },
    null,
    2,
  )}\n`,
);
console.log(`results: ${a.json}`);
