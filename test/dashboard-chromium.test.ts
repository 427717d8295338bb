/**
 * The admin dashboard (GET / on the admin port) in a real headless Chromium, driven by playwright-core
 * with Debian's chromium: in front of three simulated replicas it shows a row for every replica, makes
 * no request outside the admin port, and its numbers move when load starts and stops. Needs
 * /usr/bin/chromium (or $CHROMIUM); skipped on a developer machine without it, FAILS in CI (CI=true).
 * Page-side expressions are strings (the test is compiled without the DOM library).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { chromiumMissing, openPage } from "../src/bench/dashboard/browser.ts";
import { startDashboardFleet } from "../src/bench/dashboard/fleet.ts";

const missing = chromiumMissing();
const skip = missing !== undefined && process.env.CI !== "true" ? missing : false;

const ROWS = `[...document.querySelectorAll("tr[data-replica]")].map((r) => r.getAttribute("data-replica"))`;
const cells = (field: string) =>
  `[...document.querySelectorAll('td[data-field="${field}"]')].map((c) => Number(c.textContent.replace(/,/g, "")))`;
const PICKS = `${cells("total")}.reduce((a, b) => a + b, 0)`;
const text = (id: string) => `document.getElementById("${id}").textContent`;

test("the dashboard shows every replica and updates live as load starts and stops", {
  skip,
  timeout: 120_000,
}, async (t) => {
  if (missing !== undefined) assert.fail(`${missing}; CI=true, so this test fails instead of skipping`);
  const fleet = await startDashboardFleet({ replicas: 3 });
  t.after(() => fleet.close());
  const ids = fleet.replicas.map((r) => `127.0.0.1:${r.port}`).sort();
  const opened = await openPage(fleet.gateway.adminUrl);
  t.after(() => opened.close());
  const { page } = opened;
  const wait = (expr: string, timeout = 30_000) => page.waitForFunction(expr, null, { timeout });

  await wait(`${ROWS}.length === 3`, 20_000);
  assert.deepEqual(((await page.evaluate(ROWS)) as string[]).sort(), ids);
  await wait(`${text("live")} === "live"`, 10_000);
  assert.equal(await page.evaluate(PICKS), 0, "no request was sent yet");

  fleet.setUsers(12);
  // Requests in flight and picks appear without a reload, and a replica reports running work.
  await wait(`Number(${text("k-inflight")}) > 0 && ${cells("running")}.some((r) => r > 0)`);
  await wait(`${PICKS} >= 10`);
  const shownPicks = (await page.evaluate(PICKS)) as number;
  const sent = ids.reduce((a, id) => a + fleet.gateway.gateway.traffic.get(id).requests, 0);
  assert.ok(
    shownPicks >= 10 && shownPicks <= sent,
    `page shows ${shownPicks} picks, the gateway sent ${sent}`,
  );
  // The streamed requests' TTFT reaches the page.
  await wait(`/\\d/.test(${text("k-ttft")})`, 20_000);

  fleet.setUsers(0);
  await wait(`${text("k-inflight")} === "0"`);
  assert.equal(fleet.counts.failed, 0);
  const foreign = opened.requests.filter((u) => !u.startsWith(fleet.gateway.adminUrl));
  assert.deepEqual(foreign, [], "the page fetches nothing outside the admin port");
});
