/**
 * `kvgate report` rendering: the summary table's rows and formatted figures, one inline SVG per
 * chart, escaping of user text in HTML and Markdown, no external references, merging several
 * files, warm-up stages left out of the load charts, CDF data, and errors naming the bad file.
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { ms } from "../src/bench/report/figures.ts";
import { buildModel } from "../src/bench/report/model.ts";
import { loadInputs, parseInput, renderReport } from "../src/bench/report/report.ts";
import type { ResultsFile } from "../src/bench/results.ts";
import { file, run, sweepFile } from "./helpers/report-fixtures.ts";

/** Round-trips through JSON and the schema, as the CLI does. */
const input = (name: string, f: ResultsFile) => parseInput(name, JSON.stringify(f));

const unescapeHtml = (s: string) =>
  s
    .replace(/&lt;/g, "<")
    .replace(/&gt;/g, ">")
    .replace(/&quot;/g, '"')
    .replace(/&#39;/g, "'")
    .replace(/&amp;/g, "&");

/** The rows (cells, unescaped) of each HTML table with `class="cls"`. */
function htmlTables(html: string, cls: string): string[][][] {
  return html
    .split(`<table class="${cls}">`)
    .slice(1)
    .map((t) =>
      [...t.slice(0, t.indexOf("</table>")).matchAll(/<tr>(.*?)<\/tr>/g)].map((r) =>
        [...r[1].matchAll(/<t[hd][^>]*>(.*?)<\/t[hd]>/g)].map((c) => unescapeHtml(c[1])),
      ),
    );
}

/** The Markdown table rows that follow the heading line `heading`. */
function mdTable(md: string, heading: string): string[][] {
  const lines = md.split("\n");
  let i = lines.indexOf(heading);
  assert.ok(i >= 0, `no heading ${heading}`);
  while (!lines[i].startsWith("|")) i++;
  const rows: string[][] = [];
  for (; lines[i]?.startsWith("|"); i++)
    rows.push(
      lines[i]
        .slice(2, -2)
        .split(/(?<!\\) \| /)
        .map((c) => c.trim()),
    );
  return rows;
}

const SUMMARY_HEADER = [
  "router",
  "requests",
  "errors",
  "req/s",
  "output tok/s",
  "total tok/s",
  "TTFT p50 (ms)",
  "TTFT p90 (ms)",
  "TTFT p99 (ms)",
  "TPOT p50 (ms)",
  "E2E p50 (s)",
  "prefix-cache hit rate",
  "KV usage mean",
  "KV usage peak",
  "preemptions",
];
// sweepFile()'s kvgate run: 1200 requests over 60 s, 1150 out tok/s, 7000 prompt tokens each.
const KVGATE_ROW = ["kvgate", "1200", "0", "20.00", "1150", "141150", "120", "450", "1100", "20", "3.10"];

test("the HTML has one summary row per router with its figures formatted", () => {
  const { html } = renderReport([input("sweep.json", sweepFile())]);
  const [summary] = htmlTables(html, "summary");
  assert.deepEqual(summary[0], SUMMARY_HEADER);
  assert.deepEqual(
    summary.slice(1).map((r) => r[0]),
    ["round-robin", "kvgate"],
  );
  assert.deepEqual(summary[2], [...KVGATE_ROW, "86.0%", "55.0%", "97.0%", "3"]);
  assert.equal(summary[1][6], "600");
  assert.match(html, /Simulated figures: .*simulated seconds/);
});

test("one inline SVG per chart: load lines, per-replica bars, latency CDFs", () => {
  const { html } = renderReport([input("sweep.json", sweepFile())]);
  const figures = html.split("<figure>").slice(1);
  assert.equal(figures.length, 6);
  for (const f of figures) assert.equal(f.split("<svg").length - 1, 1, f.slice(0, 80));
  assert.equal(html.split("<svg").length - 1, 6);
  assert.match(figures[0], /Output throughput against offered load/);
  assert.match(figures[0], /<text[^>]*>kvgate<\/text>/);
  assert.match(figures[2], /KV-cache usage per replica/);
  assert.match(figures[4], /TTFT CDF/);
  assert.match(figures[4], /from p50, p90 and p99 only/);
});

test("warm-up stages are left out of the load points, which sort by offered rate", () => {
  const { markdown } = renderReport([input("sweep.json", sweepFile())]);
  const rows = mdTable(markdown, "## Throughput and TTFT p90 by offered load");
  assert.deepEqual(rows[0], ["run", "stage", "offered req/s", "req/s", "output tok/s", "TTFT p90 (ms)"]);
  const kv = rows.filter((r) => r[0] === "kvgate");
  assert.deepEqual(
    kv.map((r) => r[1]),
    ["1", "2", "3", "4", "5"],
  );
  assert.deepEqual(kv[0], ["kvgate", "1", "4.00", "4.00", "256", "227"]);
});

test("router names are escaped in HTML and Markdown", () => {
  const f = file([run({ router: "<b>x</b>" }), run({ router: "a|b & 'c'" })]);
  const { html, markdown } = renderReport([input("evil<i>.json", f)], { title: "<script>t</script>" });
  assert.ok(!html.includes("<b>x</b>"));
  assert.doesNotMatch(html, /<script/);
  assert.match(html, /<title>&lt;script&gt;t&lt;\/script&gt;<\/title>/);
  assert.ok(!html.includes("<i>"));
  assert.ok(html.includes("<td>&lt;b&gt;x&lt;/b&gt;</td>"));
  assert.ok(html.includes("a|b &amp; &#39;c&#39;"));
  assert.ok(markdown.includes("| \\<b\\>x\\</b\\> | 1200 |"));
  const rows = mdTable(markdown, "### evil\\<i\\>.json");
  assert.ok(
    rows.every((r) => r.length === 12),
    "a | in a name must not add a column",
  );
  assert.equal(rows[3][0], "a\\|b \\& 'c'");
});

test("the page references nothing outside itself", () => {
  const f = file([run({ router: "a", replicas: [[0.5, 0.5]] })], false);
  const { html } = renderReport([input("a.json", sweepFile()), input("b.json", f)]);
  assert.doesNotMatch(html, /https?:|\/\/[a-z0-9]/i);
  assert.doesNotMatch(html, /<script|<link|<img|<iframe|<object|@import|\bsrc=|\bhref=/i);
  for (const m of html.matchAll(/url\(([^)]*)\)/g)) assert.match(m[1], /^#zr\d+-/);
  assert.match(html, /Content-Security-Policy" content="default-src 'none'/);
  // The replica address is shown without its scheme.
  assert.ok(html.includes("<td>127.0.0.1:8001</td>"));
});

test("the Markdown tables carry the same figures", () => {
  const { markdown } = renderReport([input("sweep.json", sweepFile())], { title: "T *1*" });
  assert.ok(markdown.startsWith("# T \\*1\\*\n"));
  const rows = mdTable(markdown, "### sweep.json");
  assert.deepEqual(rows[0], SUMMARY_HEADER);
  assert.deepEqual(rows[1], ["---", ...SUMMARY_HEADER.slice(1).map(() => "---:")]);
  assert.deepEqual(rows[3], [...KVGATE_ROW, "86.0%", "55.0%", "97.0%", "3"]);
  const replicas = mdTable(markdown, "## Per-replica KV cache");
  assert.deepEqual(replicas[2 + 4], ["kvgate", "1", "127.0.0.1:8001", "62.0%", "72.0%", "88.0%", "0"]);
  const lat = mdTable(markdown, "## Latency percentiles");
  assert.deepEqual(lat[3], ["kvgate", "120", "450", "1100", "3.10", "4.20", "6.30"]);
});

test("several files merge: a table each, runs told apart by file, mixed units flagged", () => {
  const a = file([run({ router: "kvgate", outTps: 900 }), run({ router: "round-robin" })], true);
  const b = file([run({ router: "kvgate", outTps: 1000 })], false);
  const inputs = [input("a.json", a), input("b.json", b)];
  const m = buildModel(inputs);
  assert.deepEqual(
    m.runs.map((r) => r.label),
    ["kvgate (a.json)", "round-robin", "kvgate (b.json)"],
  );
  assert.equal(new Set(m.runs.map((r) => r.color)).size, 3);
  const { html, markdown } = renderReport(inputs);
  const tables = htmlTables(html, "summary");
  assert.equal(tables.length, 2);
  assert.deepEqual(
    tables.map((t) => t.slice(1).map((r) => [r[0], r[4]])),
    [
      [
        ["kvgate", "900"],
        ["round-robin", "1234"],
      ],
      [["kvgate", "1000"]],
    ],
  );
  assert.match(html, /Mixed: a\.json holds simulated figures/);
  assert.match(markdown, /\*\*Mixed\*\*: a\.json: simulated/);
  // No stages anywhere: bars, one per run, plus the two CDFs; no fleet charts.
  assert.equal(html.split("<svg").length - 1, 4);
  assert.match(
    html,
    /No run has more than one measured stage.*offered load: kvgate \(a\.json\): 24\.00, round-robin: 24\.00, kvgate \(b\.json\): 24\.00\./,
  );
  assert.match(html, /No run carries per-replica figures/);
});

test("a run with no successful request shows dashes and draws no point", () => {
  const nulls = Object.fromEntries(
    ["ttft", "tpot", "itl", "e2e"].flatMap((k) =>
      ["mean", "p50", "p90", "p99"].map((q) => [`${k}_${q}_s`, null]),
    ),
  );
  const dead = run({
    router: "dead",
    errors: 1200,
    hitRate: null,
    extra: { ...nulls, requests_per_s: null, output_tokens_per_s: null, total_tokens_per_s: null },
  });
  const inputs = [input("d.json", file([dead, run({ router: "ok" })]))];
  const m = buildModel(inputs);
  assert.equal(m.runs[0].ttftCdf, null);
  assert.deepEqual(m.runs[0].load[0], {
    stage: null,
    offered: 24,
    offeredKind: "arrival",
    requestsPerS: null,
    outputTokensPerS: null,
    ttftP90S: null,
  });
  const { markdown } = renderReport(inputs);
  assert.deepEqual(mdTable(markdown, "### d.json")[2], [
    "dead",
    "1200",
    "1200",
    ...Array.from({ length: 9 }, () => "-"),
  ]);
});

test("a router twice in one file is numbered", () => {
  const m = buildModel([input("a.json", file([run({ router: "k" }), run({ router: "k" })]))]);
  assert.deepEqual(
    m.runs.map((r) => r.rowName),
    ["k #1", "k #2"],
  );
});

test("a run's own ttft_cdf is drawn as given; a malformed one is an error naming the file", () => {
  const cdf = [
    [0.9, 0.8],
    [0.1, 0.05],
    [0.5, 0.2],
  ];
  const m = buildModel([input("c.json", file([run({ router: "k", extra: { ttft_cdf: cdf } })]))]);
  assert.deepEqual(m.runs[0].ttftCdf, {
    points: [
      [0.05, 0.1],
      [0.2, 0.5],
      [0.8, 0.9],
    ],
    exact: true,
  });
  assert.deepEqual(m.runs[0].e2eCdf?.points, [
    [4.5, 0.5],
    [7.25, 0.9],
    [12, 0.99],
  ]);
  const { html } = renderReport([input("c.json", file([run({ router: "k", extra: { ttft_cdf: cdf } })]))]);
  assert.match(html, /Drawn from each run&#39;s own quantiles/);
  const bad = file([run({ router: "k" }), run({ router: "k", extra: { ttft_cdf: [[1.5, 1]] } })]);
  assert.throws(
    () => buildModel([input("bad.json", bad)]),
    /^ResultsFileError: bad\.json: results file: runs\.1\.ttft_cdf\.0\.0:/,
  );
});

test("a bad or missing file is an error naming it", () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-report-"));
  const good = join(dir, "good.json");
  const notJson = join(dir, "not-json.json");
  const noRouter = join(dir, "no-router.json");
  writeFileSync(good, JSON.stringify(sweepFile()));
  writeFileSync(notJson, "{ nope");
  const f = sweepFile() as { runs: Array<Record<string, unknown>> };
  delete f.runs[1]["router"];
  writeFileSync(noRouter, JSON.stringify(f));
  assert.equal(loadInputs([good]).length, 1);
  assert.throws(
    () => loadInputs([good, notJson]),
    (e: Error) => e.message.startsWith(`${notJson}: `),
  );
  assert.throws(
    () => loadInputs([noRouter, good]),
    (e: Error) => e.message.startsWith(`${noRouter}: results file: runs.1.router:`),
  );
  const missing = join(dir, "missing.json");
  assert.throws(() => loadInputs([missing]), new RegExp(`${missing}: cannot read \\(ENOENT\\)`));
  assert.throws(() => renderReport([]), /no results files/);
});

test("milliseconds keep a decimal below 10 ms", () => {
  assert.equal(ms(0.0042), "4.2");
  assert.equal(ms(0.0421), "42");
  assert.equal(ms(null), "-");
});
