/**
 * The `kvgate report` page in a real headless Chromium: a screenshot must be a valid, non-trivial
 * PNG in which the charts' bars are drawn in the runs' colours. Needs Debian's `chromium` at
 * /usr/bin/chromium (or the path in $CHROMIUM); `.ci/run` installs it. Without it the test is
 * skipped on a developer machine and FAILS in CI (CI=true), so CI never passes without running it.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { inflateSync } from "node:zlib";
import { PALETTE } from "../src/bench/report/model.ts";
import { parseInput, renderReport } from "../src/bench/report/report.ts";
import { sweepFile } from "./helpers/report-fixtures.ts";

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const missing = existsSync(CHROMIUM)
  ? undefined
  : `${CHROMIUM} not found (apt-get install -y --no-install-recommends chromium, or run .ci/run)`;
const skip = missing !== undefined && process.env.CI !== "true" ? missing : false;

interface Image {
  width: number;
  height: number;
  /** RGB per pixel. */
  rgb: Uint8Array;
}

/** Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes). */
function decodePng(buf: Buffer): Image {
  assert.ok(buf.subarray(0, 8).equals(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10])), "PNG signature");
  let width = 0;
  let height = 0;
  let channels = 0;
  const idat: Buffer[] = [];
  for (let off = 8; off < buf.length; ) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString("latin1", off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === "IHDR") {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      assert.equal(data[8], 8, "bit depth 8");
      assert.equal(data[12], 0, "not interlaced");
      channels = { 2: 3, 6: 4 }[data[9]] ?? 0;
      assert.ok(channels, `colour type ${data[9]}`);
    } else if (type === "IDAT") idat.push(data);
    off += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  const cur = new Uint8Array(stride);
  const prev = new Uint8Array(stride);
  const rgb = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? cur[i - channels] : 0;
      const b = prev[i];
      const c = i >= channels ? prev[i - channels] : 0;
      const pa = Math.abs(b - c);
      const pb = Math.abs(a - c);
      const pc = Math.abs(a + b - 2 * c);
      const pred = [0, a, b, (a + b) >> 1, pa <= pb && pa <= pc ? a : pb <= pc ? b : c][filter];
      cur[i] = (line[i] + pred) & 0xff;
    }
    for (let x = 0; x < width; x++)
      rgb.set(cur.subarray(x * channels, x * channels + 3), (y * width + x) * 3);
    prev.set(cur);
  }
  return { width, height, rgb };
}

/** Pixels within ±tol of `hex` on each channel. */
function countColour(img: Image, hex: string, tol = 8): number {
  const [r, g, b] = [1, 3, 5].map((i) => Number.parseInt(hex.slice(i, i + 2), 16));
  let n = 0;
  for (let i = 0; i < img.rgb.length; i += 3)
    if (
      Math.abs(img.rgb[i] - r) <= tol &&
      Math.abs(img.rgb[i + 1] - g) <= tol &&
      Math.abs(img.rgb[i + 2] - b) <= tol
    )
      n++;
  return n;
}

test("headless Chromium renders the report with its charts", { skip, timeout: 90_000 }, async (t) => {
  if (missing !== undefined) assert.fail(`${missing}; CI=true, so this test fails instead of skipping`);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-report-shot-"));
  const profile = mkdtempSync(join(tmpdir(), "kvgate-chromium-"));
  t.after(() => {
    rmSync(dir, { recursive: true, force: true });
    rmSync(profile, { recursive: true, force: true });
  });
  const page = join(dir, "report.html");
  const png = join(dir, "report.png");
  writeFileSync(page, renderReport([parseInput("sweep.json", JSON.stringify(sweepFile()))]).html);
  const args = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    `--user-data-dir=${profile}`, // a fresh, empty profile
    "--window-size=1300,2400",
    `--screenshot=${png}`,
    `file://${page}`,
  ];
  await new Promise<void>((resolve, reject) =>
    execFile(CHROMIUM, args, { timeout: 60_000 }, (err, _out, stderr) =>
      err ? reject(new Error(`chromium failed: ${err.message}\n${stderr}`)) : resolve(),
    ),
  );
  const buf = readFileSync(png);
  assert.ok(buf.length > 30_000, `screenshot is only ${buf.length} bytes`);
  const img = decodePng(buf);
  assert.equal(img.width, 1300);
  assert.equal(img.height, 2400);
  // The per-replica bar charts fill large areas in the first two runs' colours.
  const rr = countColour(img, PALETTE[0]);
  const kv = countColour(img, PALETTE[1]);
  assert.ok(rr > 5_000, `round-robin colour: ${rr} pixels`);
  assert.ok(kv > 5_000, `kvgate colour: ${kv} pixels`);
  // Dark text is drawn (headings, tables, axis labels) on the light page.
  assert.ok(countColour(img, "#1d1f24", 40) > 5_000, "text pixels");
});
