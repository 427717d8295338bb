/**
 * parseArgs for the bench entry scripts: an unknown or malformed flag prints one line naming the
 * script and the problem, then the script's usage, on stderr and exits 2, instead of node:util's
 * stack trace. The result is parseArgs' own, typed from the config.
 */
import { type ParseArgsConfig, parseArgs } from "node:util";

export function parseBenchArgs<T extends ParseArgsConfig>(
  name: string,
  usage: string,
  config: T,
): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    if (typeof code !== "string" || !code.startsWith("ERR_PARSE_ARGS")) throw err;
    process.stderr.write(`${name}: ${(err as Error).message}\n\n${usage.trimEnd()}\n`);
    process.exit(2);
  }
}
