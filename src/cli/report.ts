/**
 * `kvgate report FILE...`: turns results files from `kvgate bench`, `simulate` or `demo` into one
 * self-contained HTML page (charts as inline SVG) and a Markdown copy of its tables (to --markdown,
 * else stdout). A missing or invalid file is named in the error and exits 1.
 */
import { writeFileSync } from "node:fs";
import type { Command } from "commander";
import { DEFAULT_TITLE, loadInputs, renderReport } from "../bench/report/report.ts";

interface Flags {
  out: string;
  markdown?: string;
  title: string;
}

export function registerReport(program: Command): Command {
  return program
    .command("report")
    .description("Render results files as one self-contained HTML page with charts, plus Markdown tables.")
    .argument("<files...>", "results JSON files (kvgate bench --json, simulate, demo --json)")
    .option("--out <file.html>", "HTML page to write", "report.html")
    .option("--markdown <file.md>", "write the Markdown tables here (default: print them to stdout)")
    .option("--title <text>", "page title", DEFAULT_TITLE)
    .action((files: string[], f: Flags) => {
      let report: ReturnType<typeof renderReport>;
      try {
        report = renderReport(loadInputs(files), { title: f.title });
      } catch (e) {
        console.error(`kvgate report: ${(e as Error).message}`);
        process.exitCode = 1;
        return;
      }
      writeFileSync(f.out, report.html);
      console.error(`report written to ${f.out}`);
      if (f.markdown) {
        writeFileSync(f.markdown, report.markdown);
        console.error(`markdown written to ${f.markdown}`);
      } else process.stdout.write(report.markdown);
    });
}
