/**
 * The gateway-replica flags `kvgate serve` and `kvgate epp` share: --nats turns on routing-state
 * sync between active-active replicas (src/gateway/sync/nats-sync.ts), --nats-subject names the
 * group. Off by default: a single gateway needs neither.
 */
import { type Command, InvalidArgumentError } from "commander";

export interface SyncFlags {
  nats?: string;
  natsSubject?: string;
}

/** nats://host:port (or tls://, or host:port), comma-separated for a cluster. */
export function natsUrl(v: string): string {
  const parts = v.split(",").map((s) => s.trim());
  for (const p of parts)
    if (
      !/^((nats|tls):\/\/)?[^\s/:,]+(:\d{1,5})?$/.test(p) &&
      !/^(nats|tls):\/\/\[[0-9a-fA-F:]+\](:\d{1,5})?$/.test(p)
    )
      throw new InvalidArgumentError(`"${p}" is not a NATS server address; write nats://host:4222`);
  return parts.join(",");
}

function subject(v: string): string {
  if (!/^[\w-]+(\.[\w-]+)*$/.test(v))
    throw new InvalidArgumentError(
      `"${v}" is not a NATS subject prefix; use dot-separated words, e.g. kvgate.sync.pool-a`,
    );
  return v;
}

export function addSyncOptions(cmd: Command): Command {
  return cmd
    .option(
      "--nats <url>",
      "share routing state (approximate-prefix insertions, in-flight load, session bindings) with the " +
        "other gateway replicas through this NATS server; requests never wait for it (default off)",
      natsUrl,
    )
    .option(
      "--nats-subject <prefix>",
      "subject prefix of the replicas that share state (default kvgate.sync.<pool name>)",
      subject,
    );
}
