/**
 * `kvgate sim-fleet N`: starts N simulated replicas (`kvgate sim-replica` processes) on distinct HTTP
 * and KV-event ports, each publishing on the topic `kv@<pod>@<model>`, and prints (or writes) the
 * endpoints file `kvgate serve --endpoints-file` reads, with kvEvents and kvEventsReplay for precise
 * mode. Common sim-replica flags are forwarded (replica i gets --seed + i, so outputs differ), others
 * go after `--`. SIGINT/SIGTERM stop every replica and exit 0; a replica that fails to start stops the
 * rest and exits 1 with its message.
 */
import { renameSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { type Command, InvalidArgumentError } from "commander";
import { stringify } from "yaml";
import { integer, port } from "./flag-values.ts";

const count = (v: string): number => {
  const n = integer(v);
  if (n < 1 || n > 128) throw new InvalidArgumentError("must be in [1, 128].");
  return n;
};

interface Flags {
  host: string;
  port: number;
  kvEventsPort: number;
  kvEvents: boolean;
  podPrefix: string;
  endpointsFile?: string;
  model?: string;
  servedModelName?: string;
  profile?: string;
  timeScale?: string;
  seed: number;
  numGpuBlocksOverride?: string;
  maxNumSeqs?: string;
  maxNumBatchedTokens?: string;
  maxModelLen?: string;
  blockSize?: string;
  kvEventsFormat?: string;
  tokenizer?: string;
}

/** Flags sim-fleet sets per replica; a forwarded copy would break the fleet's port plan. */
const MANAGED = ["--port", "--host", "--kv-events-config", "--data-parallel-rank", "--served-model-name"];

/** The sim-replica flags forwarded unchanged to every replica: [flag, key in Flags]. */
const FORWARDED: ReadonlyArray<[string, keyof Flags]> = [
  ["--model", "model"],
  ["--profile", "profile"],
  ["--time-scale", "timeScale"],
  ["--num-gpu-blocks-override", "numGpuBlocksOverride"],
  ["--max-num-seqs", "maxNumSeqs"],
  ["--max-num-batched-tokens", "maxNumBatchedTokens"],
  ["--max-model-len", "maxModelLen"],
  ["--block-size", "blockSize"],
  ["--kv-events-format", "kvEventsFormat"],
  ["--tokenizer", "tokenizer"],
];

/** `k` distinct TCP ports nothing listens on right now (the replicas bind them a moment later). */
async function freePorts(k: number): Promise<number[]> {
  const held = await Promise.all(
    Array.from(
      { length: k },
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const s = createServer();
          s.once("error", reject);
          s.listen(0, () => resolve(s));
        }),
    ),
  );
  // All held open at once, so the kernel hands out k different ports.
  const ports = held.map((s) => (s.address() as { port: number }).port);
  await Promise.all(held.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

export interface FleetReplica {
  pod: string;
  /** host:port of its OpenAI API, as a gateway on this machine reaches it. */
  address: string;
  kvEvents: string | null;
  kvEventsReplay: string | null;
}

/** The endpoints file for the fleet, in the format `kvgate serve --endpoints-file` reads. */
export function endpointsYaml(replicas: readonly FleetReplica[], header: string): string {
  const endpoints = replicas.map((r) => ({
    address: r.address,
    labels: { pod: r.pod },
    ...(r.kvEvents ? { kvEvents: r.kvEvents, kvEventsReplay: r.kvEventsReplay } : {}),
  }));
  return `${header
    .split("\n")
    .map((l) => `# ${l}`)
    .join("\n")}\n${stringify({ endpoints })}`;
}

/** Adds the `sim-fleet` command to the program. */
export function registerSimFleet(program: Command): Command {
  return program
    .command("sim-fleet")
    .description(
      "Start N simulated replicas on distinct ports and print the endpoints file for kvgate serve.",
    )
    .argument("<n>", "how many replicas (1-128)", count)
    .argument("[replica-flags...]", "after --: more sim-replica flags for every replica")
    .option("--host <host>", "address the replicas listen on", "127.0.0.1")
    .option(
      "--port <port>",
      "first HTTP port; replica i listens on port + i (0 = any free ports)",
      port,
      8000,
    )
    .option(
      "--kv-events-port <port>",
      "first KV-events port: replica i publishes on port + 2i, replays on port + 2i + 1 (0 = any free ports)",
      port,
      5557,
    )
    .option("--no-kv-events", "publish no KV events (approximate routing only)")
    .option("--pod-prefix <name>", "replica i is <name><i>: topic kv@<pod>@<model>, label pod", "sim-")
    .option("--endpoints-file <path>", "write the endpoints file here instead of printing it to stdout")
    .option("--model <name>", "model name/path (default: the profile's model)")
    .option("--served-model-name <name>", "the name clients use (default: --model)")
    .option("--profile <name|path>", "hardware/model profile (sim-replica --list-profiles)")
    .option("--time-scale <n>", "simulated seconds per wall second")
    .option("--seed <n>", "replica i gets seed n + i", integer, 0)
    .option("--num-gpu-blocks-override <n>", "KV blocks per replica")
    .option("--max-num-seqs <n>", "most requests in one batch")
    .option("--max-num-batched-tokens <n>", "token budget of one step")
    .option("--max-model-len <tokens>", "context window")
    .option("--block-size <tokens>", "tokens per KV block")
    .option("--kv-events-format <format>", "map or array")
    .option("--tokenizer <dir>", "a tokenizer.json directory for every replica")
    .addHelpText(
      "after",
      "\nExample:\n  kvgate sim-fleet 4 --time-scale 10 --endpoints-file fleet.yaml -- --fault-error-rate 0.01\n" +
        "  kvgate serve --endpoints-file fleet.yaml --config config/examples/precise-prefix.yaml --tokenizer sim",
    )
    .action(async (n: number, extra: string[], flags: Flags, cmd: Command) => {
      const clash = extra.find((a) => MANAGED.includes(a.split("=")[0]!));
      if (clash)
        cmd.error(`error: ${clash} is set per replica by sim-fleet; use sim-fleet's own options`, {
          exitCode: 2,
        });
      if (!/^[A-Za-z0-9._-]*$/.test(flags.podPrefix))
        cmd.error("error: --pod-prefix may use letters, digits, '.', '_' and '-' only", { exitCode: 2 });
      if (flags.port > 0 && flags.port + n - 1 > 65535)
        cmd.error(`error: --port ${flags.port} + ${n} replicas passes 65535`, { exitCode: 2 });
      if (flags.kvEvents && flags.kvEventsPort > 0 && flags.kvEventsPort + 2 * n - 1 > 65535)
        cmd.error(`error: --kv-events-port ${flags.kvEventsPort} + ${2 * n} ports passes 65535`, {
          exitCode: 2,
        });
      const { loadProfile, DEFAULT_PROFILE } = await import("../sim/profiles.ts");
      let profileModel: string;
      try {
        profileModel = loadProfile(flags.profile ?? DEFAULT_PROFILE).model.name;
      } catch (err) {
        cmd.error(`error: --profile: ${(err as Error).message}`, { exitCode: 2 });
      }
      const model = flags.servedModelName ?? flags.model ?? profileModel;
      await runFleet(n, extra, flags, model);
    });
}

async function runFleet(n: number, extra: string[], flags: Flags, model: string): Promise<void> {
  const { spawnKvgate, stopAll } = await import("../sim/launcher.ts");
  type Child = Awaited<ReturnType<typeof spawnKvgate>>;
  const log = (line: string) => console.error(`kvgate sim-fleet: ${line}`);
  const wildcard = flags.host === "0.0.0.0" || flags.host === "::";
  const reach = wildcard ? "127.0.0.1" : flags.host;
  const spare = flags.kvEvents && flags.kvEventsPort === 0 ? await freePorts(2 * n) : [];
  const plans = Array.from({ length: n }, (_, i) => {
    const pod = `${flags.podPrefix}${i}`;
    const args = ["sim-replica", "--host", flags.host, "--port", String(flags.port && flags.port + i)];
    args.push("--served-model-name", model, "--seed", String(flags.seed + i));
    for (const [flag, key] of FORWARDED) if (flags[key] !== undefined) args.push(flag, String(flags[key]));
    let kv: { pub: number; replay: number } | null = null;
    if (flags.kvEvents) {
      const base = flags.kvEventsPort;
      kv =
        base > 0
          ? { pub: base + 2 * i, replay: base + 2 * i + 1 }
          : { pub: spare[2 * i]!, replay: spare[2 * i + 1]! };
      const config = {
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint: `tcp://*:${kv.pub}`,
        replay_endpoint: `tcp://*:${kv.replay}`,
        topic: `kv@${pod}@${model}`,
      };
      args.push("--kv-events-config", JSON.stringify(config));
    }
    return { pod, args: [...args, ...extra], kv };
  });

  const started = await Promise.allSettled(
    plans.map((p) => spawnKvgate(`replica ${p.pod}`, p.args, 120_000)),
  );
  const children = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const failed = started.flatMap((s) => (s.status === "rejected" ? [(s.reason as Error).message] : []));
  if (failed.length > 0) {
    await stopAll(children);
    for (const f of failed) log(`a replica did not start: ${f}`);
    if (failed.some((f) => f.includes("already in use")))
      log("ports are taken: start the fleet on others with --port and --kv-events-port (0 = any free ports)");
    process.exit(1);
  }

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log(`${signal}, stopping ${children.length} replica(s)`);
    stopAll(children).then(
      () => process.exit(0),
      () => process.exit(0),
    );
  };
  process.once("SIGTERM", () => stop("SIGTERM"));
  process.once("SIGINT", () => stop("SIGINT"));
  let alive = children.length;
  children.forEach((c: Child, i) => {
    c.proc.stderr?.on("data", (d: string) => {
      for (const line of d.split("\n")) if (line.trim()) console.error(`[${plans[i]!.pod}] ${line}`);
    });
    void c.exited.then(({ code, signal }) => {
      if (stopping) return;
      alive--;
      log(`replica ${plans[i]!.pod} exited (code ${code}, signal ${signal}); ${alive} still running`);
      if (alive === 0) process.exit(1);
    });
  });

  const replicas: FleetReplica[] = children.map((c, i) => {
    const kv = plans[i]!.kv;
    return {
      pod: plans[i]!.pod,
      address: new URL(c.url).host,
      kvEvents: kv ? `tcp://${reach}:${kv.pub}` : null,
      kvEventsReplay: kv ? `tcp://${reach}:${kv.replay}` : null,
    };
  });
  const profile = / profile=(\S+)/.exec(children[0]!.banner)?.[1] ?? "?";
  const header =
    `kvgate sim-fleet: ${n} simulated replica(s) of ${model} (profile ${profile})\n` +
    `use: kvgate serve --endpoints-file <this file>${flags.kvEvents ? " --config config/examples/precise-prefix.yaml --tokenizer sim" : ""}`;
  const yaml = endpointsYaml(replicas, header);
  if (flags.endpointsFile) {
    // Written whole and renamed into place: a gateway watching the file never reads half of it.
    const tmp = `${flags.endpointsFile}.${process.pid}.tmp`;
    writeFileSync(tmp, yaml);
    renameSync(tmp, flags.endpointsFile);
  } else {
    process.stdout.write(yaml);
  }
  for (const r of replicas)
    log(
      `${r.pod} at http://${r.address}${r.kvEvents ? ` kv events ${r.kvEvents} (replay ${r.kvEventsReplay})` : ""}`,
    );
  log(
    `${n} replica(s) ready${flags.endpointsFile ? `; endpoints file ${flags.endpointsFile}` : ""}; ` +
      `next: kvgate serve --endpoints-file ${flags.endpointsFile ?? "<that file>"}` +
      `${flags.kvEvents ? " --config config/examples/precise-prefix.yaml --tokenizer sim" : ""}; Ctrl-C stops them all`,
  );
}
