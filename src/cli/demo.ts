/**
 * `kvgate demo` (what `npm start` runs): round-robin against kvgate on simulated replicas, side by
 * side. Ctrl-C stops the run and every child process; the command still exits 0.
 */
import { type Command, InvalidArgumentError } from "commander";
import { DEMO_DEFAULTS, runDemo } from "../bench/demo.ts";

function num(name: string, integer: boolean) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n)))
      throw new InvalidArgumentError(`${name} must be a positive ${integer ? "integer" : "number"}`);
    return n;
  };
}

export function registerDemo(program: Command): void {
  const d = DEMO_DEFAULTS;
  program
    .command("demo")
    .description(
      "Run simulated vLLM replicas under the tutorial workload's shape, first through client-side round-robin, then through kvgate, and print both side by side (simulated figures).",
    )
    .option("--replicas <n>", "replica processes", num("--replicas", true), d.replicas)
    .option("--time-scale <x>", "simulated seconds per wall second", num("--time-scale", false), d.timeScale)
    .option("--requests <n>", "requests per phase", num("--requests", true), d.requests)
    .option("--warmup <n>", "warm-up requests per phase (not measured)", num("--warmup", true), d.warmup)
    .option("--rate <qps>", "offered load, requests per simulated second", num("--rate", false), d.rate)
    .option("--output-len <n>", "tokens per answer", num("--output-len", true), d.outputLen)
    .option(
      "--blocks <n>",
      "KV blocks per replica (16 tokens each)",
      num("--blocks", true),
      d.blocksPerReplica,
    )
    .option("--profile <name>", "replica hardware/model profile", d.profile)
    .option("--seed <n>", "workload seed", num("--seed", true), d.seed)
    .option("--json <file>", "also write the results (routers round-robin and kvgate) as JSON")
    .option("--report <file>", "where to write the HTML report", d.report)
    .action(async (f) => {
      const ac = new AbortController();
      const onSignal = () => {
        process.stderr.write("\nkvgate demo: stopping (Ctrl-C)...\n");
        ac.abort();
      };
      process.once("SIGINT", onSignal);
      process.once("SIGTERM", onSignal);
      try {
        await runDemo({
          replicas: f.replicas,
          timeScale: f.timeScale,
          requests: f.requests,
          warmup: f.warmup,
          rate: f.rate,
          outputLen: f.outputLen,
          blocksPerReplica: f.blocks,
          profile: f.profile,
          seed: f.seed,
          json: f.json,
          report: f.report,
          log: (line) => console.log(line),
          signal: ac.signal,
        });
      } catch (err) {
        if (!ac.signal.aborted) throw err;
      } finally {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
    });
}
