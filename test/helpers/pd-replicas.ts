/**
 * Test helpers for P/D with simulated replicas: a prefiller (kv_producer) and a decoder
 * (kv_consumer) in this process, each with its NIXL side channel on an ephemeral loopback port, and
 * the two legs as llm-d's sidecar sends them.
 */
import type { ReplicaSettings } from "../../src/sim/replica-options.ts";
import { type Json, postJson, startTestReplica, type TestReplica } from "./replica.ts";

export const ids = (n: number, base = 1000) => Array.from({ length: n }, (_, i) => base + i);

/** A replica with a NixlConnector in `role`; `extra` goes to kv_connector_extra_config. */
export function startPdReplica(
  role: "kv_producer" | "kv_consumer" | "kv_both",
  extra: Record<string, unknown> = {},
  settings: ReplicaSettings = {},
): Promise<TestReplica> {
  return startTestReplica({
    kvTransferConfig: JSON.stringify({
      kv_connector: "NixlConnector",
      kv_role: role,
      kv_connector_extra_config: extra,
    }),
    nixlSideChannelHost: "127.0.0.1",
    nixlSideChannelPort: 0,
    ...settings,
  });
}

/**
 * The prefill leg as llm-d's sidecar sends it (nixlv2): one token, not streamed (stream_options
 * removed), do_remote_decode.
 */
export function prefill(p: TestReplica, body: Record<string, unknown>) {
  const { stream_options: _, ...rest } = body;
  return postJson(`${p.url}/v1/completions`, {
    ...rest,
    max_tokens: 1,
    min_tokens: 1,
    stream: false,
    kv_transfer_params: {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    },
  });
}

/** The decode leg: the original body with the prefiller's kv_transfer_params verbatim. */
export function decode(d: TestReplica, body: Record<string, unknown>, params: Json) {
  return postJson(`${d.url}/v1/completions`, { ...body, kv_transfer_params: params });
}
