/**
 * The optional autoscaling actuator: sets a Deployment's replica count through its scale
 * subresource (PATCH apps/v1 …/deployments/NAME/scale with a JSON merge patch of spec.replicas),
 * as an HPA would, for clusters that let kvgate act on its own recommendation instead of pointing
 * an HPA or KEDA at the exported metric. It writes only when the count differs from the one it
 * last read, and a failure is one log line with what to do (the next interval tries again).
 */
import { AppsV1Api, type KubeConfig, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { describeKubeError } from "../datalayer/kubernetes/errors.ts";

export interface ScaleTarget {
  namespace: string;
  name: string;
}

export class ScaleActuator {
  readonly #api: AppsV1Api;
  constructor(
    kubeConfig: KubeConfig,
    readonly log: (line: string) => void,
  ) {
    this.#api = kubeConfig.makeApiClient(AppsV1Api);
  }

  /** Sets `target`'s replicas to `replicas`; returns the count it had (null when the call failed). */
  async scale(target: ScaleTarget, replicas: number): Promise<number | null> {
    try {
      const cur = await this.#api.readNamespacedDeploymentScale({
        name: target.name,
        namespace: target.namespace,
      });
      const had = cur.spec?.replicas ?? 0;
      if (had === replicas) return had;
      await this.#api.patchNamespacedDeploymentScale(
        { name: target.name, namespace: target.namespace, body: { spec: { replicas } } },
        setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
      );
      this.log(
        `kvgate: autoscale: deployment ${target.namespace}/${target.name} scaled ${had} → ${replicas}`,
      );
      return had;
    } catch (err) {
      this.log(
        `kvgate: autoscale: cannot scale deployment ${target.namespace}/${target.name} to ${replicas}: ${describeKubeError(err, "get and patch on deployments/scale")}; ` +
          "check that the Deployment exists (the next interval tries again)",
      );
      return null;
    }
  }
}
