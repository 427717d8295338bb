/**
 * `kvgate report` end to end, minus the command line: reads and validates results files (an error
 * names the file), and renders the HTML page and the Markdown tables from them.
 */
import { readFileSync } from "node:fs";
import { parseResultsFile, ResultsFileError } from "../results.ts";
import { KVGATE_VERSION } from "../version.ts";
import { renderHtml } from "./html.ts";
import { renderMarkdown } from "./markdown.ts";
import { buildModel, type ReportInput } from "./model.ts";

export const DEFAULT_TITLE = "kvgate benchmark report";

export interface Report {
  html: string;
  markdown: string;
}

/** Parses one results file's text; errors are prefixed with `name`. */
export function parseInput(name: string, text: string): ReportInput {
  try {
    return { name, file: parseResultsFile(text) };
  } catch (e) {
    throw new ResultsFileError(`${name}: ${(e as Error).message}`);
  }
}

/** Reads and validates each file; the first unreadable or invalid one throws, naming it. */
export function loadInputs(paths: readonly string[]): ReportInput[] {
  return paths.map((path) => {
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      throw new ResultsFileError(`${path}: cannot read${code ? ` (${code})` : ""}`);
    }
    return parseInput(path, text);
  });
}

/** Renders the report of already-parsed inputs. */
export function renderReport(
  inputs: readonly ReportInput[],
  opts: { title?: string; madeBy?: string } = {},
): Report {
  const model = buildModel(inputs);
  const title = opts.title ?? DEFAULT_TITLE;
  return {
    html: renderHtml(model, { title, version: KVGATE_VERSION, madeBy: opts.madeBy }),
    markdown: renderMarkdown(model, { title }),
  };
}
