/**
 * `kvgate bench`: generates a workload from a seed and drives it against a target (a gateway, one
 * replica, real vLLM) or client-side round-robin over several base URLs, then prints a summary
 * and optionally writes a results JSON file. A progress line goes to stderr (redrawn on a TTY,
 * a plain line every 10 s otherwise). Exit codes: 2 for a problem found before the run (flags,
 * files, URLs, the fleet's clock; see bench-setup.ts), 1 for a run that failed (more than
 * --max-error-rate of requests failed, nothing was sent, or the results could not go where asked).
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { type Breakdown, breakdown, formatBreakdown } from "../bench/breakdown.ts";
import { type DriverProgress, runBench } from "../bench/driver.ts";
import { formatProgress, formatSummary } from "../bench/format.ts";
import { parseSlo } from "../bench/metrics.ts";
import { DEFAULT_MAX_ERROR_RATE, judgeRun } from "../bench/outcome.ts";
import { saveRun } from "../bench/results-io.ts";
import { buildRun } from "../bench/run.ts";
import { KVGATE_VERSION } from "../bench/version.ts";
import { PRESETS } from "../bench/workloads/presets.ts";
import { WORKLOAD_NAMES } from "../bench/workloads/spec.ts";
import {
  collect,
  type Flags,
  integer,
  list,
  number,
  type Prepared,
  parseStages,
  prepareBench,
} from "./bench-setup.ts";

async function action(f: Flags, cmd: Command): Promise<void> {
  const fail = (msg: string): never => cmd.error(`error: ${msg}`, { exitCode: 2 });
  let s: Prepared | null;
  try {
    s = await prepareBench(f);
  } catch (e) {
    return fail((e as Error).message);
  }
  if (!s) return;
  const { spec, workload, urls, clock } = s;
  for (const w of clock.warnings) console.error(`warning: ${w}`);
  for (const n of clock.notes) console.error(`note: ${n}`);
  if (clock.source === "replicas" && clock.simulated && !f.quiet)
    console.error(`kvgate bench: simulated replicas at ${clock.timeScale}×; times are simulated seconds`);
  const mode = f.target ? "single" : "round-robin";
  const unit = clock.simulated ? "s(sim)" : "s";
  const tty = process.stderr.isTTY && !f.quiet;
  let lastPlain = 0;
  const onProgress = (p: DriverProgress) => {
    if (f.quiet) return;
    if (tty) process.stderr.write(`\r\x1b[2K${formatProgress(p, unit)}`);
    else if (performance.now() - lastPlain >= 10_000) {
      lastPlain = performance.now();
      process.stderr.write(`${formatProgress(p, unit)}\n`);
    }
  };
  const abort = new AbortController();
  const onSigint = () => abort.abort();
  process.once("SIGINT", onSigint);
  let result: Awaited<ReturnType<typeof runBench>>;
  try {
    result = await runBench(workload, {
      targets: urls,
      model: s.model,
      timeScale: clock.timeScale,
      maxDuration: f.maxDuration,
      maxRequests: f.maxRequests,
      requestTimeout: f.requestTimeout,
      metricsEndpoints: s.metricBases,
      extraBody: s.extraBody,
      onProgress,
      signal: abort.signal,
    });
  } catch (e) {
    console.error(`kvgate bench: ${(e as Error).message}`);
    process.exitCode = 1;
    return;
  } finally {
    process.removeListener("SIGINT", onSigint);
    if (tty) process.stderr.write("\n");
  }
  const scales = result.fleet?.sim_time_scales;
  const simulated = clock.simulated || scales !== undefined;
  const expected = clock.detected ?? clock.timeScale;
  if (scales && !scales.every((x) => x === expected))
    console.error(
      `warning: after the run the replicas report time scale ${scales.join(", ")}, not the ${expected} ` +
        `the run was timed with: did a replica restart? Re-run (or pass --time-scale ${scales[0]})`,
    );
  const run = buildRun(spec, workload, result, {
    router: f.router ?? (mode === "round-robin" ? "round-robin" : "target"),
    target: { mode, urls },
    timeScale: clock.timeScale,
    slo: f.slo,
  });
  console.log(formatSummary(run, unit));
  const split = breakdown(result.records, workload.requests);
  if (split !== null) {
    (run as typeof run & { breakdown?: Breakdown }).breakdown = split;
    console.log(`\n${formatBreakdown(split)}`);
  }
  if (result.fleet?.kv_usage_note && result.records.length)
    console.error(`note: ${result.fleet.kv_usage_note}`);
  if (result.maxScheduleLag > 1)
    console.error(
      `warning: requests were sent up to ${result.maxScheduleLag.toFixed(1)} ${unit} late; ` +
        "the driver could not keep up (lower the rate, or run the replicas at a lower --time-scale)",
    );
  if (f.json) {
    try {
      const saved = saveRun(run, f.json, {
        append: !!f.append,
        simulated,
        kvgateVersion: KVGATE_VERSION,
      });
      if (saved.problem) {
        console.error(`kvgate bench: ${saved.problem}`);
        process.exitCode = 1;
      } else console.error(`results ${f.append ? "appended to" : "written to"} ${saved.path}`);
    } catch (e) {
      console.error(`kvgate bench: ${(e as Error).message}; the run follows on stdout as JSON`);
      console.log(JSON.stringify(run));
      process.exitCode = 1;
    }
  }
  const verdict = judgeRun(result.records, f.maxErrorRate, urls);
  if (verdict.failed) {
    console.error(`kvgate bench: ${verdict.message}`);
    process.exitCode = 1;
  }
}

/** Adds the `bench` command to the program. */
export function registerBench(program: Command): Command {
  return program
    .command("bench")
    .description("Drive a seeded workload against a gateway, a replica or a round-robin list, and report.")
    .option("--target <url>", "one base URL: a kvgate gateway, one replica or real vLLM")
    .option("--round-robin <urls>", "client-side round-robin over these base URLs (comma-separated)", list)
    .addOption(new Option("--workload <name>", "workload generator").choices([...WORKLOAD_NAMES]))
    .addOption(new Option("--preset <name>", "named workload preset").choices(Object.keys(PRESETS)))
    .option(
      "--workload-file <yaml>",
      "workload spec file (workload, preset, seed, numRequests, arrival, options)",
    )
    .option("--trace <file.jsonl>", "JSONL trace to replay (workload trace)")
    .option("--seed <n>", "workload seed", integer)
    .option(
      "--num-requests <n>",
      "requests to generate (sessions for multi-turn); stages set their own",
      integer,
    )
    .addOption(
      new Option("--arrival <type>", "arrival process").choices(["constant", "poisson", "gamma", "closed"]),
    )
    .option("--rate <qps>", "requests (or sessions) per second", number)
    .option("--burstiness <k>", "gamma shape: 1 = Poisson, larger = more regular, smaller = burstier", number)
    .option(
      "--users <n>",
      "closed loop: concurrent users, each sending when its previous request ends",
      integer,
    )
    .option("--think-time <s>", "closed loop: pause between a user's requests", number)
    .option(
      "--stages <list>",
      "QPS sweep RATE:DURATION,... (suffix w = warm-up), e.g. 15:50w,3:20,10:20",
      parseStages,
    )
    .addOption(
      new Option("--stage-process <p>", "arrivals within stages").choices(["constant", "poisson", "gamma"]),
    )
    .option("--barrier", "start each stage only after the previous one drained (inference-perf)")
    .option("--stage-interval <s>", "pause between stages", number)
    .option("--set <key=value>", "workload option, repeatable (e.g. --set numGroups=150)", collect)
    .option("--model <name>", "model name (default: first of GET /v1/models)")
    .option("--slo <list>", "goodput SLOs in seconds, e.g. ttft=2,tpot=0.05", (v) => {
      try {
        return parseSlo(v);
      } catch (e) {
        throw new InvalidArgumentError((e as Error).message);
      }
    })
    .option(
      "--time-scale <n>",
      "simulated seconds per wall second of the target (default: the replicas' kvgate:sim_time_scale, " +
        "else 1); overrides what the replicas report",
      number,
    )
    .option(
      "--max-error-rate <fraction>",
      "exit 1 when more than this share of requests fail (requests cut off by --max-duration don't count)",
      number,
      DEFAULT_MAX_ERROR_RATE,
    )
    .option("--max-duration <s>", "hard stop, workload seconds (default 3600)", number)
    .option("--max-requests <n>", "send at most this many requests", integer)
    .option("--request-timeout <s>", "per-request limit, workload seconds (default 600)", number)
    .option(
      "--metrics-endpoints <urls>",
      "replica base URLs to scrape /metrics from (default: the targets; with --gateway-admin, the gateway's replicas)",
      list,
    )
    .option(
      "--gateway-admin <url>",
      "the target gateway's admin API (kvgate serve --admin-port): scrape the replicas it lists at GET /endpoints",
    )
    .option("--no-metrics", "do not scrape /metrics (nor read the replicas' time scale)")
    .option("--extra-body <json>", "merged into every request body, e.g. '{\"return_token_ids\":true}'")
    .option("--json <file>", "write results JSON here")
    .option("--append", "append the run to the --json file if it exists (checked before the run)")
    .option("--router <name>", "router label for the results (default: target or round-robin)")
    .option("--dry-run", "generate the workload, print its size and exit")
    .option("--write-trace <file.jsonl>", "write the generated workload as a JSONL trace")
    .option("--quiet", "no progress line")
    .action(action);
}
