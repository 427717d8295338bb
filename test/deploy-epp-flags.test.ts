/**
 * deploy/'s picker arguments are ones `kvgate epp` accepts: the Deployment's args are parsed by the
 * real command definition (src/cli/epp.ts), so a renamed or misspelt flag fails here instead of
 * crash-looping a pod. Reads the manifest itself, so it needs no kubectl.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { Command } from "commander";
import { parse } from "yaml";
import { checkEppFlags, registerEpp } from "../src/cli/epp.ts";

// biome-ignore lint/suspicious/noExplicitAny: parsed YAML
type Obj = Record<string, any>;

function pickerArgs(): { args: string[]; env: Obj[] } {
  const dep = parse(readFileSync(new URL("../deploy/base/deployment.yaml", import.meta.url), "utf8")) as Obj;
  const c = dep.spec.template.spec.containers[0];
  return { args: c.args as string[], env: (c.env ?? []) as Obj[] };
}

/** Parses argv with `kvgate epp`'s options; the action is replaced so nothing starts. */
function parseEpp(argv: string[]): Obj {
  const program = new Command().exitOverride();
  const cmd = registerEpp(program);
  cmd.exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  let opts: Obj | null = null;
  cmd.action((o: Obj) => {
    opts = o;
  });
  program.parse(argv, { from: "user" });
  assert.ok(opts, "the epp action did not run");
  return opts;
}

test("the Deployment's args are kvgate epp flags with values it accepts", () => {
  const { args, env } = pickerArgs();
  assert.equal(args[0], "epp");
  // $(NAMESPACE) is expanded by the kubelet from the downward API; stand in a value for it.
  assert.ok(
    env.some((e) => e.name === "NAMESPACE" && e.valueFrom?.fieldRef?.fieldPath === "metadata.namespace"),
  );
  const argv = args.map((a) => a.replace("$(NAMESPACE)", "llm"));
  const o = parseEpp(argv);
  assert.equal(o.poolName, "vllm-pool");
  assert.equal(o.poolNamespace, "llm");
  assert.equal(o.grpcPort, 9002);
  assert.equal(o.grpcHealthPort, 9003);
  assert.equal(o.metricsPort, 9090);
  assert.equal(checkEppFlags(o as Parameters<typeof checkEppFlags>[0]), null);
});

test("the check itself fails on a flag kvgate epp does not have", () => {
  const { args } = pickerArgs();
  assert.throws(() => parseEpp([...args, "--pool-nmae", "x"]), /unknown option '--pool-nmae'/);
});
