/**
 * `kvgate demo` (what `npm start` runs): round-robin against kvgate on simulated replicas under the
 * tutorial workload, side by side, with the fleet simulator's prediction beside them. Ctrl-C stops
 * the run and every child process and exits 0; a failed phase exits 1 with a message that says
 * what to do, after writing whatever phase finished.
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
      "Run simulated vLLM replicas under the tutorial workload (150 users, 6,000-token system prompts, 1,000-token questions and answers), through client-side round-robin and through kvgate at the same time, each on its own replicas; print both side by side with what kvgate simulate predicts (simulated figures).",
    )
    .option("--replicas <n>", "replica processes", num("--replicas", true), d.replicas)
    .option("--time-scale <x>", "simulated seconds per wall second", num("--time-scale", false), d.timeScale)
    .option(
      "--replica-nice <n>",
      "niceness (0-19) of the replica processes in both phases; above 0 the gateway and the load generator get a core first on a small machine",
      (v: string) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0 || n > 19)
          throw new InvalidArgumentError("--replica-nice must be an integer from 0 to 19");
        return n;
      },
      d.replicaNice,
    )
    .option(
      "--scrape-interval-ms <n>",
      "the gateway's metrics poll period in wall ms (the prediction is told it in simulated seconds)",
      num("--scrape-interval-ms", true),
      d.scrapeIntervalMs,
    )
    .option("--users <n>", "closed-loop users, one system prompt each", num("--users", true), d.users)
    .option("--requests <n>", "requests in all (5 questions per user)", num("--requests", true), d.requests)
    .option(
      "--ramp-up <s>",
      "simulated seconds over which the users start their first questions, evenly (0: all at once)",
      (v: string) => {
        const n = Number(v);
        if (!Number.isFinite(n) || n < 0)
          throw new InvalidArgumentError("--ramp-up must be a number of seconds ≥ 0");
        return n;
      },
      d.rampUpS,
    )
    .option("--output-len <n>", "tokens per answer", num("--output-len", true), d.outputLen)
    .option(
      "--stream-interval <n>",
      "the replicas' vLLM --stream-interval: new tokens per streamed chunk (the first token goes out at once)",
      num("--stream-interval", true),
      d.streamInterval,
    )
    .option(
      "--blocks <n>",
      "KV blocks per replica, 16 tokens each, incl. the null block (default: the profile's)",
      num("--blocks", true),
    )
    .option("--profile <name>", "replica hardware/model profile", d.profile)
    .option("--seed <n>", "workload seed", num("--seed", true), d.seed)
    .option(
      "--start-timeout <s>",
      "seconds each replica and the gateway may take to start (default: 60 s stretched by the load average per CPU)",
      num("--start-timeout", false),
    )
    .option("--no-predict", "skip the in-process fleet simulation beside the live runs")
    .option(
      "--sequential",
      "run round-robin, then kvgate, each alone on the machine (twice the wall time), instead of both at once on their own replicas",
    )
    .option("--json <file>", "results file, written when the phases end", d.json)
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
          replicaNice: f.replicaNice,
          scrapeIntervalMs: f.scrapeIntervalMs,
          users: f.users,
          requests: f.requests,
          rampUpS: f.rampUp,
          outputLen: f.outputLen,
          streamInterval: f.streamInterval,
          blocksPerReplica: f.blocks,
          profile: f.profile,
          seed: f.seed,
          startTimeoutMs: f.startTimeout === undefined ? undefined : f.startTimeout * 1000,
          predict: f.predict,
          sequential: f.sequential === true,
          json: f.json,
          report: f.report,
          log: (line) => console.log(line),
          signal: ac.signal,
        });
      } catch (err) {
        if (!ac.signal.aborted) {
          console.error(`kvgate demo: ${(err as Error).message}`);
          if (process.env.KVGATE_DEBUG) console.error((err as Error).stack);
          process.exitCode = 1;
        }
      } finally {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
    });
}
