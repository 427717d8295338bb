/**
 * npm run screenshot:dashboard — docs/dashboard.png: the admin dashboard of a live simulated fleet
 * (6 replicas at 20× real time, flow control on with a tight concurrency limit so requests queue by
 * tenant and the sheddable band is shed), taken in headless Chromium after ~`--seconds` of load.
 *
 *   npm run screenshot:dashboard -- [--seconds 45] [--users 60] [--out docs/dashboard.png]
 */
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { parseBenchArgs } from "../cli-args.ts";
import { chromiumMissing, openPage } from "./browser.ts";
import { startDashboardFleet } from "./fleet.ts";

const USAGE = "usage: npm run screenshot:dashboard -- [--seconds 45] [--users 60] [--out docs/dashboard.png]";

const { values: args } = parseBenchArgs("screenshot:dashboard", USAGE, {
  options: {
    seconds: { type: "string", default: "45" },
    users: { type: "string", default: "60" },
    out: { type: "string", default: "docs/dashboard.png" },
  },
});

const missing = chromiumMissing();
if (missing) {
  console.error(`screenshot:dashboard: ${missing}`);
  process.exit(1);
}
const config = readFileSync(new URL("../../../config/examples/flow-control.yaml", import.meta.url), "utf8")
  .replace("maxConcurrency: 100", "maxConcurrency: 6")
  .replace('maxRequests: "20"', 'maxRequests: "4"');
const fleet = await startDashboardFleet({
  replicas: 6,
  gateway: { config },
  tenants: ["tenant-a", "tenant-b", "tenant-c"],
  objectives: ["standard", "standard", "critical", "sheddable"],
});
try {
  const seconds = Number(args.seconds);
  const users = Number(args.users);
  // A ramp: a third of the users, then all of them, so the charts show the load changing.
  fleet.setUsers(Math.ceil(users / 3));
  await new Promise((r) => setTimeout(r, (seconds * 1000) / 2));
  fleet.setUsers(users);
  await new Promise((r) => setTimeout(r, (seconds * 1000) / 2));
  const opened = await openPage(fleet.gateway.adminUrl, { width: 1280, height: 800 });
  try {
    await opened.page.waitForSelector("tr[data-replica]");
    await opened.page.waitForTimeout(1500);
    const out = resolve(args.out);
    await opened.page.screenshot({ path: out, fullPage: true });
    console.log(
      `screenshot:dashboard: wrote ${args.out} (${fleet.counts.ok} requests answered, ${fleet.counts.failed} not)`,
    );
  } finally {
    await opened.close();
  }
} finally {
  fleet.setUsers(0);
  await fleet.close();
}
