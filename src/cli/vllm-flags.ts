/**
 * `vllm serve` flags that `kvgate sim-replica` accepts so a vLLM command line runs unchanged, although
 * they change nothing in the simulation: the profile fixes the hardware, dtypes and parallelism, no
 * weights are loaded and nothing is authenticated. Names and short forms are vLLM's (`vllm serve
 * --help`, vllm/engine/arg_utils.py and vllm/entrypoints/openai/cli_args.py). --help lists them in
 * their own group with what to use instead; the replica prints one startup note naming those given.
 */
import { type Command, Option } from "commander";

interface CompatFlag {
  /** Commander flags, e.g. "--dtype <dtype>"; a boolean has no argument. */
  flags: string;
  /** Why it changes nothing, and what to use instead. */
  why: string;
}

const COMPAT_FLAGS: readonly CompatFlag[] = [
  {
    flags: "--gpu-memory-utilization <fraction>",
    why: "KV capacity comes from the profile; set it with --num-gpu-blocks-override",
  },
  { flags: "--tensor-parallel-size <n>", why: "the profile fixes the parallelism (--list-profiles)" },
  { flags: "--pipeline-parallel-size <n>", why: "the profile fixes the parallelism (--list-profiles)" },
  {
    flags: "--data-parallel-size <n>",
    why: "one engine per process: run one replica per rank (--data-parallel-rank) or kvgate sim-fleet",
  },
  { flags: "--dtype <dtype>", why: "the profile fixes the weights' bytes per parameter" },
  { flags: "--kv-cache-dtype <dtype>", why: "the profile fixes the KV cache's bytes per token" },
  { flags: "--quantization <method>", why: "the profile fixes the weights' size" },
  { flags: "--swap-space <GiB>", why: "no CPU swap is modelled; preemption recomputes, as in vLLM V1" },
  {
    flags: "--cpu-offload-gb <GiB>",
    why: "weight offload is not modelled (KV offload to CPU is: --kv-offloading-size)",
  },
  { flags: "--enforce-eager", why: "step times come from the profile's roofline model" },
  { flags: "--enable-chunked-prefill", why: "prefill is always chunked, as in vLLM V1" },
  { flags: "--no-enable-chunked-prefill", why: "prefill is always chunked, as in vLLM V1" },
  {
    flags: "--prefix-caching-hash-algo <algo>",
    why: "block hashes are always sha256_cbor (vLLM's with --prefix-caching-hash-algo sha256_cbor)",
  },
  { flags: "--trust-remote-code", why: "no model code is downloaded or run" },
  { flags: "--download-dir <dir>", why: "no weights are loaded" },
  { flags: "--load-format <format>", why: "no weights are loaded" },
  { flags: "--revision <rev>", why: "no weights are loaded" },
  { flags: "--distributed-executor-backend <backend>", why: "one process, no workers" },
  { flags: "--api-key <key>", why: "requests are not authenticated" },
  { flags: "--disable-log-requests", why: "the replica does not log requests" },
  { flags: "--enable-log-requests", why: "the replica does not log requests" },
  { flags: "--disable-log-stats", why: "the replica does not log stats; /metrics has them" },
  { flags: "--uvicorn-log-level <level>", why: "the replica logs only startup and errors" },
  { flags: "--disable-uvicorn-access-log", why: "the replica keeps no access log" },
  { flags: "--disable-frontend-multiprocessing", why: "the API server and engine share one process" },
];

/** vLLM's multi-letter short forms (commander takes single letters only), expanded before parsing. */
const SHORT_FORMS: Readonly<Record<string, string>> = {
  "-tp": "--tensor-parallel-size",
  "-pp": "--pipeline-parallel-size",
  "-dp": "--data-parallel-size",
  "-q": "--quantization",
};

const HEADING =
  "Accepted for `vllm serve` compatibility; no effect on the simulation (why, and what to use instead):";

const longName = (flags: string) => flags.split(" ")[0]!;

/** Adds the compatibility flags to `cmd`, grouped under their own heading in --help. */
export function addVllmCompatFlags(cmd: Command): Command {
  const short = new Map(Object.entries(SHORT_FORMS).map(([s, l]) => [l, s]));
  for (const f of COMPAT_FLAGS) {
    const alias = short.get(longName(f.flags));
    cmd.addOption(new Option(f.flags, alias ? `(also ${alias}) ${f.why}` : f.why).helpGroup(HEADING));
  }
  return cmd;
}

/** Rewrites vLLM's -tp/-pp/-dp/-q (also `-tp=2`) in a sim-replica command line into long flags. */
export function expandShortForms(args: readonly string[]): string[] {
  return args.map((a) => {
    const eq = a.indexOf("=");
    const name = eq < 0 ? a : a.slice(0, eq);
    const long = SHORT_FORMS[name];
    return long === undefined ? a : eq < 0 ? long : `${long}${a.slice(eq)}`;
  });
}

/**
 * The startup note for the compatibility flags actually given (null when none): one line naming each,
 * with why it changes nothing.
 */
export function compatNote(cmd: Command): string | null {
  const given = new Map<string, string>();
  for (const f of COMPAT_FLAGS) {
    const long = longName(f.flags);
    const attr = new Option(f.flags).attributeName();
    const source = cmd.getOptionValueSource(attr);
    if (source !== "cli") continue;
    // --enable-x / --no-enable-x share one attribute; name the form that was given.
    const value = cmd.getOptionValue(attr);
    const shown = long.startsWith("--no-") ? (value === false ? long : null) : value === false ? null : long;
    if (shown !== null) given.set(shown, f.why);
  }
  if (given.size === 0) return null;
  const parts = [...given].map(([flag, why]) => `${flag} (${why})`);
  return `kvgate sim-replica: note: accepted for vLLM compatibility, no effect on the simulation: ${parts.join("; ")}`;
}
