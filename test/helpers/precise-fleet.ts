/**
 * Fixtures for precise-mode end-to-end tests: simulated replicas with a small HBM pool publishing
 * KV events over ZeroMQ, the endpoints file that points a gateway at their event sockets, and
 * waits on the gateway's subscription (joined, caught up with what a replica has published).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { GatewayHandle } from "../../src/gateway/gateway.ts";
import type { ReplicaSettings } from "../../src/sim/replica-options.ts";
import { postJson, startTestReplica, type TestReplica, waitFor } from "./replica.ts";

export const endpointId = (r: TestReplica) => `127.0.0.1:${r.port}`;

/**
 * A replica serving `model` with 47 usable GPU blocks of 16 tokens (two ~550-token prompts evict
 * everything else) that publishes KV events on ephemeral ports under topic kv@<name>@<model>.
 */
export function startEventReplica(
  name: string,
  model: string,
  extra: ReplicaSettings = {},
): Promise<TestReplica> {
  return startTestReplica({
    servedModelName: model,
    numGpuBlocksOverride: 48,
    maxModelLen: 640,
    kvEventsConfig: JSON.stringify({
      enable_kv_cache_events: true,
      publisher: "zmq",
      endpoint: "tcp://127.0.0.1:*",
      replay_endpoint: "tcp://127.0.0.1:*",
      topic: `kv@${name}@${model}`,
    }),
    ...extra,
  });
}

/** Writes `endpoints.yaml` in `dir` with each replica's kvEvents and kvEventsReplay sockets. */
export function writeEventEndpoints(dir: string, replicas: TestReplica[]): string {
  const file = join(dir, "endpoints.yaml");
  writeFileSync(
    file,
    replicas
      .map(
        (r) =>
          `- address: ${endpointId(r)}\n  kvEvents: ${r.server.publisher!.endpoint}\n  kvEventsReplay: ${r.server.publisher!.replayEndpoint}\n`,
      )
      .join(""),
  );
  return file;
}

/** The gateway's view of `r`'s event stream (sequence numbers seen, gaps, resets). */
export const subscription = (gw: GatewayHandle, r: TestReplica) =>
  gw.gateway.kvEvents.feeds()[0]!.subscriber.stats().endpoints[endpointId(r)];

/** Until the gateway has applied every batch `r` has published so far. */
export async function caughtUp(gw: GatewayHandle, r: TestReplica): Promise<void> {
  const pub = r.server.publisher!;
  await waitFor(() => subscription(gw, r)?.lastSeq === pub.stats().nextSeq - 1);
}

/**
 * Sends small requests straight to each replica until the gateway has seen one of its batches:
 * a ZeroMQ SUB socket misses what was published before it connected (the slow joiner).
 */
export async function joinEvents(gw: GatewayHandle, replicas: TestReplica[], model: string): Promise<void> {
  for (const r of replicas) {
    for (let i = 0; i < 200 && subscription(gw, r)?.lastSeq == null; i++) {
      await postJson(`${r.url}/v1/completions`, { model, prompt: `probe ${i} `.repeat(20), max_tokens: 1 });
      await new Promise((res) => setTimeout(res, 20));
    }
    if (subscription(gw, r)?.lastSeq == null) throw new Error(`no KV events from ${endpointId(r)}`);
  }
}

/** A ~550-token prompt of its own, for pushing other prompts out of a replica's HBM. */
export const fillerPrompt = (i: number) =>
  `Filler document ${i}: ${`unrelated words number ${i} fill the cache; `.repeat(55)}`;
