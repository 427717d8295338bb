/**
 * `kvgate serve`'s side of mid-stream migration (migrate.ts): whether a request migrates (the
 * gateway's --migrate-streams, overridden per request by `x-kvgate-migrate: on|off`), and the
 * proxy's migrate hook — the continuation sent to the decision's other targets in order, then any
 * other candidate, each answer checked before the stream goes on. Counted in
 * kvgate_stream_migrations_total{outcome}.
 */
import type { IncomingHttpHeaders } from "node:http";
import { Counter, type Registry } from "prom-client";
import type { Dispatcher } from "undici";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import type { Gateway } from "./gateway.ts";
import { headerValue } from "./headers.ts";
import { type Migration, planMigration } from "./migrate.ts";
import type { AttemptFailure, ForwardRequest } from "./proxy.ts";
import type { ApiRoute } from "./request-body.ts";

const counters = new WeakMap<Registry, Counter<"outcome">>();

function counter(registry: Registry): Counter<"outcome"> {
  let c = counters.get(registry);
  if (c === undefined) {
    c = new Counter({
      name: "kvgate_stream_migrations_total",
      help: "Streams whose replica died after the first byte, by outcome: resumed on another replica, failed (no replica took the continuation), not-resumable (no token ids yet, or nothing left to generate), limit (--migration-limit reached).",
      labelNames: ["outcome"],
      registers: [registry],
    });
    counters.set(registry, c);
  }
  return c;
}

/** Whether this request migrates: the header wins over the gateway default. */
export function wantsMigration(gw: Gateway, headers: IncomingHttpHeaders): boolean {
  const h = headerValue(headers, "x-kvgate-migrate")?.trim().toLowerCase();
  if (h === "on" || h === "true" || h === "1") return true;
  if (h === "off" || h === "false" || h === "0") return false;
  return gw.opts.migrateStreams === true;
}

/**
 * Sets up migration on `fwd` when the request can migrate: its body (with return_token_ids), the
 * rewriter and the migrate hook. Returns the body to send.
 */
export function armMigration(
  gw: Gateway,
  route: ApiRoute,
  model: string,
  body: Buffer,
  fwd: ForwardRequest,
  report: (f: AttemptFailure) => void,
  onMigrated: (endpoint: string) => void,
): Buffer {
  if (route === "embeddings") return body;
  const plan = planMigration(route, body);
  if (plan === null) return body;
  const m: Migration = plan.migration;
  const c = counter(gw.metrics.registry);
  const limit = gw.opts.migrationLimit ?? 3;
  const dead = new Set<string>();
  fwd.rewriter = m;
  fwd.body = plan.body;
  fwd.headers = { ...fwd.headers, "content-length": String(plan.body.length) };
  fwd.migrate = async (failed, message) => {
    dead.add(failed);
    report({ endpoint: failed, kind: "reset", message });
    if (m.migrations >= limit) {
      c.inc({ outcome: "limit" });
      return null;
    }
    const cont = m.resumeBody();
    if (cont === null) {
      c.inc({ outcome: "not-resumable" });
      return null;
    }
    const order = [...fwd.targets];
    const cands = gw.data.store.candidates(model, monotonicSeconds());
    if (cands.ok) for (const e of cands.candidates) if (!order.includes(e.id)) order.push(e.id);
    for (const id of order) {
      if (dead.has(id) || fwd.signal.aborted) continue;
      let up: Dispatcher.ResponseData;
      try {
        up = await fwd.pool(id).request({
          path: "/v1/completions",
          method: "POST",
          headers: { ...fwd.headers, "content-length": String(cont.length) },
          body: cont,
          signal: fwd.signal,
          headersTimeout: fwd.headersTimeoutMs,
          bodyTimeout: fwd.bodyTimeoutMs,
        });
      } catch (err) {
        dead.add(id);
        report({ endpoint: id, kind: "connect", message: `migration: ${(err as Error).message}` });
        continue;
      }
      const sse = String(up.headers["content-type"] ?? "").startsWith("text/event-stream");
      if (up.statusCode !== 200 || !sse) {
        up.body.destroy();
        dead.add(id);
        report({ endpoint: id, kind: "status", message: `migration: HTTP ${up.statusCode}` });
        continue;
      }
      c.inc({ outcome: "resumed" });
      onMigrated(id);
      return { endpoint: id, up };
    }
    c.inc({ outcome: "failed" });
    return null;
  };
  return plan.body;
}
