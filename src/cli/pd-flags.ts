/**
 * The prefill-leg flags `kvgate serve` and `kvgate pd-sidecar` share (llm-d's sidecar names
 * --prefill-max-retries and --prefill-retry-backoff; kvgate adds the failure policy and timeout).
 */
import { type Command, Option } from "commander";
import { durationMs, nonNegative, oneOf } from "./flag-values.ts";

export interface PrefillLegFlags {
  prefillFailurePolicy: "recompute" | "fail";
  prefillMaxRetries: number;
  prefillRetryBackoff: number;
  prefillTimeout: number;
}

/** Adds --prefill-failure-policy, --prefill-max-retries, --prefill-retry-backoff, --prefill-timeout. */
export function addPrefillLegOptions(cmd: Command): Command {
  return cmd
    .option(
      "--prefill-failure-policy <recompute|fail>",
      "P/D: a failed prefill leg (unreachable, timeout, HTTP error, no kv_transfer_params) is prefilled " +
        "on the decoder (recompute, marked x-kvgate-pd: fallback-<reason>) or, with fail, returned as llm-d's sidecar does",
      oneOf("recompute", "fail"),
      "recompute",
    )
    .option(
      "--prefill-max-retries <n>",
      "P/D: retries of a prefill answered 502/503/504 or cut off",
      nonNegative,
      0,
    )
    .addOption(
      new Option("--prefill-retry-backoff <duration>", "P/D: pause between prefill retries")
        .argParser(durationMs)
        .default(200, "200ms"),
    )
    .addOption(
      new Option(
        "--prefill-timeout <duration>",
        "P/D: each prefill attempt must be answered in full within this",
      )
        .argParser(durationMs)
        .default(60_000, "60s"),
    );
}
