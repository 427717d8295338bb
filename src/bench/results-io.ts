/**
 * Reading and writing `kvgate bench --json` files without losing a run. Before the run,
 * `checkResultsTarget` finds what would make the write fail (a missing directory, a file that is
 * not a results file, appending a simulated run to a wall-clock file or the other way round), so
 * bench stops before sending a request. After the run, `saveRun` writes the file; if that fails
 * anyway (the file changed meanwhile, the disk is full), the run goes to a file beside it,
 * results.<timestamp>.json, and the caller is told where: a finished run is never dropped.
 */
import { accessSync, constants, existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, extname, join, resolve } from "node:path";
import { BenchSetupError } from "./preflight.ts";
import { parseResultsFile, type ResultsFile, type RunResult, resultsFile } from "./results.ts";

const unitName = (simulated: boolean) => (simulated ? "simulated-seconds" : "wall-clock-seconds");

function readExisting(path: string): ResultsFile {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new BenchSetupError(`cannot read ${path} to append to it (${(e as Error).message})`);
  }
  try {
    return parseResultsFile(text);
  } catch (e) {
    throw new BenchSetupError(
      `${path} is not a kvgate results file (${(e as Error).message}): name another --json file, ` +
        "or drop --append to overwrite it",
    );
  }
}

/**
 * Throws BenchSetupError if a run with this clock could not be written to `path` (with
 * `append`: added to it). Call before the run.
 */
export function checkResultsTarget(path: string, append: boolean, simulated: boolean): void {
  const dir = dirname(resolve(path));
  if (!existsSync(dir))
    throw new BenchSetupError(`--json ${path}: directory ${dir} does not exist; create it first`);
  if (existsSync(path) && statSync(path).isDirectory())
    throw new BenchSetupError(
      `--json ${path} is a directory; name a file, e.g. ${join(path, "results.json")}`,
    );
  try {
    accessSync(dir, constants.W_OK);
    if (existsSync(path)) accessSync(path, constants.W_OK);
  } catch (e) {
    throw new BenchSetupError(
      `--json ${path} is not writable (${(e as Error).message}); choose another path`,
    );
  }
  if (!append || !existsSync(path)) return;
  const file = readExisting(path);
  if (file.simulated !== simulated)
    throw new BenchSetupError(
      `${path} holds ${unitName(file.simulated)} runs and this run's target is ` +
        `${simulated ? "simulated (kvgate:sim_time_scale or --time-scale)" : "real time"}; one file holds one ` +
        "clock: write this run to another --json file" +
        (simulated ? "" : " (or pass --time-scale N if the target really is simulated)"),
    );
}

export interface SaveOptions {
  append: boolean;
  simulated: boolean;
  kvgateVersion: string;
  now?: Date;
}

export interface Saved {
  /** Where the run is now. */
  path: string;
  /** Set when the run could not go where it was asked to: why, and where it went instead. */
  problem?: string;
}

function fileFor(run: RunResult, path: string, o: SaveOptions, created: string): ResultsFile {
  if (o.append && existsSync(path)) {
    const file = readExisting(path);
    if (file.simulated !== o.simulated)
      throw new Error(
        `${path} now holds ${unitName(file.simulated)} runs, this one is ${unitName(o.simulated)}`,
      );
    file.runs.push(run);
    return file;
  }
  return resultsFile([run], { kvgateVersion: o.kvgateVersion, created, simulated: o.simulated });
}

/** results.json → results.2026-12-01T20-15-00-123Z.json, in the same directory. */
export function besidePath(path: string, now: Date): string {
  const ext = extname(path) || ".json";
  const stamp = now.toISOString().replace(/[:.]/g, "-");
  return join(dirname(path), `${basename(path, extname(path))}.${stamp}${ext}`);
}

/** Writes the run to `path` (appending with `append`); on failure, beside it or in the temp dir. */
export function saveRun(run: RunResult, path: string, o: SaveOptions): Saved {
  const now = o.now ?? new Date();
  const created = now.toISOString();
  let problem: string;
  try {
    writeFileSync(path, `${JSON.stringify(fileFor(run, path, o, created), null, 2)}\n`);
    return { path };
  } catch (e) {
    problem = (e as Error).message;
  }
  const alone = `${JSON.stringify(resultsFile([run], { kvgateVersion: o.kvgateVersion, created, simulated: o.simulated }), null, 2)}\n`;
  for (const fallback of [besidePath(path, now), join(tmpdir(), basename(besidePath(path, now)))]) {
    try {
      writeFileSync(fallback, alone, { flag: "wx" });
      return {
        path: fallback,
        problem: `could not write ${path} (${problem}); the run was written to ${fallback}`,
      };
    } catch (e) {
      problem += `; ${fallback}: ${(e as Error).message}`;
    }
  }
  throw new Error(`could not write the run anywhere (${problem})`);
}
