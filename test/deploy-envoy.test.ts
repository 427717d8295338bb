/**
 * deploy/envoy/envoy.yaml, the standalone Envoy's bootstrap: checked field by field against Envoy's
 * own v3 API protos (no Envoy binary can run on the build machines), then for what kvgate's picker
 * needs — ext_proc in FULL_DUPLEX_STREAMED with trailers, failure mode as the InferencePool's, a
 * client's destination header dropped before ext_proc, ORIGINAL_DST on the picker's header, the
 * ext_proc cluster on HTTP/2 over TLS with circuit breakers past Envoy's 1,024 default.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { parse } from "yaml";
import { CONTROL_HEADERS } from "../src/gateway/headers.ts";
import { type Obj, readRepoFile as read } from "./helpers/deploy-checks.ts";
import { EnvoyProtos } from "./helpers/envoy-proto-check.ts";

const HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const EXT_PROC = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor";
const ROUTER = "envoy.extensions.filters.http.router.v3.Router";
const HEADER_MUTATION = "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";
const protos = new EnvoyProtos([
  "envoy/config/bootstrap/v3/bootstrap.proto",
  "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
  "envoy/extensions/filters/http/router/v3/router.proto",
  "envoy/extensions/filters/http/ext_proc/v3/ext_proc.proto",
  "envoy/extensions/filters/http/health_check/v3/health_check.proto",
  "envoy/extensions/filters/http/header_mutation/v3/header_mutation.proto",
  "envoy/extensions/transport_sockets/tls/v3/tls.proto",
  "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
]);
const bootstrap = () => parse(read("deploy/envoy/envoy.yaml")) as Obj;
const inferenceHcm = (b: Obj) =>
  (b.static_resources.listeners as Obj[]).find((l) => l.name === "inference")!.filter_chains[0].filters[0]
    .typed_config as Obj;

test("envoy.yaml: every field is one of Envoy's v3 API, every enum value a name it knows", () => {
  assert.deepEqual(protos.check(bootstrap(), "envoy.config.bootstrap.v3.Bootstrap"), []);
});

test("envoy.yaml: the proto check rejects misspelt fields, bad enum values, unknown @types", () => {
  const b = bootstrap();
  const hcm = inferenceHcm(b);
  const ext = (hcm.http_filters as Obj[]).find((f) => f.name === "envoy.filters.http.ext_proc")!.typed_config;
  ext.processing_mode.request_body_mode = "FULL_DUPLEX";
  ext.procesing_mode = {};
  b.static_resources.clusters[0].connect_timeout = "250ms";
  (hcm.http_filters as Obj[]).at(-1)!.typed_config["@type"] = "type.googleapis.com/envoy.filters.http.Router";
  const problems = protos.check(b, "envoy.config.bootstrap.v3.Bootstrap");
  assert.equal(problems.length, 4, problems.join("\n"));
  assert.ok(problems.some((p) => p.includes('"FULL_DUPLEX" is not a value of')));
  assert.ok(problems.some((p) => p.includes('has no field "procesing_mode"')));
  assert.ok(problems.some((p) => p.includes("connect_timeout: a Duration")));
  assert.ok(problems.some((p) => p.includes("envoy.filters.http.Router is not a known message")));
});

test("envoy.yaml: listeners, filters in order, ext_proc as llm-d's EPP needs it", () => {
  const b = bootstrap();
  for (const l of b.static_resources.listeners as Obj[]) {
    assert.equal(typeof l.address.socket_address.address, "string", `${l.name}: address`);
    assert.ok(Number.isInteger(l.address.socket_address.port_value), `${l.name}: port`);
    assert.ok(l.filter_chains.length > 0, `${l.name}: filter_chains`);
    const hcm = l.filter_chains[0].filters[0];
    assert.equal(hcm.name, "envoy.filters.network.http_connection_manager");
    assert.equal(hcm.typed_config["@type"], `type.googleapis.com/${HCM}`);
    const filters = hcm.typed_config.http_filters as Obj[];
    assert.equal(filters.at(-1)!.typed_config["@type"], `type.googleapis.com/${ROUTER}`, "router last");
  }
  const filters = inferenceHcm(b).http_filters as Obj[];
  const types = filters.map((f) => String(f.typed_config["@type"]).replace("type.googleapis.com/", ""));
  assert.deepEqual(types, [HEADER_MUTATION, EXT_PROC, ROUTER]);
  // A client's destination header is gone before ext_proc runs (and so before any route is chosen).
  assert.deepEqual(filters[0].typed_config.mutations.request_mutations, [
    { remove: "x-gateway-destination-endpoint" },
  ]);
  const ext = filters[1].typed_config;
  assert.deepEqual(ext.processing_mode, {
    request_header_mode: "SEND",
    response_header_mode: "SEND",
    request_body_mode: "FULL_DUPLEX_STREAMED",
    response_body_mode: "FULL_DUPLEX_STREAMED",
    request_trailer_mode: "SEND",
    response_trailer_mode: "SEND",
  });
  assert.equal(ext.allow_mode_override, false);
  // Long enough for a long prompt's upload, within the range Envoy accepts (0–3600 s, ext_proc.proto).
  const timeout = Number.parseFloat(ext.message_timeout);
  assert.ok(timeout >= 60 && timeout <= 3600, `message_timeout ${ext.message_timeout}`);
  const pool = parse(read("deploy/base/inferencepool.yaml")) as Obj;
  assert.equal(
    ext.failure_mode_allow,
    pool.spec.endpointPickerRef.failureMode === "FailOpen",
    "failure_mode_allow follows the InferencePool's failureMode",
  );
});

test("envoy.yaml: clusters exist, ORIGINAL_DST follows the picker's header, ext_proc over h2/TLS", () => {
  const b = bootstrap();
  const clusters = new Map<string, Obj>((b.static_resources.clusters as Obj[]).map((c) => [c.name, c]));
  assert.equal(clusters.size, b.static_resources.clusters.length, "cluster names are unique");
  const referenced: string[] = [];
  for (const l of b.static_resources.listeners as Obj[]) {
    const hcm = l.filter_chains[0].filters[0].typed_config;
    for (const vh of hcm.route_config.virtual_hosts)
      for (const r of vh.routes) referenced.push(r.route.cluster);
    for (const f of hcm.http_filters)
      if (f.typed_config.grpc_service) referenced.push(f.typed_config.grpc_service.envoy_grpc.cluster_name);
  }
  for (const name of referenced) assert.ok(clusters.has(name), `cluster ${name} exists`);
  for (const c of clusters.values())
    if (c.load_assignment) assert.equal(c.load_assignment.cluster_name, c.name, `${c.name}: load_assignment`);

  // The route to the picked pod is taken only when the picker set the header.
  const routes = inferenceHcm(b).route_config.virtual_hosts[0].routes as Obj[];
  assert.deepEqual(routes[0].match.headers, [
    { name: "x-gateway-destination-endpoint", present_match: true },
  ]);
  const dst = clusters.get(routes[0].route.cluster)!;
  assert.equal(dst.type, "ORIGINAL_DST");
  assert.equal(dst.lb_policy, "CLUSTER_PROVIDED");
  assert.deepEqual(dst.original_dst_lb_config, {
    use_http_header: true,
    http_header_name: "x-gateway-destination-endpoint",
  });
  assert.ok(CONTROL_HEADERS.includes(dst.original_dst_lb_config.http_header_name), "kvgate strips it");
  assert.equal(routes.at(-1)!.route.cluster, "vllm_pool_fallback", "fail-open route last");

  const ext = clusters.get("ext_proc")!;
  for (const c of [ext, dst, clusters.get("vllm_pool_fallback")!]) {
    const t = c.circuit_breakers.thresholds[0];
    for (const k of ["max_connections", "max_pending_requests", "max_requests"])
      assert.ok(t[k] > 1024, `${c.name}: ${k} above Envoy's default 1,024`);
  }
  const opts = ext.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
  assert.ok(opts.explicit_http_config.http2_protocol_options, "gRPC needs HTTP/2");
  assert.equal(
    ext.transport_socket.typed_config["@type"],
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
  );
  assert.deepEqual(ext.transport_socket.typed_config.common_tls_context.alpn_protocols, ["h2"]);
  assert.equal(
    ext.health_checks[0].grpc_health_check.service_name,
    "envoy.service.ext_proc.v3.ExternalProcessor",
  );
  const sa = ext.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address;
  const grpc = inferenceHcm(b).http_filters[1].typed_config.grpc_service.envoy_grpc;
  assert.equal(grpc.authority, `${sa.address}:${sa.port_value}`, "the :authority names the picker's Service");
});
