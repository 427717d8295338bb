/**
 * The `kvgate` command line: builds the commander program and registers each command from its own
 * file, loading only the one the command line names. Usage errors exit
 * with code 2 and a message naming the flag; any other error exits 1 with its message, never a stack.
 * `--version` prints package.json's version.
 */
import { realpathSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Command, CommanderError } from "commander";
import { KVGATE_VERSION } from "../bench/version.ts";
import { expandVllmShortFlags } from "./sim-replica.ts";

/** Exit code for bad flags and usage errors. */
export const USAGE_EXIT_CODE = 2;

type Register = (program: Command) => unknown;

/**
 * Each command's module, loaded only when needed: a simulated replica should not compile the
 * gateway, gRPC and Kubernetes clients it never uses (8 replicas start on a 2-core demo machine).
 */
const COMMANDS: ReadonlyArray<readonly [string, () => Promise<Register>]> = [
  ["sim-replica", async () => (await import("./sim-replica.ts")).registerSimReplica],
  ["sim-fleet", async () => (await import("./sim-fleet.ts")).registerSimFleet],
  ["serve", async () => (await import("./serve.ts")).registerServe],
  ["epp", async () => (await import("./epp.ts")).registerEpp],
  ["pd-sidecar", async () => (await import("./pd-sidecar.ts")).registerPdSidecar],
  ["bench", async () => (await import("./bench.ts")).registerBench],
  ["demo", async () => (await import("./demo.ts")).registerDemo],
  ["report", async () => (await import("./report.ts")).registerReport],
  ["simulate", async () => (await import("./simulate.ts")).registerSimulate],
];

/**
 * The program with the command `argv` names registered, or every command when it names none of
 * them (help, --version, a typo: commander then lists or suggests among all of them).
 */
export async function buildProgram(argv: readonly string[] = []): Promise<Command> {
  const program = new Command("kvgate")
    .description("An LLM-aware inference gateway for vLLM replicas, with a simulated replica for testing.")
    .version(KVGATE_VERSION, "-V, --version", "print kvgate's version and exit")
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride((err: CommanderError) => {
      throw err;
    });
  const named = COMMANDS.filter(([name]) => name === argv[2]);
  for (const [, load] of named.length ? named : COMMANDS) (await load())(program);
  return program;
}

/** Runs the CLI; resolves when the command's action has finished (servers keep the process alive). */
export async function main(argv: string[] = process.argv): Promise<void> {
  try {
    const args = expandVllmShortFlags(argv);
    const program = await buildProgram(args);
    await program.parseAsync(args);
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
