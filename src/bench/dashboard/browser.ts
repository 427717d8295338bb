/**
 * Opens a page in Debian's headless Chromium (/usr/bin/chromium, or $CHROMIUM) through
 * playwright-core's `executablePath` — no browser download. Used by the dashboard's browser test
 * and `npm run screenshot:dashboard`; playwright-core is a dev dependency, loaded only here.
 */
import { existsSync } from "node:fs";
import type { Browser, Page } from "playwright-core";

export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

/** Why a browser cannot be started here, or undefined when it can. */
export function chromiumMissing(): string | undefined {
  return existsSync(CHROMIUM)
    ? undefined
    : `${CHROMIUM} not found (apt-get install -y --no-install-recommends chromium, or set $CHROMIUM)`;
}

export interface OpenedPage {
  browser: Browser;
  page: Page;
  /** Every URL the page requested, in order. */
  requests: string[];
  close(): Promise<void>;
}

export async function openPage(url: string, viewport = { width: 1280, height: 800 }): Promise<OpenedPage> {
  const { chromium } = await import("playwright-core");
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
  });
  try {
    // bypassCSP: the dashboard forbids eval, which playwright needs for string expressions.
    const page = await browser.newPage({ viewport, bypassCSP: true });
    const requests: string[] = [];
    page.on("request", (r) => requests.push(r.url()));
    await page.goto(url);
    return { browser, page, requests, close: () => browser.close() };
  } catch (err) {
    await browser.close();
    throw err;
  }
}
