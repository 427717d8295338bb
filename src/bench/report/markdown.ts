/**
 * The Markdown twin of the `kvgate report` page: the same tables (summary per file, load points,
 * per-replica figures, latency percentiles) as GitHub-flavoured Markdown, without charts. Text from
 * results files is escaped so a router name cannot add markup or break a table. Pure.
 */
import type { ReportModel } from "./model.ts";
import { latencyTable, loadTable, replicaTable, summaryTable, type Table } from "./tables.ts";

/** Backslash-escapes Markdown punctuation that could add markup (incl. | and <) and flattens newlines. */
export const escapeMarkdown = (s: string): string =>
  s.replace(/\r?\n|\r/g, " ").replace(/[\\`*_[\]<>|&~]/g, "\\$&");

export function tableMarkdown(t: Table): string {
  const row = (cells: string[]) => `| ${cells.join(" | ")} |`;
  return [
    row(t.header.map(escapeMarkdown)),
    row(t.numeric.map((n) => (n ? "---:" : "---"))),
    ...t.rows.map((r) => row(r.map(escapeMarkdown))),
  ].join("\n");
}

export function renderMarkdown(m: ReportModel, o: { title: string }): string {
  const out: string[] = [`# ${escapeMarkdown(o.title)}`, ""];
  if (m.simulated === "all")
    out.push("**Simulated figures**: times and rates are in simulated seconds, not wall-clock time.");
  else if (m.simulated === "none") out.push("Measured figures: times and rates are in real seconds.");
  else
    out.push(
      `**Mixed**: ${m.files
        .filter((f) => f.simulated)
        .map((f) => escapeMarkdown(f.name))
        .join(", ")}: simulated figures (simulated seconds); the other files: real seconds.`,
    );
  out.push("", "## Summary");
  for (const f of m.files) {
    out.push(
      "",
      `### ${escapeMarkdown(f.name)}`,
      "",
      `${f.simulated ? "Simulated" : "Real"}; times in ${f.simulated ? "simulated " : ""}seconds; kvgate ${escapeMarkdown(f.version)}, created ${escapeMarkdown(f.created)}.`,
      "",
      tableMarkdown(summaryTable(f)),
    );
  }
  const load = loadTable(m.runs);
  if (load.rows.length)
    out.push(
      "",
      "## Throughput and TTFT p90 by offered load",
      "",
      "Warm-up stages left out; a run without a sweep is one row with its own figures (the summary's). req/s: completed requests per second over the window; a closed loop offers no rate.",
      "",
      tableMarkdown(load),
    );
  const replicas = replicaTable(m.runs);
  if (replicas.rows.length) out.push("", "## Per-replica KV cache", "", tableMarkdown(replicas));
  out.push("", "## Latency percentiles", "", tableMarkdown(latencyTable(m.runs)), "");
  return out.join("\n");
}
