/**
 * A small live fleet for the admin dashboard: N simulated vLLM replicas in this process (4× real time,
 * so a request runs long enough to show in the replicas' scraped queue and running counts), a gateway in
 * front of them, and a seeded closed-loop load of streaming chat requests (a few shared system
 * prompts, so the replicas' prefix caches hit) that can be started, resized and stopped. The
 * dashboard's browser test and `npm run screenshot:dashboard` both drive the page with it.
 */
import { request } from "undici";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../../gateway/gateway.ts";
import type { ReplicaSettings } from "../../sim/replica-options.ts";
import { ReplicaServer } from "../../sim/replica-server.ts";

export interface DashboardFleet {
  gateway: GatewayHandle;
  replicas: ReplicaServer[];
  /** Runs `users` closed-loop users from now on (0 stops them); the previous ones stop after their current request. */
  setUsers(users: number): void;
  /** Requests answered with 200 so far, and those that failed (status or connection). */
  readonly counts: { ok: number; failed: number };
  close(): Promise<void>;
}

export interface DashboardFleetOptions {
  replicas?: number;
  replica?: ReplicaSettings;
  gateway?: Partial<GatewayOptions>;
  model?: string;
  maxTokens?: number;
  seed?: number;
  /** User i sends `x-gateway-inference-fairness-id: tenants[i % n]` (flow control's flows). */
  tenants?: string[];
  /** User i sends `x-gateway-inference-objective: objectives[i % n]` (flow control's bands). */
  objectives?: string[];
}

const SYSTEM = [
  "You are a support agent for a payments company. Answer briefly and cite the policy section.",
  "You are a code reviewer. Point out bugs first, then style, in numbered lists.",
  "You translate English product descriptions into plain French without marketing words.",
];

/** A deterministic PRNG (mulberry32) for the load's prompt choices. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export async function startDashboardFleet(opts: DashboardFleetOptions = {}): Promise<DashboardFleet> {
  const model = opts.model ?? "sim-model";
  const replicas = await Promise.all(
    Array.from({ length: opts.replicas ?? 4 }, (_, i) =>
      ReplicaServer.start({
        host: "127.0.0.1",
        port: 0,
        servedModelName: model,
        timeScale: 4,
        numGpuBlocksOverride: 512,
        maxModelLen: 4096,
        seed: (opts.seed ?? 1) + i,
        log: () => {},
        ...opts.replica,
      }),
    ),
  );
  let gateway: GatewayHandle;
  try {
    gateway = await startGateway({
      endpoints: replicas.map((r) => `127.0.0.1:${r.port}`).join(","),
      scrapeIntervalMs: 100,
      seed: opts.seed ?? 1,
      log: () => {},
      ...opts.gateway,
    });
  } catch (err) {
    await Promise.all(replicas.map((r) => r.close()));
    throw err;
  }
  const counts = { ok: 0, failed: 0 };
  const random = rng(opts.seed ?? 1);
  let generation = 0;
  let live = 0;

  async function user(gen: number, id: number): Promise<void> {
    live++;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (opts.tenants?.length)
      headers["x-gateway-inference-fairness-id"] = opts.tenants[id % opts.tenants.length];
    if (opts.objectives?.length)
      headers["x-gateway-inference-objective"] = opts.objectives[id % opts.objectives.length];
    try {
      for (let turn = 0; gen === generation; turn++) {
        const body = JSON.stringify({
          model,
          stream: true,
          max_tokens: opts.maxTokens ?? 96,
          messages: [
            { role: "system", content: SYSTEM[Math.floor(random() * SYSTEM.length)].repeat(30) },
            { role: "user", content: `User ${id} question ${turn}: ${"details ".repeat(20 + (turn % 7))}` },
          ],
        });
        try {
          const res = await request(`${gateway.url}/v1/chat/completions`, {
            method: "POST",
            headers,
            body,
          });
          await res.body.text();
          if (res.statusCode === 200) counts.ok++;
          else counts.failed++;
        } catch {
          counts.failed++;
          if (gen !== generation) return;
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    } finally {
      live--;
    }
  }

  return {
    gateway,
    replicas,
    counts,
    setUsers(users: number) {
      const gen = ++generation;
      for (let i = 0; i < users; i++) void user(gen, i);
    },
    async close() {
      generation++;
      const deadline = Date.now() + 10_000;
      while (live > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      await gateway.close();
      await Promise.all(replicas.map((r) => r.close()));
    },
  };
}
