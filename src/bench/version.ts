/** kvgate's own version (package.json), recorded in every results file. */
import { readFileSync } from "node:fs";

function readVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
    return String(pkg.version);
  } catch {
    return "unknown";
  }
}

export const KVGATE_VERSION = readVersion();
