/**
 * `--autoscale-config FILE` for `kvgate serve` and `kvgate epp`: loads the file, starts the
 * gateway's AutoscaleService (src/gateway/autoscale.ts) and, with `actuate: true`, its Deployment
 * scaler with credentials from KUBECONFIG, ~/.kube/config or the pod's service account.
 */
import { KubeConfig } from "@kubernetes/client-node";
import { monotonicSeconds } from "../datalayer/datastore.ts";
import { AutoscaleService, loadAutoscaleConfig } from "../gateway/autoscale.ts";
import { ScaleActuator } from "../gateway/autoscale-actuator.ts";
import type { Gateway } from "../gateway/gateway.ts";

export const AUTOSCALE_FLAG = [
  "--autoscale-config <file>",
  "autoscaling recommendations per pool (kvgate_desired_replicas, wva_desired_replicas, GET /autoscale); YAML: pools, slo, startupDelay, actuate",
] as const;

/** Starts recommendations on `gw`; throws with the file's error (the CLI exits 2 with it). */
export function startAutoscale(
  gw: Gateway,
  file: string | undefined,
  kubeConfig?: KubeConfig,
): AutoscaleService | null {
  if (file === undefined) return null;
  const cfg = loadAutoscaleConfig(file);
  let actuator: ScaleActuator | null = null;
  if (cfg.actuate) {
    const kc = kubeConfig ?? new KubeConfig();
    if (kubeConfig === undefined) kc.loadFromDefault();
    actuator = new ScaleActuator(kc, gw.log);
  }
  const svc = new AutoscaleService(cfg, gw.data.store, gw.metrics.registry, monotonicSeconds, actuator);
  gw.autoscale = svc;
  svc.start();
  return svc;
}
