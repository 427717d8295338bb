/**
 * `kvgate report` as a user runs it (spawned through bin/kvgate): writes the HTML page and the
 * Markdown file, prints the Markdown when --markdown is absent, and a bad file exits 1 naming it
 * without writing anything.
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { runKvgate } from "./helpers/replica.ts";
import { file, run, sweepFile } from "./helpers/report-fixtures.ts";

function setup() {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-report-cli-"));
  writeFileSync(join(dir, "sweep.json"), JSON.stringify(sweepFile()));
  writeFileSync(join(dir, "real.json"), JSON.stringify(file([run({ router: "vllm" })], false)));
  return dir;
}

test("kvgate report writes the page and the Markdown", async () => {
  const dir = setup();
  const r = await runKvgate(
    ["report", "sweep.json", "real.json", "--out", "r.html", "--markdown", "r.md", "--title", "Sweep"],
    { cwd: dir },
  );
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, "");
  assert.match(r.stderr, /report written to r\.html/);
  const html = readFileSync(join(dir, "r.html"), "utf8");
  assert.match(html, /<title>Sweep<\/title>/);
  assert.match(html, /<h3>sweep\.json<\/h3>/);
  assert.match(html, /<h3>real\.json<\/h3>/);
  assert.equal(html.split("<svg").length - 1, 6);
  const md = readFileSync(join(dir, "r.md"), "utf8");
  assert.match(md, /^# Sweep\n/);
  assert.match(md, /\n\| vllm \| 1200 \| 0 \| 20\.00 \| 1234 \|/);
});

test("without --markdown the tables go to stdout; --out defaults to report.html", async () => {
  const dir = setup();
  const r = await runKvgate(["report", "real.json"], { cwd: dir });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^# kvgate benchmark report\n/);
  assert.match(r.stdout, /Measured figures/);
  assert.ok(existsSync(join(dir, "report.html")));
});

test("a bad file exits 1 naming it and writes nothing", async () => {
  const dir = setup();
  writeFileSync(join(dir, "bad.json"), JSON.stringify({ ...sweepFile(), time_unit: "minutes" }));
  const r = await runKvgate(["report", "sweep.json", "bad.json", "--out", "r.html"], { cwd: dir });
  assert.equal(r.code, 1);
  assert.match(r.stderr, /kvgate report: bad\.json: results file: time_unit:/);
  assert.ok(!existsSync(join(dir, "r.html")));
  const none = await runKvgate(["report"], { cwd: dir });
  assert.equal(none.code, 2);
  assert.match(none.stderr, /missing required argument 'files'/);
});
