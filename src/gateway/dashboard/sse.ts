/**
 * The dashboard's routes on the admin port: `GET /` (the page, page.ts) and `GET /dashboard/events`
 * (server-sent events: one `history` event with the samples kept so far, then one `sample` event a
 * second, sampler.ts). At most MAX_STREAMS pages stream at once; one more gets 503 in OpenAI's error
 * format, as every other admin error.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { GatewayError, sendError } from "../errors.ts";
import type { Gateway } from "../gateway.ts";
import { dashboardPage } from "./page.ts";
import { dashboardSamplerOf } from "./sampler.ts";

export const MAX_STREAMS = 32;
const MAX_BUFFERED_BYTES = 4 * 1024 * 1024;

export function serveDashboardPage(res: ServerResponse): void {
  const html = dashboardPage();
  res
    .writeHead(200, {
      "content-type": "text/html; charset=utf-8",
      "content-length": Buffer.byteLength(html),
      "cache-control": "no-store",
      // Self-contained: the page may talk to this admin port only.
      "content-security-policy":
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
    })
    .end(html);
}

export function serveDashboardEvents(gw: Gateway, req: IncomingMessage, res: ServerResponse): void {
  const sampler = dashboardSamplerOf(gw);
  if (sampler.listeners >= MAX_STREAMS) {
    req.resume();
    sendError(
      res,
      new GatewayError(
        503,
        `too many dashboard streams open (limit ${MAX_STREAMS}); close a dashboard tab and retry`,
      ),
    );
    return;
  }
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-store",
    connection: "keep-alive",
  });
  res.write(`retry: 2000\nevent: history\ndata: ${JSON.stringify(sampler.history())}\n\n`);
  const off = sampler.subscribe((s) => {
    // A page that stopped reading is dropped rather than buffered without bound (it reconnects).
    if (res.writableLength > MAX_BUFFERED_BYTES) return void res.destroy();
    res.write(`event: sample\ndata: ${JSON.stringify(s)}\n\n`);
  });
  res.once("close", off);
  req.socket.setTimeout(0);
}
