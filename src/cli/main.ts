/**
 * The `kvgate` command line: builds the commander program and registers each command from its own
 * file (sim-replica here; serve, epp, pd-sidecar, bench, demo and simulate register the same way). Usage errors exit
 * with code 2 and a message naming the flag; any other error exits 1 with its message, never a stack.
 * `--version` prints package.json's version.
 */
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Command, CommanderError } from "commander";
import { KVGATE_VERSION } from "../bench/version.ts";
import { registerBench } from "./bench.ts";
import { registerDemo } from "./demo.ts";
import { registerEpp } from "./epp.ts";
import { registerPdSidecar } from "./pd-sidecar.ts";
import { registerReport } from "./report.ts";
import { registerServe } from "./serve.ts";
import { registerSimFleet } from "./sim-fleet.ts";
import { expandVllmShortFlags, registerSimReplica } from "./sim-replica.ts";
import { registerSimulate } from "./simulate.ts";

/** Exit code for bad flags and usage errors. */
export const USAGE_EXIT_CODE = 2;

export function buildProgram(): Command {
  const program = new Command("kvgate")
    .description("An LLM-aware inference gateway for vLLM replicas, with a simulated replica for testing.")
    .version(KVGATE_VERSION, "-V, --version", "print kvgate's version and exit")
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride((err: CommanderError) => {
      throw err;
    });
  registerSimReplica(program);
  registerSimFleet(program);
  registerServe(program);
  registerEpp(program);
  registerPdSidecar(program);
  registerBench(program);
  registerDemo(program);
  registerReport(program);
  registerSimulate(program);
  return program;
}

/** Runs the CLI; resolves when the command's action has finished (servers keep the process alive). */
export async function main(argv: string[] = process.argv): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(expandVllmShortFlags(argv));
  } catch (err) {
    if (err instanceof CommanderError) process.exit(err.exitCode === 0 ? 0 : USAGE_EXIT_CODE);
    console.error(`kvgate: ${(err as Error).message ?? err}`);
    process.exit(1);
  }
}

function isEntry(): boolean {
  const arg = process.argv[1];
  if (!arg) return false;
  try {
    return realpathSync(arg) === fileURLToPath(import.meta.url);
  } catch {
    return false;
  }
}

if (isEntry()) await main();
