/**
 * bench:default-verdict — issue 9's "the default never loses", checked the way a user would: every
 * shipped traffic-shape scenario, at several seeds (other draws of the same shape), optionally at a
 * tenth of its size (`--quick`) and on fleets of other sizes at proportional load (`--scales 0.5,2`,
 * `kvgate simulate --scale`), simulated with all its routers by `kvgate simulate`. Per run, the
 * default config against the best other router on each figure separately — output tokens/s within 2%,
 * TTFT p90 and p99 no more than 10% worse — over the whole run and in every measured (non-warm-up)
 * stage, printed as PASS/MISS with the figure that missed. Simulated figures; deterministic for a seed.
 * Writes JSON (default results/bench-default-verdict.json).
 *
 * `--draws N` runs each scenario and seed N times with the routers' own random draws seeded apart
 * (`kvgate simulate --router-seed`: seed, seed + 1, …; the traffic is the same) and judges each
 * router's output tokens/s by its median over the draws, and its TTFT p90 and p99 over the draws'
 * requests pooled (each draw's per-request rows, `kvgate simulate --records`). Which replica becomes
 * a prefix's home hangs on tie-breaks, and on the 150 × 5 run at seed 42 that alone moved the
 * default's 15 QPS stage between 6,075 and 6,558 output tokens/s over five router seeds (precise:
 * 6,327–6,562), the first of them its worst: one draw compares placement luck as much as routers,
 * and the best of five other routers' single draws is biased upwards. A stage's TTFT p99 there is
 * its 7th–15th slowest request, and which arrivals meet at one home moves it by ±20% from draw to
 * draw. Judged by the medians of five draws at seed 17 (20 draws of each of the two, split into
 * disjoint sets of five), precise missed the +10% against its own other draws in 10 of 12 pairs of
 * sets and against the default in 14 of 16. Pooled over ten draws: 0 of 2 and 2 of 4. Take enough
 * draws for the check to tell routers apart rather than draws: over 15 the 35 QPS stage's p99 was
 * still 11.1–18.5% above precise's at seeds 42, 7 and 3, and over 30 it was within 9.5% at all three.
 *
 * Beside each verdict, every other router is judged by the same rule against all the rest (the
 * default among them): where precise, which places prefixes as the default does, misses as often
 * and by as much, the margins are inside the draws' luck on that run rather than a loss of the
 * default's.
 *
 * On shared-prefix-73 (the issue's 150 × 5 run, and the same shape at other seeds and sizes) the
 * issue's own clause for that run is checked too, and printed under the table: within 5% of
 * precise's output tokens/s, and TTFT p99 under 2 s in every stage where precise's is.
 *
 *   npm run bench:default-verdict -- [--scenarios mixed-length,multi-turn] [--seeds 42,7,3] [--quick]
 *     [--scales 1] [--draws 1] [--jobs 2] [--candidate default] [--json FILE]
 */
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { parseBenchArgs } from "./cli-args.ts";
import { table } from "./format.ts";
import { percentile } from "./latency-summary.ts";
import { parseRowsJsonl, type RequestRow } from "./request-rows.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const SCENARIOS = [
  "shared-prefix-73",
  "multi-turn",
  "mixed-length",
  "no-sharing-overload",
  "tutorial-steady",
  "tutorial",
  "one-system-prompt",
  "popular-prompt",
];
/** Issue 9's margins: throughput within 2% of the best other router, TTFT p90/p99 at most 10% worse. */
const THROUGHPUT_MARGIN = 0.02;
const TTFT_MARGIN = 0.1;
const USAGE = `usage: npm run bench:default-verdict -- [--scenarios a,b] [--seeds 42,7,3] [--quick] [--scales 1] [--draws N] [--jobs N] [--candidate NAME] [--json FILE]
  --scenarios  scenario names under scenarios/ (default ${SCENARIOS.join(",")})
  --seeds      seeds to run each scenario at (default 42,7,3)
  --quick      each workload at a tenth of its size (another size of the same shape)
  --scales     fleet sizes to run each scenario at, as factors of its own (kvgate simulate
               --scale: replicas, arrival rates and shared prompt pools × f; default 1)
  --draws      runs per scenario and seed, the routers' random draws seeded apart; each router
               judged by its median output tokens/s and its TTFT percentiles over every draw's
               requests together (default 1)
  --jobs       routers simulated at once per scenario (kvgate simulate --jobs; default 2)
  --candidate  the scenarios' name for the router judged (default "default"; the locality
               scenarios call it global-default)
On shared-prefix-73 it also checks that run's own target, printed under the table: within 5% of
precise's output tokens/s, and TTFT p99 under 2 s in every stage where precise's is.`;

interface Figures {
  out: number;
  p90: number;
  p99: number;
}
/** One figure of the default against the best other router on it. */
export interface Check {
  scope: string;
  metric: "out tok/s" | "TTFT p90" | "TTFT p99";
  value: number;
  best: number;
  bestRouter: string;
  /** Signed: positive = the default is worse by this fraction. */
  worse: number;
  pass: boolean;
  /**
   * Throughput checks only: TTFT p90 in the same scope, the default's and the best router's. A
   * router that fell behind in the stage before drains its backlog into this stage's window, which
   * shows as throughput here and as a TTFT p90 far above the default's.
   */
  ttftP90?: { value: number; best: number };
}

export interface RunJson {
  router: string;
  output_tokens_per_s: number;
  ttft_p90_s: number;
  ttft_p99_s: number;
  stages: {
    index: number;
    rate: number;
    warmup?: boolean;
    output_tokens_per_s: number;
    ttft_p90_s: number;
    ttft_p99_s: number;
  }[];
}

const figures = (r: { output_tokens_per_s: number; ttft_p90_s: number; ttft_p99_s: number }): Figures => ({
  out: r.output_tokens_per_s,
  p90: r.ttft_p90_s,
  p99: r.ttft_p99_s,
});

/** The default's figures in one scope against each other router's: one Check per metric. */
export function compare(scope: string, mine: Figures, others: [string, Figures][]): Check[] {
  if (others.length === 0) return [];
  const best = (key: keyof Figures, higher: boolean) =>
    others.reduce((a, b) => ((higher ? b[1][key] > a[1][key] : b[1][key] < a[1][key]) ? b : a));
  const [outR, outB] = best("out", true);
  const out: Check = {
    scope,
    metric: "out tok/s",
    value: mine.out,
    best: outB.out,
    bestRouter: outR,
    worse: outB.out > 0 ? (outB.out - mine.out) / outB.out : 0,
    pass: mine.out >= outB.out * (1 - THROUGHPUT_MARGIN),
    ttftP90: { value: mine.p90, best: outB.p90 },
  };
  const latency = (key: "p90" | "p99", metric: Check["metric"]): Check => {
    const [r, b] = best(key, false);
    return {
      scope,
      metric,
      value: mine[key],
      best: b[key],
      bestRouter: r,
      worse: b[key] > 0 ? (mine[key] - b[key]) / b[key] : 0,
      pass: mine[key] <= b[key] * (1 + TTFT_MARGIN),
    };
  };
  return [out, latency("p90", "TTFT p90"), latency("p99", "TTFT p99")];
}

/** Every check of one simulate run: the whole run, then each measured stage. */
export function verdict(runs: RunJson[], mine = "default"): Check[] {
  const me = runs.find((r) => r.router === mine);
  if (!me)
    throw new Error(
      `no router "${mine}" in the run (it has ${runs.map((r) => r.router).join(", ")}): list it in the scenario, or name the one to judge with --candidate`,
    );
  const others = runs.filter((r) => r !== me);
  const checks = compare(
    "run",
    figures(me),
    others.map((r) => [r.router, figures(r)]),
  );
  for (const s of me.stages) {
    if (s.warmup) continue;
    const peers = others.flatMap((r): [string, Figures][] => {
      const t = r.stages.find((x) => x.index === s.index);
      return t ? [[r.router, figures(t)]] : [];
    });
    checks.push(...compare(`stage ${s.index + 1} (${s.rate} QPS)`, figures(s), peers));
  }
  return checks;
}

/** One router judged as the default is, against all the others (the default among them). */
export interface Control {
  router: string;
  pass: boolean;
  misses: Pick<Check, "scope" | "metric" | "worse" | "bestRouter">[];
}

/**
 * Every other router judged by the same rule, against all the rest: whether the margins can be met
 * at all on this run. Where the routers that place prefixes like the default (precise) miss too,
 * by as much, a miss says more about placement luck than about the default.
 */
export function controls(runs: RunJson[], mine = "default"): Control[] {
  return runs
    .filter((r) => r.router !== mine)
    .map((r) => {
      const misses = verdict(runs, r.router)
        .filter((c) => !c.pass)
        .map(({ scope, metric, worse, bestRouter }) => ({ scope, metric, worse, bestRouter }));
      return { router: r.router, pass: misses.length === 0, misses };
    });
}

/**
 * Issue 9's clause for the 150 × 5 run (shared-prefix-73) beside the general margins: the default
 * within 5% of precise's output tokens/s over the run, and its TTFT p99 under 2 s in every measured
 * stage where precise's is.
 */
export interface PreciseClause {
  /** Signed, as a Check's: positive = the candidate's output tokens/s is below precise's by this fraction. */
  worse: number;
  /** Measured stages where precise's TTFT p99 is under 2 s and the candidate's is not. */
  stagesOver: { scope: string; p99: number; precise: number }[];
  /** The candidate's highest TTFT p99 over the stages where precise's is under 2 s. */
  worstP99: number;
  pass: boolean;
}
export const PRECISE_CLAUSE = { throughput: 0.05, p99Seconds: 2 } as const;

/** The 150 × 5 clause on one run, or undefined when the run has no `precise` router to hold it to. */
export function preciseClause(runs: RunJson[], mine = "default"): PreciseClause | undefined {
  const me = runs.find((r) => r.router === mine);
  const precise = runs.find((r) => r.router === "precise");
  if (!me || !precise || me === precise) return undefined;
  const worse =
    precise.output_tokens_per_s > 0
      ? (precise.output_tokens_per_s - me.output_tokens_per_s) / precise.output_tokens_per_s
      : 0;
  const stagesOver: PreciseClause["stagesOver"] = [];
  let worstP99 = 0;
  for (const s of me.stages) {
    if (s.warmup) continue;
    const p = precise.stages.find((x) => x.index === s.index);
    if (!p || !(p.ttft_p99_s < PRECISE_CLAUSE.p99Seconds)) continue;
    worstP99 = Math.max(worstP99, s.ttft_p99_s);
    if (!(s.ttft_p99_s < PRECISE_CLAUSE.p99Seconds))
      stagesOver.push({
        scope: `stage ${s.index + 1} (${s.rate} QPS)`,
        p99: s.ttft_p99_s,
        precise: p.ttft_p99_s,
      });
  }
  return { worse, stagesOver, worstP99, pass: worse <= PRECISE_CLAUSE.throughput && stagesOver.length === 0 };
}

/** The median of `xs` (the mean of the middle two when their count is even). */
export function median(xs: readonly number[]): number {
  if (xs.length === 0) throw new Error("median of nothing");
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/**
 * Several draws of one scenario and seed as one run per router: each figure (whole run, and each
 * stage's) the median over the draws of that router. A router or stage missing from a draw is
 * judged on the draws that have it.
 */
export function medianRuns(draws: readonly RunJson[][]): RunJson[] {
  if (draws.length === 0) throw new Error("no draws to combine");
  const names = [...new Set(draws.flatMap((d) => d.map((r) => r.router)))];
  return names.map((router) => {
    const runs = draws.flatMap((d) => d.filter((r) => r.router === router));
    const indices = [...new Set(runs.flatMap((r) => r.stages.map((s) => s.index)))].sort((a, b) => a - b);
    return {
      router,
      ...medianFigures(runs),
      stages: indices.map((index) => {
        const st = runs.flatMap((r) => r.stages.filter((s) => s.index === index));
        return { index, rate: st[0].rate, ...(st[0].warmup ? { warmup: true } : {}), ...medianFigures(st) };
      }),
    };
  });
}

/**
 * TTFTs of several draws' requests, pooled per router: over the run (warm-up requests left out, as
 * the run's own figures leave them) and per stage, so a percentile counts every draw's requests.
 */
export class TtftPool {
  readonly #ttfts = new Map<string, number[]>();

  add(rows: readonly RequestRow[]): void {
    for (const r of rows) {
      if (r.ttft_s === undefined) continue;
      if (r.warmup !== true) this.#push(`${r.router}\nrun`, r.ttft_s);
      if (r.stage !== undefined) this.#push(`${r.router}\n${r.stage}`, r.ttft_s);
    }
  }

  #push(key: string, ttft: number): void {
    const xs = this.#ttfts.get(key);
    if (xs === undefined) this.#ttfts.set(key, [ttft]);
    else xs.push(ttft);
  }

  /** `runs` with each TTFT p90 and p99 taken over the pool; figures the pool has no requests for stay. */
  apply(runs: readonly RunJson[]): RunJson[] {
    const at = (router: string, scope: string, f: RunFigures): RunFigures => {
      const xs = this.#ttfts.get(`${router}\n${scope}`);
      if (xs === undefined || xs.length === 0) return f;
      const sorted = Float64Array.from(xs).sort();
      return {
        ...f,
        ttft_p90_s: percentile(sorted, 90) as number,
        ttft_p99_s: percentile(sorted, 99) as number,
      };
    };
    return runs.map((r) => ({
      ...r,
      ...at(r.router, "run", r),
      stages: r.stages.map((s) => ({ ...s, ...at(r.router, String(s.index), s) })),
    }));
  }
}

type RunFigures = Pick<RunJson, "output_tokens_per_s" | "ttft_p90_s" | "ttft_p99_s">;

const medianFigures = (xs: readonly RunFigures[]): RunFigures => ({
  output_tokens_per_s: median(xs.map((x) => x.output_tokens_per_s)),
  ttft_p90_s: median(xs.map((x) => x.ttft_p90_s)),
  ttft_p99_s: median(xs.map((x) => x.ttft_p99_s)),
});

const run = promisify(execFile);

async function simulate(
  scenario: string,
  seed: number,
  routerSeed: number,
  quick: boolean,
  scale: number,
  jobs: number,
  dir: string,
) {
  const out = join(dir, `${scenario}-${seed}-r${routerSeed}${quick ? "-quick" : ""}-x${scale}.json`);
  const records = out.replace(/\.json$/, ".jsonl");
  const args = [
    join(ROOT, "bin/kvgate"),
    "simulate",
    join(ROOT, "scenarios", `${scenario}.yaml`),
    "--seed",
    String(seed),
    // The first draw's router seed is the scenario's own: a one-draw verdict is `kvgate simulate --seed`'s.
    ...(routerSeed !== seed ? ["--router-seed", String(routerSeed)] : []),
    "--jobs",
    String(jobs),
    "--json",
    out,
    "--records",
    records,
    ...(quick ? ["--quick"] : []),
    ...(scale !== 1 ? ["--scale", String(scale)] : []),
  ];
  const t0 = performance.now();
  await run(process.execPath, args, { maxBuffer: 64 * 1024 * 1024 });
  const wall = (performance.now() - t0) / 1000;
  const json = JSON.parse(readFileSync(out, "utf8")) as { runs: RunJson[] };
  const rows = parseRowsJsonl(readFileSync(records, "utf8"), records);
  rmSync(out);
  rmSync(records);
  return { runs: json.runs, rows, wall };
}

const pct = (x: number) => `${x >= 0 ? "+" : ""}${(x * 100).toFixed(1)}%`;
/** One missed figure, as the table says it (a throughput miss with both routers' TTFT p90 there). */
const missText = (m: Control["misses"][number] & Pick<Check, "ttftP90">) =>
  `${m.scope} ${m.metric} ${pct(m.worse)} vs ${m.bestRouter}` +
  (m.ttftP90 !== undefined
    ? ` (${m.bestRouter}'s TTFT p90 there ${m.ttftP90.best.toFixed(3)} s against ${m.ttftP90.value.toFixed(3)} s)`
    : "");
/** One control in a table cell: PASS or how many figures it missed. */
const controlCell = (c: Control) => (c.pass ? `${c.router} PASS` : `${c.router} MISS ${c.misses.length}`);
/** Below the table, a missed run's figures one per line, and those of any router missing one or two. */
function missLines(name: string, misses: Check[], others: Control[]): string[] {
  const close = others.filter((c) => !c.pass && c.misses.length <= 2);
  if (misses.length === 0 && close.length === 0) return [];
  return [
    `${name}:`,
    ...misses.map((m) => `  - ${missText(m)}`),
    ...close.flatMap((c) => c.misses.map((m) => `  - (${c.router} judged the same way) ${missText(m)}`)),
  ];
}
/** One run's 150 × 5 clause, as printed under the table. */
const clauseLine = (name: string, c: PreciseClause) =>
  `  ${name}: ${c.pass ? "PASS" : "MISS"} — out tok/s ${pct(c.worse)} vs precise; ` +
  (c.stagesOver.length === 0
    ? `TTFT p99 at most ${c.worstP99.toFixed(3)} s in the stages where precise's is under ${PRECISE_CLAUSE.p99Seconds} s`
    : c.stagesOver
        .map((o) => `${o.scope} TTFT p99 ${o.p99.toFixed(3)} s (precise ${o.precise.toFixed(3)} s)`)
        .join(", "));
const fmt = (c: Check) =>
  c.metric === "out tok/s" ? Math.round(c.value).toLocaleString("en-US") : `${c.value.toFixed(3)} s`;

async function main(): Promise<void> {
  const { values: a } = parseBenchArgs("bench:default-verdict", USAGE, {
    options: {
      scenarios: { type: "string", default: SCENARIOS.join(",") },
      seeds: { type: "string", default: "42,7,3" },
      scales: { type: "string", default: "1" },
      quick: { type: "boolean", default: false },
      draws: { type: "string", default: "1" },
      jobs: { type: "string", default: "2" },
      candidate: { type: "string", default: "default" },
      json: { type: "string", default: "results/bench-default-verdict.json" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (a.help) {
    console.log(USAGE);
    return;
  }
  const scenarios = (a.scenarios ?? "").split(",").filter(Boolean);
  const seeds = (a.seeds ?? "").split(",").map(Number);
  if (seeds.some((s) => !Number.isInteger(s) || s < 0))
    throw new Error(`--seeds must be non-negative integers separated by commas, got ${a.seeds}\n${USAGE}`);
  const scales = (a.scales ?? "").split(",").map(Number);
  if (scales.length === 0 || scales.some((f) => !Number.isFinite(f) || f <= 0))
    throw new Error(`--scales must be numbers above 0 separated by commas, got ${a.scales}\n${USAGE}`);
  const jobs = Number(a.jobs);
  if (!Number.isInteger(jobs) || jobs < 1)
    throw new Error(`--jobs must be a positive integer, got ${a.jobs}`);
  const draws = Number(a.draws);
  if (!Number.isInteger(draws) || draws < 1)
    throw new Error(
      `--draws must be a positive integer (an odd count has a middle draw), got ${a.draws}\n${USAGE}`,
    );
  const quick = a.quick === true;
  const candidate = a.candidate ?? "default";
  const dir = mkdtempSync(join(os.tmpdir(), "kvgate-verdict-"));
  const results: {
    scenario: string;
    seed: number;
    quick: boolean;
    scale: number;
    routerSeeds: number[];
    wallS: number;
    checks: Check[];
    controls: Control[];
    preciseClause?: PreciseClause;
  }[] = [];
  const rows: string[][] = [];
  const details: string[] = [];
  const clauses: string[] = [];
  try {
    for (const scenario of scenarios)
      for (const scale of scales)
        for (const seed of seeds) {
          const routerSeeds = Array.from({ length: draws }, (_, k) => seed + k);
          const all: RunJson[][] = [];
          const pool = new TtftPool();
          let wall = 0;
          for (const rs of routerSeeds) {
            const label = draws > 1 ? ` router seed ${rs}` : "";
            const at = `${scale !== 1 ? ` ×${scale}` : ""} seed ${seed}${label}${quick ? " quick" : ""}`;
            process.stderr.write(`[${scenario}${at}] simulating…\n`);
            const res = await simulate(scenario, seed, rs, quick, scale, jobs, dir);
            all.push(res.runs);
            pool.add(res.rows);
            wall += res.wall;
          }
          const pooled = pool.apply(medianRuns(all));
          const checks = verdict(pooled, candidate);
          const others = controls(pooled, candidate);
          const clause = scenario === "shared-prefix-73" ? preciseClause(pooled, candidate) : undefined;
          results.push({
            scenario,
            seed,
            quick,
            scale,
            routerSeeds,
            wallS: wall,
            checks,
            controls: others,
            ...(clause ? { preciseClause: clause } : {}),
          });
          const misses = checks.filter((c) => !c.pass);
          const run = checks.filter((c) => c.scope === "run");
          const name = scale !== 1 ? `${scenario} ×${scale}` : scenario;
          rows.push([
            name,
            String(seed),
            ...run.map((c) => `${fmt(c)} (${pct(c.worse)} vs ${c.bestRouter})`),
            misses.length === 0 ? "PASS" : `MISS ${misses.length}`,
            others.map(controlCell).join("; "),
          ]);
          details.push(...missLines(`${name} seed ${seed}`, misses, others));
          if (clause) clauses.push(clauseLine(`${name} seed ${seed}${quick ? " (quick)" : ""}`, clause));
        }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(
    `\nbench:default-verdict — ${candidate} vs the best other router per figure (simulated; + = ${candidate} is worse; targets: out tok/s ≥ −${THROUGHPUT_MARGIN * 100}%, TTFT p90/p99 ≤ +${TTFT_MARGIN * 100}%, whole run and every measured stage)${quick ? ", workloads at a tenth of their size" : ""}${draws > 1 ? `, over ${draws} draws (router seeds seed … seed + ${draws - 1}): each router's median output tok/s, and its TTFT percentiles over the draws' requests pooled` : ""}:\n`,
  );
  console.log(
    table(
      [
        "scenario",
        "seed",
        "out tok/s",
        "TTFT p90",
        "TTFT p99",
        "verdict",
        "each other router judged the same way",
      ],
      rows,
    ),
  );
  if (details.length > 0) console.log(`\nwhat missed:\n${details.join("\n")}`);
  if (clauses.length > 0)
    console.log(
      `\nthe 150 × 5 run's own target: ${candidate} within ${PRECISE_CLAUSE.throughput * 100}% of precise's out tok/s, and TTFT p99 under ${PRECISE_CLAUSE.p99Seconds} s in every measured stage where precise's is:\n${clauses.join("\n")}`,
    );
  const path = resolve(ROOT, a.json ?? "results/bench-default-verdict.json");
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(
    path,
    `${JSON.stringify(
      {
        benchmark: "default-verdict",
        simulated: true,
        command: `npm run bench:default-verdict -- ${process.argv.slice(2).join(" ")}`.trim(),
        margins: { throughput: THROUGHPUT_MARGIN, ttft: TTFT_MARGIN },
        candidate,
        draws,
        results,
      },
      null,
      2,
    )}\n`,
  );
  console.log(`\nwrote ${path}`);
}

if (process.argv[1] === fileURLToPath(import.meta.url))
  main().catch((err: Error) => {
    console.error(`bench:default-verdict: ${err.message}`);
    process.exit(2);
  });
