/**
 * Named workload presets with their sources. A preset is a partial WorkloadSpec; user options
 * are merged over it. The numbers are carried over from the sources named on each preset.
 */
import type { StageSpec } from "./arrivals.ts";
import type { WorkloadSpecInput } from "./spec.ts";

export interface Preset {
  description: string;
  spec: WorkloadSpecInput;
  notes: string[];
}

/**
 * llm-d-benchmark workload/profiles/inference-perf/guide_precise-prefix-cache-routing_1.yaml.in
 * (the "73% capacity" run of llm-d-kv-cache benchmarking/73-capacity): a warm-up of 15 QPS × 50 s
 * (750 requests, one pass over the 150 × 5 prompts), then the QPS ladder with the profile's
 * per-stage durations. `interval: 30.0` in the profile: inference-perf waits for each stage's
 * requests to finish, then sleeps 30 s.
 */
export const LLMD_73_STAGES: StageSpec[] = [
  { rate: 15, duration: 50, warmup: true },
  ...(
    [
      [3, 20],
      [10, 20],
      [15, 20],
      [20, 38],
      [22, 34],
      [25, 30],
      [30, 25],
      [35, 21],
      [40, 38],
      [43, 36],
      [46, 33],
      [49, 30],
      [52, 29],
      [55, 27],
      [57, 26],
      [60, 25],
    ] as const
  ).map(([rate, duration]) => ({ rate, duration })),
];

export const PRESETS: Record<string, Preset> = {
  "llmd-73": {
    description: "llm-d 73%-capacity prefix-routing run: 150×5 groups, 6000/1200/1000, Poisson 3→60 QPS",
    spec: {
      workload: "shared-prefix",
      options: {
        numGroups: 150,
        promptsPerGroup: 5,
        systemPromptLen: 6000,
        questionLen: 1200,
        outputLen: 1000,
        api: "completion",
      },
      arrival: { type: "stages", process: "poisson", stages: LLMD_73_STAGES, barrier: true, interval: 30 },
    },
    notes: [
      "Source: llm-d/llm-d-benchmark guide_precise-prefix-cache-routing_1.yaml.in; designed for 8 pods of Qwen3-32B TP2 (307,328 KV tokens each).",
      "Poisson arrivals are exponential gaps rescaled to each stage (vllm bench serve); inference-perf draws a Poisson count per second instead.",
      "Stages are barriered: each waits for the previous stage to drain, then 30 s (the profile's interval).",
    ],
  },
  tutorial: {
    description:
      "tutorial fleet of 8 replicas: 150 users, each with a 6,000-token system prompt, 1,000/1,000",
    spec: {
      workload: "shared-prefix",
      numRequests: 750,
      options: {
        numGroups: 150,
        promptsPerGroup: 5,
        systemPromptLen: 6000,
        questionLen: 1000,
        outputLen: 1000,
        api: "completion",
        order: "interleaved",
      },
      arrival: { type: "closed", users: 150, thinkTime: 0 },
    },
    notes: [
      "Designed for 8 replicas. Interpretation: each of the 150 users (closed loop, one request in flight each) has its own 6,000-token system prompt and asks its 5 questions in turn (group = user).",
    ],
  },
  smoke: {
    description: "a tiny shared-prefix run for checking a setup: 4×2 groups, 200/50/16, 40 requests at 5 QPS",
    spec: {
      workload: "shared-prefix",
      numRequests: 40,
      options: { numGroups: 4, promptsPerGroup: 2, systemPromptLen: 200, questionLen: 50, outputLen: 16 },
      arrival: { type: "poisson", rate: 5 },
    },
    notes: [],
  },
};
