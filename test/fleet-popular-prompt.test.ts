// scenarios/popular-prompt.yaml in the fleet simulator: one system prompt brings half the requests
// (and two thirds of the decode work) beside 64 others that each home on a replica. The default
// config gives it homes until its replicas carry no more than their share, counting the other
// prompts homed there too, so the answer tokens end spread over the fleet; sticky routing alone
// keeps it on the replica that cached it first.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import type { RequestRow } from "../src/bench/request-rows.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import { loadScenario } from "../src/sim/fleet/scenario.ts";
import { runRouter, scenarioWorkload } from "../src/sim/fleet/simulate.ts";

/** The scenario's per-request rows under `configText` (the whole run: about a second of wall time). */
async function run(configText: string): Promise<RequestRow[]> {
  const sc = loadScenario("scenarios/popular-prompt.yaml");
  const r = { ...(sc.routers.find((x) => x.name === "default") as (typeof sc.routers)[number]), configText };
  const { spec, workload } = scenarioWorkload(sc);
  const ctx = { spec, workload, tokenizer: new PromptTokenizer(), limits: null, records: true };
  const { rows = [] } = await runRouter(sc, r, ctx);
  return rows;
}

/** Replicas that served the popular prompt, and the most answer tokens one replica decoded over the mean. */
function spread(rows: readonly RequestRow[]): { homes: number; peakOverMean: number } {
  const homes = new Set(rows.filter((x) => x.id.startsWith("popular")).map((x) => x.endpoint)).size;
  const tokens = new Map<string, number>();
  for (const x of rows) tokens.set(x.endpoint ?? "", (tokens.get(x.endpoint ?? "") ?? 0) + x.output_tokens);
  const all = [...tokens.values()];
  const mean = all.reduce((a, b) => a + b, 0) / all.length;
  return { homes, peakOverMean: Math.max(...all) / mean };
}

describe("popular-prompt scenario", () => {
  it("the default config spreads the popular prompt's work beside the other prompts'; sticky routing alone keeps it on one replica", async () => {
    const on = readFileSync("config/examples/default.yaml", "utf8");
    const off = on.replace(/\n {4}spreadHotPrefixes:\n {6}margin: 0\.5/, "");
    assert.notEqual(off, on);
    const withIt = spread(await run(on));
    // Half the requests is four replicas' share; their share of the 64 others besides needs more.
    assert.ok(withIt.homes >= 6, `${withIt.homes} replicas`);
    // Judged by its own requests alone it stopped at four, which decoded 1.58× the mean.
    assert.ok(withIt.peakOverMean < 1.4, `busiest replica ${withIt.peakOverMean.toFixed(2)}× the mean`);
    const sticky = spread(await run(off));
    assert.equal(sticky.homes, 1);
    assert.ok(sticky.peakOverMean > 2, `busiest replica ${sticky.peakOverMean.toFixed(2)}× the mean`);
  });
});
