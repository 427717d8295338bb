/**
 * bench:picker — how long the endpoint picker takes to decide, and how much latency the gateway
 * adds, side by side in one run. Decision: Scheduler.schedule() (and schedule()+onPicked()) for
 * ~8k-token chat prompts at 8, 64 and 256 endpoints with a warm prefix index, per example config,
 * p50/p90/p99/max over many calls, median over repetitions. Gateway: small non-streaming requests
 * straight to a simulated replica vs through `kvgate serve`. A constant-work calibration loop shows
 * how noisy the machine is (its p99/p50 is the floor any p99 here is measured against).
 * Writes JSON (default results/bench-picker.json) and prints tables.
 *
 * Multi-pool step (`kvgate serve --pools`): InferenceModelRewrite + model → pool, timed alone
 * (picker-multi-pool.ts), its p99 beside the default config's decision p99 at the largest size.
 *
 * Cold cells (--cold-configs, at the largest size) time requests whose prompts no endpoint has seen:
 * the path where nothing matches and every candidate is scored.
 *
 * Precise configs (any with a precise-prefix-cache-producer, e.g. precise-prefix) get token ids and a
 * warm index fed from simulated KV events (picker-precise.ts), and are timed beside their approximate
 * twin (`<config>~approx`: the same config with the approximate producer); a ratio table compares them.
 *
 * Locality configs: `<config>~home` never spills (thresholds out of reach); `<config>~spill-set` is
 * the config deciding over the candidate list its locality-filter leaves, without the filter's cost
 * (picker-locality.ts), so `<config>` against it is the locality step's own cost. The twin decides
 * each request right after its untimed shadow decided the same one, which leaves the request's data
 * warm in the CPU caches; so when the twin is in the run, `<config>` gets an untimed shadow of its
 * own too (another instance of the config), and both sides of the difference are timed alike. The
 * locality step is also timed alone (its filter() call, spilling and `~home`), beside the default
 * config's decision p99, as the multi-pool step is.
 *
 * Usage: see USAGE below (`npm run bench:picker -- --help`).
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments, stringify } from "yaml";
import { createXxHasher } from "../scheduler/hash.ts";
import { createScheduler } from "../scheduler/scheduler.ts";
import { parseBenchArgs } from "./cli-args.ts";
import {
  ChatWorkload,
  ColdChatWorkload,
  type DecisionRun,
  makeEndpoints,
  type Percentiles,
  percentiles,
  promptBytes,
  runDecisions,
  WORKLOAD_DEFAULTS,
} from "./picker-decision.ts";
import { type GatewayBenchResult, runGatewayBench } from "./picker-gateway.ts";
import { SPILL_SET, spillSetPair, timeLocalityFilter } from "./picker-locality.ts";
import { type MultiPoolStepResult, runMultiPoolStep } from "./picker-multi-pool.ts";
import { approximateTwin, KvEventFeed, preciseIndexes, TokenizedWorkload } from "./picker-precise.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** Targets from the issue: p99 decision at 256 endpoints, p50 added gateway latency. */
const TARGET_DECISION_P99_US = 50;
const TARGET_ADDED_P50_US = 1000;
/** Target from issue 17: the multi-pool and locality steps' p99 within 10% of today's decision p99. */
const TARGET_STEP_SHARE = 0.1;

const USAGE = `Usage: npm run bench:picker -- [options]

Times the endpoint picker's decision per example config and the latency kvgate serve adds.

Options:
  --reps N              repetitions; each cell reports the median of per-rep percentiles (default 5)
  --calls N             timed decisions per cell and rep (default 4000)
  --warmup N            untimed decisions before them (default 3000)
  --repeat N            min-of-N diagnostic pass per request; 1 = off (default 3)
  --answer-tokens N     output tokens each in-flight request reports as it ends, as the gateway
                        passes a response's usage on (countOutputTokens then ages the default's
                        index by them); 0: none reported (default 0)
  --endpoints LIST      endpoint counts (default 8,64,256)
  --configs LIST        config/examples names; suffixes: ~approx (a precise config with the
                        approximate producer), ~home (a locality config that never spills),
                        ~spill-set (a locality config deciding over its filter's candidate list,
                        without the filter) (default default,llm-d-chart-default,pd,precise-prefix,
                        locality,locality~spill-set,locality~home)
  --cold-configs LIST   configs also timed on prompts no endpoint has seen, at the largest size
                        (default default,llm-d-chart-default; empty to skip)
  --pairs N             gateway bench: direct/gateway request pairs per level (default 2000)
  --concurrency LIST    gateway bench concurrency levels (default 1,8)
  --time-scale N        the simulated replica's --time-scale (default 10000)
  --no-gateway          skip the gateway bench
  --no-decision         skip the decision bench
  --quick               fewer reps and calls, for a smoke run
  --json FILE           results file (default results/bench-picker.json)
  -h, --help            print this and exit
`;

const { values: args } = parseBenchArgs("bench:picker", USAGE, {
  options: {
    help: { type: "boolean", short: "h", default: false },
    reps: { type: "string", default: "5" },
    calls: { type: "string", default: "4000" },
    warmup: { type: "string", default: "3000" },
    repeat: { type: "string", default: "3" },
    "answer-tokens": { type: "string", default: "0" },
    endpoints: { type: "string", default: "8,64,256" },
    configs: {
      type: "string",
      default: "default,llm-d-chart-default,pd,precise-prefix,locality,locality~spill-set,locality~home",
    },
    "cold-configs": { type: "string", default: "default,llm-d-chart-default" },
    pairs: { type: "string", default: "2000" },
    concurrency: { type: "string", default: "1,8" },
    "time-scale": { type: "string", default: "10000" },
    "no-gateway": { type: "boolean", default: false },
    "no-decision": { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
    json: { type: "string", default: "results/bench-picker.json" },
  },
  strict: true,
});
if (args.help === true) {
  process.stdout.write(USAGE);
  process.exit(0);
}

/** `v` as an integer ≥ `min` (1 unless given), or a usage error naming the flag. */
function posInt(name: string, v: string | undefined, min = 1): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) {
    const what = min === 0 ? "a non-negative integer" : "a positive integer";
    process.stderr.write(`bench:picker: --${name} must be ${what}, got ${v} (see --help)\n`);
    process.exit(2);
  }
  return n;
}
const list = (name: string, v: string | undefined) => (v ?? "").split(",").map((x) => posInt(name, x.trim()));

const quick = args.quick === true;
const reps = quick ? 2 : posInt("reps", args.reps);
const calls = quick ? 1000 : posInt("calls", args.calls);
const warmup = quick ? 1000 : posInt("warmup", args.warmup);
const repeat = posInt("repeat", args.repeat);
const answerTokens = posInt("answer-tokens", args["answer-tokens"], 0);
const sizes = list("endpoints", args.endpoints);
const configs = (args.configs ?? "").split(",").map((s) => s.trim());
const coldConfigs = (args["cold-configs"] ?? "")
  .split(",")
  .map((s) => s.trim())
  .filter((s) => s !== "");
const pairs = quick ? 300 : posInt("pairs", args.pairs);
const concurrency = list("concurrency", args.concurrency);
const timeScale = posInt("time-scale", args["time-scale"]);
const withGateway = args["no-gateway"] !== true;
const withDecision = args["no-decision"] !== true;

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

function medianPercentiles(ps: Percentiles[]): Percentiles {
  return {
    p50: median(ps.map((p) => p.p50)),
    p90: median(ps.map((p) => p.p90)),
    p99: median(ps.map((p) => p.p99)),
    max: median(ps.map((p) => p.max)),
    mean: median(ps.map((p) => p.mean)),
  };
}

const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined)
  console.log(
    "note: run with node --expose-gc (as npm run bench:picker does) to isolate cells from each other's garbage",
  );

/** Constant work (~30 µs of integer math) timed like a decision: the machine's own jitter. */
function calibrate(n: number): Percentiles {
  const a = new Int32Array(4096);
  for (let i = 0; i < a.length; i++) a[i] = i * 2654435761;
  const ns = new Float64Array(n);
  let sink = 0;
  for (let k = 0; k < n; k++) {
    const t0 = process.hrtime.bigint();
    let h = k;
    for (let r = 0; r < 4; r++) for (let i = 0; i < a.length; i++) h = Math.imul(h ^ a[i], 0x9e3779b1) + r;
    sink ^= h;
    ns[k] = Number(process.hrtime.bigint() - t0);
  }
  if (sink === 0.5) console.log(sink); // keep the loop alive
  return percentiles(ns);
}

interface DecisionCell {
  config: string;
  endpoints: number;
  /** Prompts no endpoint has seen (ColdChatWorkload), not the warm-index chat workload. */
  cold: boolean;
  schedule: Percentiles;
  scheduleMinOfRepeats: Percentiles | null;
  scheduleAndPicked: Percentiles;
  hitRatio: number | null;
  targeted: number;
  reps: DecisionRun[];
}

const TWIN = "~approx";

const HOME = "~home";

/**
 * A config's YAML; `<name>~approx` is the approximate twin of a precise config, `<name>~home` a
 * locality-filter config whose thresholds the bench's load never reaches (the usual regime: the
 * local pool has headroom, so the filter keeps it alone). Plain `locality` spills on every decision:
 * the bench's random load is far above its spillThreshold of 0.2.
 */
function configText(name: string): string {
  if (name.endsWith(HOME)) return homeTwin(name.slice(0, -HOME.length));
  if (name.endsWith(SPILL_SET)) return configText(name.slice(0, -SPILL_SET.length));
  const base = name.endsWith(TWIN) ? name.slice(0, -TWIN.length) : name;
  const text = readFileSync(resolve(ROOT, "config/examples", `${base}.yaml`), "utf8");
  if (base === name) return text;
  const twin = approximateTwin(text);
  if (twin === null) throw new Error(`${name}: ${base} has no precise-prefix-cache-producer to swap`);
  return twin;
}

function homeTwin(base: string): string {
  const text = readFileSync(resolve(ROOT, "config/examples", `${base}.yaml`), "utf8");
  const docs = parseAllDocuments(text).map((d) => d.toJS() as Record<string, unknown>);
  let found = false;
  for (const d of docs)
    for (const p of (d?.plugins as { type: string; parameters?: Record<string, unknown> }[] | undefined) ??
      [])
      if (p.type === "locality-filter") {
        p.parameters = { ...p.parameters, spillThreshold: 1e9, recoverThreshold: 1e9 };
        found = true;
      }
  if (!found) throw new Error(`${base}${HOME}: ${base} has no locality-filter`);
  return docs.map((d) => stringify(d)).join("---\n");
}

const isPrecise = (name: string) =>
  !name.endsWith(TWIN) && configText(name).includes("precise-prefix-cache-producer");

const f1 = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
const pad = (s: string | number, n: number) => String(s).padStart(n);

function printDecisions(cells: DecisionCell[], cal: Percentiles): void {
  console.log(
    `\nDecision time, µs: median over ${reps} reps of per-rep percentiles over ${calls} calls.\n` +
      `  schedule(): one call per request (headline). min-of-${repeat}: a later pass, per request the fastest\n` +
      `  of ${repeat} calls in a row (same state, fresh request objects): machine jitter filtered out, but the\n` +
      "  repeats find the index and buffers in cache, so it is a lower bound, not the headline.\n" +
      "  +onPicked: schedule() plus onPicked() (index learning). hit: prefix blocks matched on the pick.",
  );
  console.log(
    `${"config".padEnd(25)}${pad("eps", 4)} | schedule() ${pad("p50", 5)}${pad("p90", 6)}${pad("p99", 6)}${pad("max", 7)}` +
      ` | min-of-${repeat} ${pad("p50", 5)}${pad("p99", 6)} | +onPicked ${pad("p50", 5)}${pad("p99", 6)} | ${pad("hit", 4)} | schedule() p99 per rep`,
  );
  for (const c of cells) {
    const s = c.schedule;
    const m = c.scheduleMinOfRepeats;
    console.log(
      `${(c.cold ? `${c.config} cold` : c.config).padEnd(25)}${pad(c.endpoints, 4)} |            ${pad(f1(s.p50), 5)}${pad(f1(s.p90), 6)}${pad(f1(s.p99), 6)}${pad(f1(s.max), 7)}` +
        ` |          ${pad(m === null ? "-" : f1(m.p50), 5)}${pad(m === null ? "-" : f1(m.p99), 6)}` +
        ` |           ${pad(f1(c.scheduleAndPicked.p50), 5)}${pad(f1(c.scheduleAndPicked.p99), 6)} | ` +
        `${pad(c.hitRatio === null ? "-" : c.hitRatio.toFixed(2), 4)} | ${c.reps.map((r) => f1(r.schedule.p99)).join(" ")}`,
    );
  }
  console.log(
    `${"calibration (const)".padEnd(25)}${pad("-", 4)} |            ${pad(f1(cal.p50), 5)}${pad(f1(cal.p90), 6)}${pad(f1(cal.p99), 6)}${pad(f1(cal.max), 7)}` +
      ` | fixed work: p99/p50 = ${(cal.p99 / cal.p50).toFixed(2)} is this machine's jitter`,
  );
  printPreciseRatios(cells);
  printLocalityCost(cells);
  for (const c of cells.filter((x) => x.endpoints === 256 && !x.cold)) {
    const m = c.scheduleMinOfRepeats;
    console.log(
      `target p99 ≤ ${TARGET_DECISION_P99_US} µs at 256 endpoints, ${c.config}: schedule() ${f1(c.schedule.p99)} µs → ` +
        `${c.schedule.p99 <= TARGET_DECISION_P99_US ? "PASS" : "FAIL"}` +
        (m === null
          ? ""
          : `; min-of-${repeat} ${f1(m.p99)} µs → ${m.p99 <= TARGET_DECISION_P99_US ? "PASS" : "FAIL"}`),
    );
  }
}

/**
 * Each `<config>~spill-set` beside `<config>`: the same decision over the same candidates, with and
 * without the locality-filter's work, so the difference is that step's own cost.
 */
function printLocalityCost(cells: DecisionCell[]): void {
  const twins = cells.filter((c) => !c.cold && c.config.endsWith(SPILL_SET));
  if (twins.length === 0) return;
  console.log(
    "\nLocality step's own cost, schedule() µs: the config spilling on every decision against its\n" +
      `  ${SPILL_SET} twin (the same config deciding over the candidate list the filter left, without the filter;\n` +
      "  each side times its decision right after an identical untimed one):",
  );
  console.log(
    `${"config".padEnd(25)}${pad("eps", 4)} | with filter ${pad("p50", 5)}${pad("p99", 6)} | ${SPILL_SET} ${pad("p50", 5)}${pad("p99", 6)} | filter ${pad("p50", 6)}${pad("p99", 7)}`,
  );
  const signed = (x: number) => `${x >= 0 ? "+" : ""}${f1(x)}`;
  for (const t of twins) {
    const base = t.config.slice(0, -SPILL_SET.length);
    const c = cells.find((x) => !x.cold && x.config === base && x.endpoints === t.endpoints);
    if (c === undefined) continue;
    console.log(
      `${base.padEnd(25)}${pad(t.endpoints, 4)} |             ${pad(f1(c.schedule.p50), 5)}${pad(f1(c.schedule.p99), 6)}` +
        ` |            ${pad(f1(t.schedule.p50), 5)}${pad(f1(t.schedule.p99), 6)}` +
        ` |        ${pad(signed(c.schedule.p50 - t.schedule.p50), 6)}${pad(signed(c.schedule.p99 - t.schedule.p99), 7)}`,
    );
  }
}

/** Target: a precise decision within 2× of an approximate one at 256 endpoints (p50 and p99). */
const TARGET_PRECISE_RATIO = 2;

/** Precise cells beside their approximate twin and kvgate's default config: p50/p99 and their ratios. */
function printPreciseRatios(cells: DecisionCell[]): void {
  const precise = cells.filter((c) => !c.cold && isPrecise(c.config));
  if (precise.length === 0) return;
  const find = (config: string, n: number) =>
    cells.find((c) => !c.cold && c.config === config && c.endpoints === n);
  console.log(
    "\nPrecise vs approximate, schedule() µs (medians as above; ratio = precise / approximate; tokenization,\n" +
      "  which the gateway does before schedule(), is not in either):",
  );
  console.log(
    `${"config".padEnd(25)}${pad("eps", 4)} | precise ${pad("p50", 5)}${pad("p99", 6)} | ~approx ${pad("p50", 5)}${pad("p99", 6)}` +
      ` | ratio ${pad("p50", 5)}${pad("p99", 6)} | default ${pad("p50", 5)}${pad("p99", 6)} | ratio ${pad("p50", 5)}${pad("p99", 6)}`,
  );
  const r2 = (a: number, b: number | undefined) => (b === undefined ? "-" : (a / b).toFixed(2));
  for (const c of precise) {
    const t = find(c.config + TWIN, c.endpoints);
    const d = find("default", c.endpoints);
    const s = c.schedule;
    console.log(
      `${c.config.padEnd(25)}${pad(c.endpoints, 4)} |         ${pad(f1(s.p50), 5)}${pad(f1(s.p99), 6)}` +
        ` |         ${pad(t ? f1(t.schedule.p50) : "-", 5)}${pad(t ? f1(t.schedule.p99) : "-", 6)}` +
        ` |       ${pad(r2(s.p50, t?.schedule.p50), 5)}${pad(r2(s.p99, t?.schedule.p99), 6)}` +
        ` |         ${pad(d ? f1(d.schedule.p50) : "-", 5)}${pad(d ? f1(d.schedule.p99) : "-", 6)}` +
        ` |       ${pad(r2(s.p50, d?.schedule.p50), 5)}${pad(r2(s.p99, d?.schedule.p99), 6)}`,
    );
  }
  for (const c of precise.filter((x) => x.endpoints === 256)) {
    for (const ref of [find(c.config + TWIN, 256), find("default", 256)]) {
      if (ref === undefined) continue;
      const p50 = c.schedule.p50 / ref.schedule.p50;
      const p99 = c.schedule.p99 / ref.schedule.p99;
      const ok = p50 <= TARGET_PRECISE_RATIO && p99 <= TARGET_PRECISE_RATIO;
      console.log(
        `target precise ≤ ${TARGET_PRECISE_RATIO}× approximate at 256 endpoints, ${c.config} vs ${ref.config}: ` +
          `p50 ${p50.toFixed(2)}×, p99 ${p99.toFixed(2)}× → ${ok ? "PASS" : "FAIL"}`,
      );
    }
  }
}

async function main(): Promise<void> {
  const started = new Date().toISOString();
  const loadStart = os.loadavg();
  const workload = new ChatWorkload();
  const warmSpecs = workload.batch(warmup);
  const timedSpecs = workload.batch(calls);
  const sample = timedSpecs.slice(0, 200).map((s) => promptBytes(workload.materialize(s)) / 4);
  const avgTokens = sample.reduce((a, b) => a + b, 0) / sample.length;
  console.log(
    `bench:picker — ${configs.join(", ")} × ${sizes.join("/")} endpoints, ${reps} reps × ${calls} timed decisions ` +
      `(after ${warmup} warm-up), ~${Math.round(avgTokens)}-token chat prompts, ${WORKLOAD_DEFAULTS.users} users, ` +
      `${WORKLOAD_DEFAULTS.systemPrompts} system prompts`,
  );

  const calibration: Percentiles[] = [];
  const runs = new Map<string, DecisionRun[]>();
  if (withDecision) {
    // A discarded run first: the process's own warm-up (JIT tiers, the young generation growing
    // to its working size, as in a gateway's first seconds) otherwise lands in rep 1's tail.
    const { scheduler } = await createScheduler(
      readFileSync(resolve(ROOT, "config/examples", `${configs[0]}.yaml`), "utf8"),
      { seed: 0 },
    );
    runDecisions(
      scheduler,
      makeEndpoints(sizes[sizes.length - 1], configs[0] === "pd"),
      workload,
      warmSpecs,
      timedSpecs,
      { calls, scrapeEvery: 50, inflight: 512, dt: 0.002, repeat: 1 },
      0,
    );
  }
  const cold = new ColdChatWorkload();
  // Cold cells only need the JIT warm (their index never holds a timed prompt): a shorter warm-up.
  const coldWarm = cold.batch(Math.min(warmup, 1000));
  const coldTimed = cold.batch(calls);
  if (withDecision && coldConfigs.length > 0) {
    cold.generate(coldWarm);
    cold.generate(coldTimed);
  }
  const withTwins = configs.flatMap((c) =>
    isPrecise(c) && !configs.includes(c + TWIN) ? [c, c + TWIN] : [c],
  );
  const tokenized = new TokenizedWorkload(workload);
  const feedHasher = await createXxHasher();
  const plan = [
    ...withTwins.flatMap((config) => sizes.map((n) => ({ config, n, cold: false }))),
    ...coldConfigs.map((config) => ({ config, n: sizes[sizes.length - 1], cold: true })),
  ];
  const keyOf = (c: { config: string; n: number; cold: boolean }) => `${c.config}/${c.n}/${c.cold}`;
  for (let rep = 0; rep < (withDecision ? reps : 0); rep++) {
    calibration.push(calibrate(2000));
    for (const cell of plan) {
      const text = configText(cell.config);
      // The previous cell's scheduler (a multi-MB index) is garbage now, all at once, which a
      // gateway never produces: collect it before timing, or its major GC (concurrent marking,
      // slower stores while it runs) lands in this cell. Needs --expose-gc (npm run sets it).
      gc?.();
      // `~spill-set`: the timed twin decides over the list its untimed shadow's locality-filter left.
      // Its base config, when the twin is in the run: the same untimed shadow decision first.
      const { scheduler, shadow } = cell.config.endsWith(SPILL_SET)
        ? await spillSetPair(cell.config, text, 1 + rep).then((p) => ({
            scheduler: p.twin,
            shadow: p.shadow,
          }))
        : {
            ...(await createScheduler(text, { seed: 1 + rep })),
            shadow:
              !cell.cold && plan.some((c) => c.config === cell.config + SPILL_SET)
                ? (await createScheduler(text, { seed: 1 + rep })).scheduler
                : undefined,
          };
      const endpoints = makeEndpoints(cell.n, cell.config === "pd");
      // Precise: token ids on every request, and KV events from the picks back into the index.
      const indexes = preciseIndexes(scheduler.plugins.values());
      const feed =
        indexes.length === 0
          ? undefined
          : new KvEventFeed(indexes, feedHasher, {
              blockSize: 16,
              capacityBlocks: 32768, // scrape()'s cacheNumBlocks
              lagSeconds: 0.05,
              model: "meta-llama/Llama-3.1-8B-Instruct",
            });
      feed?.register(endpoints);
      const run = runDecisions(
        scheduler,
        endpoints,
        cell.cold ? cold : feed !== undefined ? tokenized : workload,
        cell.cold ? coldWarm : warmSpecs,
        cell.cold ? coldTimed : timedSpecs,
        {
          calls,
          scrapeEvery: 50,
          inflight: Math.min(4 * cell.n, 512),
          dt: 0.002,
          repeat,
          feed,
          shadow,
          answerTokens,
        },
        7 + rep,
      );
      runs.set(keyOf(cell), [...(runs.get(keyOf(cell)) ?? []), run]);
    }
    process.stdout.write(`  rep ${rep + 1}/${reps} done\n`);
  }

  const cells: DecisionCell[] = [];
  for (const cell of withDecision ? plan : []) {
    const rs = runs.get(keyOf(cell)) ?? [];
    const hits = rs.map((r) => r.hitRatio).filter((h): h is number => h !== null);
    cells.push({
      config: cell.config,
      endpoints: cell.n,
      cold: cell.cold,
      schedule: medianPercentiles(rs.map((r) => r.schedule)),
      scheduleAndPicked: medianPercentiles(rs.map((r) => r.scheduleAndPicked)),
      scheduleMinOfRepeats:
        repeat > 1 ? medianPercentiles(rs.map((r) => r.scheduleMinOfRepeats as Percentiles)) : null,
      hitRatio: hits.length > 0 ? median(hits) : null,
      targeted: median(rs.map((r) => r.targeted)),
      reps: rs,
    });
  }
  const cal = withDecision ? medianPercentiles(calibration) : null;
  if (cal !== null) printDecisions(cells, cal);
  const multiPool = withDecision ? multiPoolStep(cells) : null;
  const locality = withDecision ? await localityStep(cells, workload, warmSpecs, timedSpecs) : [];

  let gateway: GatewayBenchResult | null = null;
  let gatewayError: string | null = null;
  if (withGateway) {
    try {
      gateway = await runGatewayBench(
        { pairs, warmupPairs: Math.min(200, pairs), concurrency, timeScale, seed: 1 },
        (l) => console.log(`  ${l}`),
      );
    } catch (err) {
      gatewayError = (err as Error).message;
      console.log(`gateway latency: not measured: ${gatewayError}`);
    }
  }
  if (gateway !== null) {
    console.log(
      `\nGateway added latency, µs (${pairs} interleaved pairs per level; POST /v1/completions, max_tokens 1, non-streaming; replica --time-scale ${timeScale})`,
    );
    console.log(
      `${pad("conc", 5)} | direct ${pad("p50", 7)}${pad("p90", 8)}${pad("p99", 8)} | gateway ${pad("p50", 7)}${pad("p90", 8)}${pad("p99", 8)} | added p50 ${pad("paired", 7)} p99 | errors`,
    );
    for (const l of gateway.levels) {
      console.log(
        `${pad(l.concurrency, 5)} |        ${pad(f1(l.direct.p50), 7)}${pad(f1(l.direct.p90), 8)}${pad(f1(l.direct.p99), 8)}` +
          ` |         ${pad(f1(l.gateway.p50), 7)}${pad(f1(l.gateway.p90), 8)}${pad(f1(l.gateway.p99), 8)}` +
          ` | ${pad(f1(l.addedP50), 9)} ${pad(f1(l.addedPairedMedian), 7)} ${pad(f1(l.addedP99), 4)} | ${l.errors}`,
      );
    }
    const seq = gateway.levels[0];
    if (seq !== undefined)
      console.log(
        `target added p50 ≤ ${TARGET_ADDED_P50_US} µs (concurrency ${seq.concurrency}): ${f1(seq.addedP50)} µs → ${seq.addedP50 <= TARGET_ADDED_P50_US ? "PASS" : "FAIL"}`,
      );
  }

  const cpus = os.cpus();
  const out = {
    benchmark: "picker",
    started,
    finished: new Date().toISOString(),
    machine: {
      cpuModel: cpus[0]?.model ?? "unknown",
      cpus: cpus.length,
      cpuMHz: cpus[0]?.speed ?? null,
      totalMemBytes: os.totalmem(),
      platform: os.platform(),
      arch: os.arch(),
      kernel: os.release(),
      loadavgStart: loadStart,
      loadavgEnd: os.loadavg(),
    },
    node: { version: process.version, v8: process.versions.v8 },
    params: {
      reps,
      calls,
      warmup,
      repeat,
      answerTokens,
      endpoints: sizes,
      configs,
      coldConfigs,
      workload: { ...WORKLOAD_DEFAULTS, avgPromptTokens: avgTokens },
      gateway: { pairs, concurrency, timeScale },
    },
    targets: { decisionP99UsAt256: TARGET_DECISION_P99_US, addedP50Us: TARGET_ADDED_P50_US },
    calibration: cal === null ? null : { median: cal, reps: calibration },
    decision: cells.map((c) => ({
      config: c.config,
      endpoints: c.endpoints,
      cold: c.cold,
      scheduleUs: c.schedule,
      scheduleAndPickedUs: c.scheduleAndPicked,
      scheduleMinOfRepeatsUs: c.scheduleMinOfRepeats,
      hitRatio: c.hitRatio,
      targeted: c.targeted,
      reps: c.reps,
    })),
    gateway: gateway ?? (gatewayError !== null ? { error: gatewayError } : null),
    multiPool,
    locality,
  };
  const path = resolve(args.json ?? "results/bench-picker.json");
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(out, null, 2)}\n`);
  console.log(`\nwrote ${path}`);
}

/**
 * `kvgate serve --pools`' step before the pool's decision (rewrite + model → pool), beside today's
 * decision p99 of the default config at the largest size; target: its p99 ≤ 10% of that.
 */
function multiPoolStep(
  cells: DecisionCell[],
): (MultiPoolStepResult & { referenceP99Us: number | null }) | null {
  const big = sizes[sizes.length - 1];
  const ref =
    cells.find((c) => !c.cold && c.endpoints === big && c.config === "default") ??
    cells.find((c) => !c.cold && c.endpoints === big);
  const r = runMultiPoolStep(calls * reps, big);
  const refP99 = ref?.schedule.p99 ?? null;
  console.log(`\nMulti-pool step (rewrite + model → pool, pool-router.ts), µs over ${calls * reps} calls`);
  for (const [name, p, perRequest] of [
    ["declared models", r.declared, true],
    [`learned (${big} replicas)`, r.learned, true],
    ["learned, first lookup", r.learnedScan, false],
  ] as const)
    console.log(
      `${name.padEnd(27)} p50 ${pad(f1(p.p50), 6)} p99 ${pad(f1(p.p99), 6)} max ${pad(f1(p.max), 7)}` +
        (refP99 === null || ref === undefined
          ? ""
          : ` | ${((100 * p.p99) / refP99).toFixed(1)}% of ${ref.config}@${big} decision p99 ${f1(refP99)} µs` +
            (perRequest
              ? ` → ${p.p99 <= TARGET_STEP_SHARE * refP99 ? "PASS" : "FAIL"} (target ≤ ${100 * TARGET_STEP_SHARE}%)`
              : " (once per model and second, not per request)")),
    );
  return { ...r, referenceP99Us: refP99 };
}

/**
 * The locality-filter step alone (its filter() call's own time), for each `<config>` run beside its
 * `~spill-set` twin: spilling on every decision, and as `<config>~home` (the local pool has room),
 * over the same decisions as the cells, at the largest size, beside the default config's decision
 * p99; target: the step's p99 ≤ 10% of that, as for the multi-pool step.
 */
async function localityStep(
  cells: DecisionCell[],
  workload: ChatWorkload,
  warmSpecs: ReturnType<ChatWorkload["batch"]>,
  timedSpecs: ReturnType<ChatWorkload["batch"]>,
): Promise<
  { config: string; stepUs: Percentiles; refreshUs: Percentiles | null; referenceP99Us: number | null }[]
> {
  const big = sizes[sizes.length - 1];
  const bases = configs.filter((c) => configs.includes(c + SPILL_SET));
  if (bases.length === 0) return [];
  const ref = cells.find((c) => !c.cold && c.endpoints === big && c.config === "default");
  const refP99 = ref?.schedule.p99 ?? null;
  console.log(
    `\nLocality step alone (locality-filter's filter() call), µs at ${big} endpoints, median of ${reps} reps:`,
  );
  const out: {
    config: string;
    stepUs: Percentiles;
    refreshUs: Percentiles | null;
    referenceP99Us: number | null;
  }[] = [];
  for (const config of bases.flatMap((b) => [b, b + HOME])) {
    const per: Percentiles[] = [];
    const perRefresh: Percentiles[] = [];
    for (let rep = 0; rep < reps; rep++) {
      const { scheduler } = await createScheduler(configText(config), { seed: 1 + rep });
      const timer = timeLocalityFilter(config, scheduler);
      gc?.();
      runDecisions(
        scheduler,
        makeEndpoints(big, false),
        workload,
        warmSpecs,
        timedSpecs,
        {
          calls,
          scrapeEvery: 50,
          inflight: Math.min(4 * big, 512),
          dt: 0.002,
          repeat: 1,
        },
        1 + rep,
      );
      per.push(timer.last(calls));
      const r = timer.refresh();
      if (r !== null) perRefresh.push(r);
    }
    const p = medianPercentiles(per);
    const refreshUs = perRefresh.length > 0 ? medianPercentiles(perRefresh) : null;
    out.push({ config, stepUs: p, refreshUs, referenceP99Us: refP99 });
    console.log(
      `${config.padEnd(27)} p50 ${pad(f1(p.p50), 6)} p99 ${pad(f1(p.p99), 6)} max ${pad(f1(p.max), 7)}` +
        (refP99 === null
          ? ""
          : ` | ${((100 * p.p99) / refP99).toFixed(1)}% of default@${big} decision p99 ${f1(refP99)} µs → ` +
            `${p.p99 <= TARGET_STEP_SHARE * refP99 ? "PASS" : "FAIL"} (target ≤ ${100 * TARGET_STEP_SHARE}%)`) +
        (refreshUs === null
          ? ""
          : ` | between requests, refresh() p50 ${f1(refreshUs.p50)} p99 ${f1(refreshUs.p99)} per period`),
    );
  }
  return out;
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
