/**
 * bench:engine — how fast the engine model runs on this CPU, so later work sees if the simulator
 * becomes the bottleneck. A loaded engine (shared-prefix chat traffic with KV pressure, steady
 * arrivals) is stepped in virtual time; we report engine steps per CPU-second and simulated output
 * tokens per CPU-second, median of several repetitions, for both block-hash modes side by side
 * (sha256_cbor, what vLLM-faithful KV events need, with every token output as the replica server
 * streams them; fast64 with first-and-last outputs, as the fleet simulator runs it), and fast64
 * with a 16 GiB CPU offload tier (vLLM --kv-offloading-size 16: every full block stored to CPU, HBM
 * misses reloaded from it, each load completed at the first step boundary after its modelled end),
 * so the tier's cost shows beside the engine without it. Writes JSON (default results/bench-engine.json).
 *
 *   npm run bench:engine -- [--reps 5] [--requests 2000] [--json FILE]
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { type BlockHashAlgo, Engine } from "../engine/engine.ts";
import { Rng } from "../engine/output-tokens.ts";
import { numGpuBlocksFor, validateProfile } from "../engine/profile.ts";
import { parseBenchArgs } from "./cli-args.ts";

const USAGE =
  "usage: npm run bench:engine -- [--reps 5] [--requests 2000] [--profile llama-3.1-8b-h100] [--json FILE]";

/** A variant: the block hash, and whether the engine runs the CPU offload tier. */
type Variant = "sha256_cbor" | "fast64" | "fast64+offload";
const VARIANTS: Variant[] = ["sha256_cbor", "fast64", "fast64+offload"];

interface RepResult {
  steps: number;
  requests: number;
  outputTokens: number;
  promptTokens: number;
  simulatedSeconds: number;
  cpuSeconds: number;
  wallSeconds: number;
  stepsPerCpuSecond: number;
  outputTokensPerCpuSecond: number;
  simulatedSecondsPerCpuSecond: number;
  preemptions: number;
  prefixHitRate: number;
  /** Prompt tokens loaded from the CPU tier (0 without it). */
  offloadLoadedTokens: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function runOnce(profileName: string, numRequests: number, seed: number, variant: Variant): RepResult {
  const blockHashAlgo: BlockHashAlgo = variant === "sha256_cbor" ? "sha256_cbor" : "fast64";
  const offload = variant === "fast64+offload";
  const root = fileURLToPath(new URL("../../", import.meta.url));
  const path = resolve(root, "profiles", `${profileName}.yaml`);
  const profile = validateProfile(parse(readFileSync(path, "utf8")), path);
  // A quarter of the real KV capacity, so the workload below runs under KV pressure.
  const numGpuBlocks = Math.floor(numGpuBlocksFor(profile, 16) / 4);
  const engine = new Engine(
    {
      blockSize: 16,
      numGpuBlocks,
      maxNumSeqs: 256,
      maxNumBatchedTokens: profile.defaults.maxNumBatchedTokens,
      maxModelLen: 32768,
      longPrefillTokenThreshold: 0,
      enablePrefixCaching: true,
      hashSeed: "0",
      seed,
      modelName: profile.model.name,
      dataParallelRank: 0,
      enableKvCacheEvents: true,
      profile,
      ...(offload && { kvOffload: { cpuBytes: 16 * 2 ** 30 } }),
    },
    // fast64 runs the engine as the fleet simulator does, listing only first and finishing tokens.
    { blockHashAlgo, ...(blockHashAlgo === "fast64" && { outputs: "first-and-last" as const }) },
  );
  const rng = new Rng(seed);
  // 32 conversations sharing 2,000-token system prompts in 8 groups; 600-token questions, 200-token answers; 40 req/s.
  const systems = Array.from({ length: 8 }, (_, g) =>
    Array.from({ length: 2000 }, (_, i) => 1000 + g * 3000 + i),
  );
  const arrivals: number[] = [];
  let t = 0;
  for (let i = 0; i < numRequests; i++) {
    t += -Math.log(1 - rng.next()) / 40;
    arrivals.push(t);
  }
  let next = 0;
  let now = 0;
  let steps = 0;
  let offloadLoadedTokens = 0;
  /** CPU-tier loads in flight: completed at the first step boundary at or after their end. */
  let loads: { id: string; at: number }[] = [];
  const cpu0 = process.cpuUsage();
  const wall0 = performance.now();
  while (next < numRequests || engine.hasUnfinishedRequests()) {
    while (next < numRequests && arrivals[next] <= now) {
      const sys = systems[next % 8];
      const q = Array.from({ length: 600 }, () => 50000 + Math.floor(rng.next() * 60000));
      engine.addRequest(
        { id: `r${next}`, promptTokenIds: sys.concat(q), maxTokens: 200, ignoreEos: true },
        arrivals[next],
      );
      next++;
    }
    if (loads.length > 0) {
      const due = loads.filter((l) => l.at <= now);
      if (due.length > 0) {
        loads = loads.filter((l) => l.at > now);
        for (const l of due) engine.completeRemoteKv(l.id, now, true);
      }
    }
    if (!engine.hasUnfinishedRequests()) {
      now = arrivals[next];
      continue;
    }
    const r = engine.step(now);
    for (const l of r.offloadLoads ?? []) {
      loads.push({ id: l.requestId, at: l.readyAt });
      offloadLoadedTokens += l.tokens;
    }
    if (r.numScheduledRequests === 0) {
      // Everything waits for a CPU-tier load or for blocks held by stores: go to the next of those.
      let at = next < numRequests ? arrivals[next] : Number.POSITIVE_INFINITY;
      for (const l of loads) at = Math.min(at, l.at);
      const free = engine.nextOffloadFree();
      if (free !== null) at = Math.min(at, free);
      if (!(at > now))
        throw new Error(`bench:engine: the engine is stuck at ${now} s with nothing to wait for`);
      now = at;
      continue;
    }
    steps++;
    now = r.endTime;
  }
  const cpu = process.cpuUsage(cpu0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  const wallSeconds = (performance.now() - wall0) / 1000;
  const st = engine.stats();
  return {
    steps,
    requests: numRequests,
    outputTokens: st.generationTokens,
    promptTokens: st.promptTokens,
    simulatedSeconds: now,
    cpuSeconds,
    wallSeconds,
    stepsPerCpuSecond: steps / cpuSeconds,
    outputTokensPerCpuSecond: st.generationTokens / cpuSeconds,
    simulatedSecondsPerCpuSecond: now / cpuSeconds,
    preemptions: st.numPreemptions,
    prefixHitRate: st.prefixCacheHits / st.prefixCacheQueries,
    offloadLoadedTokens,
  };
}

function main(): void {
  const { values } = parseBenchArgs("bench:engine", USAGE, {
    options: {
      reps: { type: "string", default: "5" },
      requests: { type: "string", default: "2000" },
      profile: { type: "string", default: "llama-3.1-8b-h100" },
      json: { type: "string", default: "results/bench-engine.json" },
    },
  });
  const reps = Number(values.reps);
  const requests = Number(values.requests);
  if (!Number.isInteger(reps) || reps < 1) throw new Error("--reps must be a positive integer");
  if (!Number.isInteger(requests) || requests < 1) throw new Error("--requests must be a positive integer");
  for (const v of VARIANTS) runOnce(values.profile, Math.min(200, requests), 99, v); // warm-up: JIT
  // Repetitions alternate the variants so machine noise falls on all alike.
  const runs: Record<Variant, RepResult[]> = { sha256_cbor: [], fast64: [], "fast64+offload": [] };
  for (let i = 0; i < reps; i++)
    for (const v of VARIANTS) runs[v].push(runOnce(values.profile, requests, i + 1, v));
  const med = (rs: RepResult[]) => ({
    stepsPerCpuSecond: median(rs.map((r) => r.stepsPerCpuSecond)),
    outputTokensPerCpuSecond: median(rs.map((r) => r.outputTokensPerCpuSecond)),
    simulatedSecondsPerCpuSecond: median(rs.map((r) => r.simulatedSecondsPerCpuSecond)),
  });
  const summary = {
    benchmark: "engine",
    simulated: true,
    profile: values.profile,
    node: process.version,
    workload: `${requests} requests, 8 groups x 2000-token shared prefix + 600 unique, 200 output, Poisson 40 req/s, KV at 1/4 of profile capacity`,
    reps,
    median: {
      sha256_cbor: med(runs.sha256_cbor),
      fast64: med(runs.fast64),
      "fast64+offload": med(runs["fast64+offload"]),
    },
    runs,
  };
  const out = resolve(values.json);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(summary, null, 2)}\n`);
  const first = runs.sha256_cbor[0];
  console.log(`engine (${values.profile}, ${requests} requests x ${reps} reps, median; simulated):`);
  for (const v of VARIANTS) {
    const m = summary.median[v];
    console.log(
      `  ${v.padEnd(14)} ${m.stepsPerCpuSecond.toFixed(0)} steps/CPU-s, ${m.outputTokensPerCpuSecond.toFixed(0)} output tok/CPU-s, ` +
        `${m.simulatedSecondsPerCpuSecond.toFixed(1)} simulated s per CPU-s`,
    );
  }
  console.log(
    `  preemptions ${first.preemptions}, prefix hit rate ${(first.prefixHitRate * 100).toFixed(1)}%; with offload ` +
      `${runs["fast64+offload"][0].offloadLoadedTokens} prompt tokens loaded from CPU → ${out}`,
  );
}

main();
