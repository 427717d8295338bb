/**
 * The HTML page of `kvgate report`: one self-contained file with inline CSS and inline SVG charts,
 * no scripts and no URLs (a Content-Security-Policy forbids fetching anything when viewed). All
 * text from the results files (router names, file names, addresses) is escaped. Pure.
 */
import { barChart, type LineSeries, lineChart } from "./charts.ts";
import { type Cdf, loadX, offeredText, type ReportModel, type RunView, unitWords } from "./model.ts";
import { latencyTable, loadTable, replicaTable, summaryTable, type Table } from "./tables.ts";

export interface HtmlOptions {
  title: string;
  /** What made the page, for the footer (default "kvgate report"). */
  madeBy?: string;
  /** Shown in the footer. */
  version: string;
}

/** Escapes text for HTML element content and double-quoted attributes. */
export const escapeHtml = (s: string): string =>
  s
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;")
    .replace(/'/g, "&#39;");

export function tableHtml(t: Table, cls = ""): string {
  const cell = (tag: string, i: number, v: string) =>
    `<${tag}${t.numeric[i] ? ' class="num"' : ""}>${escapeHtml(v)}</${tag}>`;
  const head = `<tr>${t.header.map((h, i) => cell("th", i, h)).join("")}</tr>`;
  const body = t.rows.map((r) => `<tr>${r.map((v, i) => cell("td", i, v)).join("")}</tr>`).join("\n");
  return `<div class="scroll"><table${cls ? ` class="${cls}"` : ""}>\n<thead>${head}</thead>\n<tbody>\n${body}\n</tbody>\n</table></div>`;
}

/** Seconds on a bar: three significant digits ("0.161 s", "21.9 s"). */
const secondsLabel = (x: number): string => `${+x.toPrecision(3)} s`;

const figure = (title: string, svg: string, note?: string) =>
  `<figure><figcaption>${escapeHtml(title)}</figcaption>${svg}${note ? `<p class="note">${escapeHtml(note)}</p>` : ""}</figure>`;

const details = (summary: string, body: string) =>
  `<details><summary>${escapeHtml(summary)}</summary>${body}</details>`;

const p = (text: string, cls = "note") => `<p class="${cls}">${escapeHtml(text)}</p>`;

function banner(m: ReportModel): string {
  if (m.simulated === "all")
    return p(
      "Simulated figures: every run here ran against simulated replicas; times and rates are in simulated seconds, not wall-clock time.",
      "banner sim",
    );
  if (m.simulated === "none")
    return p("Measured figures: times and rates are in real (wall-clock) seconds.", "banner real");
  const sims = m.files.filter((f) => f.simulated).map((f) => f.name);
  return p(
    `Mixed: ${sims.join(", ")} ${sims.length === 1 ? "holds" : "hold"} simulated figures (simulated seconds); the other files hold real seconds. Do not compare them directly.`,
    "banner mixed",
  );
}

function filesTable(m: ReportModel): Table {
  return {
    header: ["file", "kvgate", "created", "figures", "runs"],
    numeric: [false, false, false, false, true],
    rows: m.files.map((f) => [
      f.name,
      f.version,
      f.created,
      f.simulated ? "simulated (simulated seconds)" : "real (seconds)",
      String(f.runs.length),
    ]),
  };
}

function loadSection(m: ReportModel): string {
  const u = unitWords(m);
  const runs = m.runs.filter((r) => r.load.length);
  if (!runs.length) return `<h2>Load</h2>${p("No run has a usable rate (no successful request).")}`;
  let charts: string;
  if (m.loadLines) {
    const series = (y: (pt: RunView["load"][number]) => number | null): LineSeries[] =>
      runs.map((r) => ({
        name: r.label,
        color: r.color,
        points: r.load.flatMap((pt) => {
          const v = y(pt);
          const x = loadX(pt);
          return v === null || x === null ? [] : [[x, v] as [number, number]];
        }),
      }));
    const note =
      "One point per measured stage at its offered rate (warm-up stages left out); a run without a sweep is one point with its own figures, at its arrival rate (a closed loop, which offers no rate, at its req/s).";
    charts =
      figure(
        "Output throughput against offered load",
        lineChart({
          title: "Output tokens/s against offered QPS",
          xName: `offered QPS (${u.rate})`,
          yName: "output tokens/s",
          series: series((pt) => pt.outputTokensPerS),
          yMin: 0,
        }),
        note,
      ) +
      figure(
        "TTFT p90 against offered load",
        lineChart({
          title: "TTFT p90 against offered QPS",
          xName: `offered QPS (${u.rate})`,
          yName: `TTFT p90 (${u.seconds})`,
          series: series((pt) => pt.ttftP90S),
          yMin: 0,
        }),
        note,
      );
  } else {
    const bar = (
      title: string,
      yName: string,
      v: (r: RunView) => number | null,
      label: (x: number) => string,
    ) =>
      barChart({
        title,
        categories: runs.map((r) => r.label),
        yName,
        series: [{ name: yName, color: runs[0].color, values: runs.map(v) }],
        colorByCategory: runs.map((r) => r.color),
        valueLabel: label,
        logWhenSpread: 20,
      });
    const note = `No run has more than one measured stage, so there is no load sweep: one bar per run with its own figures (the summary's), each bar labelled with its value; offered load: ${runs
      .map((r) => `${r.label}: ${offeredText(r.load[0])}`)
      .join(", ")}.`;
    charts =
      figure(
        "Output throughput per run",
        bar(
          "Output tokens/s per run",
          "output tokens/s",
          (r) => r.load[0].outputTokensPerS,
          (x) => x.toFixed(0),
        ),
        note,
      ) +
      figure(
        "TTFT p90 per run",
        bar("TTFT p90 per run", `TTFT p90 (${u.seconds})`, (r) => r.load[0].ttftP90S, secondsLabel),
        note,
      );
  }
  return `<h2>Throughput and TTFT against load</h2><div class="grid">${charts}</div>${details("Figures behind these charts", tableHtml(loadTable(runs)))}`;
}

function fleetSection(m: ReportModel): string {
  const runs = m.runs.filter((r) => r.replicas.length);
  const head = "<h2>Per-replica KV cache</h2>";
  if (!runs.length)
    return head + p("No run carries per-replica figures (they come from scraping the replicas' /metrics).");
  const categories = Array.from({ length: m.replicaCount }, (_, i) => String(i + 1));
  const values = (r: RunView, v: (e: RunView["replicas"][number]) => number | null) =>
    categories.map((_, i) => (r.replicas[i] ? v(r.replicas[i]) : null));
  const chart = (title: string, v: (e: RunView["replicas"][number]) => number | null) =>
    barChart({
      title,
      categories,
      xName: "replica",
      yName: "percent",
      yMax: 100,
      series: runs.map((r) => ({
        name: r.label,
        color: r.color,
        values: values(r, (e) => {
          const x = v(e);
          return x === null ? null : +(x * 100).toFixed(2);
        }),
      })),
    });
  const note = "Replicas are numbered in the order each run lists them; addresses are in the table below.";
  return (
    head +
    `<div class="grid">${figure(
      "KV-cache usage per replica (mean over the run, %)",
      chart("KV-cache usage per replica", (e) => e.kvUsageMean),
      note,
    )}` +
    `${figure(
      "Prefix-cache hit rate per replica (%)",
      chart("Prefix-cache hit rate per replica", (e) => e.hitRate),
      note,
    )}</div>` +
    details("Per-replica figures", tableHtml(replicaTable(runs)))
  );
}

function cdfSection(m: ReportModel): string {
  const u = unitWords(m);
  const chart = (title: string, key: "ttftCdf" | "e2eCdf", xName: string) => {
    const runs = m.runs.filter((r) => r[key]);
    const approx = runs.filter((r) => !(r[key] as Cdf).exact).map((r) => r.label);
    const note = approx.length
      ? `Drawn from p50, p90 and p99 only (straight lines between them) for: ${approx.join(", ")}; those runs carry no finer CDF.`
      : "Drawn from each run's own quantiles.";
    if (!runs.length) return figure(title, "", "No run has latency figures.");
    return figure(
      title,
      lineChart({
        title,
        xName,
        yName: "fraction of requests",
        yPercent: true,
        yMin: 0,
        yMax: 1,
        series: runs.map((r) => ({ name: r.label, color: r.color, points: (r[key] as Cdf).points })),
      }),
      note,
    );
  };
  return (
    "<h2>Latency CDFs</h2>" +
    `<div class="grid">${chart("TTFT CDF", "ttftCdf", `TTFT (${u.seconds})`)}${chart("E2E latency CDF", "e2eCdf", `E2E latency (${u.seconds})`)}</div>` +
    details("Latency percentiles", tableHtml(latencyTable(m.runs)))
  );
}

const CSS = `
*{box-sizing:border-box}
body{margin:0;background:#f5f6f8;color:#1d1f24;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:24px;margin:4px 0 10px}h2{font-size:18px;margin:28px 0 10px;border-bottom:1px solid #d9dce3;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px;overflow-wrap:anywhere}
.banner{padding:8px 12px;border-radius:6px;font-weight:600;margin:8px 0}
.sim{background:#fff4d6;border:1px solid #e8c766}.real{background:#e3f1e6;border:1px solid #8fc79b}.mixed{background:#fde2e1;border:1px solid #e59a96}
.note{color:#555;font-size:12.5px;margin:6px 2px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;background:#fff;margin:4px 0 8px;font-size:12.5px}
th,td{border:1px solid #dcdfe6;padding:4px 7px;text-align:left;white-space:nowrap}
th{white-space:normal;vertical-align:bottom;min-width:4.5em}
th{background:#eef0f4;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td:first-child{white-space:normal;overflow-wrap:anywhere;min-width:8em;max-width:260px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #dcdfe6;border-radius:6px;padding:10px 12px}
figcaption{font-weight:600;margin-bottom:4px}
figure svg{display:block;width:100%;height:auto}
details{margin:10px 0}summary{cursor:pointer;color:#334}
footer{margin-top:30px;color:#666;font-size:12px}
`;

/** The whole page. */
export function renderHtml(m: ReportModel, o: HtmlOptions): string {
  const summaries = m.files
    .map(
      (f) =>
        `<h3>${escapeHtml(f.name)}</h3>${p(f.simulated ? "Times in simulated seconds." : "Times in seconds.")}${tableHtml(summaryTable(f), "summary")}`,
    )
    .join("\n");
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(o.title)}</title>
<style>${CSS}</style>
</head>
<body>
<main>
<header><h1>${escapeHtml(o.title)}</h1>
${banner(m)}
${tableHtml(filesTable(m))}</header>
<h2>Summary</h2>
${summaries}
${loadSection(m)}
${fleetSection(m)}
${cdfSection(m)}
<footer>${escapeHtml(`Made by ${o.madeBy ?? "kvgate report"} ${o.version} from ${m.files.length} results file${m.files.length === 1 ? ` (${m.files[0].name})` : "s"}. Self-contained: no scripts, fonts or other resources are loaded.`)}</footer>
</main>
</body>
</html>
`;
}
