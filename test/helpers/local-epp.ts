/** What the ext_proc end-to-end tests share: an EPP's options for free loopback ports, and a free port on a loopback address. */
import { createServer } from "node:net";

/** ext_proc, health and metrics on free ports of 127.0.0.1; fast scrapes and readiness polls; quiet. */
export const LOCAL_EPP = {
  grpcHost: "127.0.0.1",
  grpcPort: 0,
  grpcHealthPort: 0,
  metricsPort: 0,
  scrapeIntervalMs: 25,
  readyPollMs: 25,
  log: () => {},
} as const;

/** A port free on `host` now (for replicas that must share one port on distinct loopback addresses). */
export async function freePort(host: string): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, host, () => r()));
  const p = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return p;
}
