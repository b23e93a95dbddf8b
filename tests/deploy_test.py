"""The deployment manifests (deploy/), checked against real schemas and tied to the binary.

1. Every KServe and Gateway API Inference Extension manifest validates against its
   CustomResourceDefinition's openAPIV3Schema (deploy/schemas/kserve/, deploy/schemas/gie/),
   strictly: unknown fields are errors, as
   `kubectl apply --validate=strict` makes them. Every core manifest validates with
   kubernetes-validate --strict. A manifest with a misspelt field is refused by both.
2. `sluice serve` started with exactly the ClusterServingRuntime's container args (the model path
   pointed at a temporary single-model directory, the ports made free) answers its declared
   readiness, liveness and Prometheus paths on its declared port, serves a tensor model under the
   InferenceService's name over v2, and a language model under its name over the OpenAI routes;
   the Deployment's args serve a repository the same way.
3. Readiness leads shutdown: after SIGTERM, /v2/health/ready (and gRPC ServerReady) fail at once
   while inference is still answered, with Connection: close, on old and new connections, for
   --drain-delay; then the listener closes, in-flight work finishes, and the exit code is 0.
4. --model-dir / --model-name errors are clear.

Usage: deploy_test.py SLUICE TEST_MODELS CRD_DIR (deploy/schemas)
"""
import copy
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
CRD_FILES = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"):
        "kserve/serving.kserve.io_clusterservingruntimes.yaml",
    ("serving.kserve.io/v1beta1", "InferenceService"):
        "kserve/serving.kserve.io_inferenceservices.yaml",
    ("inference.networking.k8s.io/v1", "InferencePool"):
        "gie/inference.networking.k8s.io_inferencepools.yaml",
}
KUBERNETES_VERSION = "1.33.0"


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


# --- 1. schemas --------------------------------------------------------------------------------

def strict(schema):
    """The schema with unknown fields refused wherever Kubernetes would prune them."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def crd_schemas(crd_dir):
    schemas = {}
    for (api_version, kind), file in CRD_FILES.items():
        with open(os.path.join(crd_dir, file)) as f:
            crd = yaml.safe_load(f)
        group = crd["spec"]["group"]
        for version in crd["spec"]["versions"]:
            if f"{group}/{version['name']}" == api_version:
                schemas[(api_version, kind)] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def manifest_errors(doc, schemas):
    """The validation errors of one manifest; empty when it is valid."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in schemas:
        validator = jsonschema.Draft7Validator(schemas[key])
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'/'.join(map(str, e.path))}: {e.message}"]
    return []


def load_manifests():
    manifests = {}
    for folder in ("kserve", "k8s", "gateway"):
        for name in sorted(os.listdir(os.path.join(DEPLOY, folder))):
            if name.endswith(".yaml"):
                path = os.path.join(DEPLOY, folder, name)
                with open(path) as f:
                    manifests[f"{folder}/{name}"] = [d for d in yaml.safe_load_all(f) if d]
    return manifests


def test_manifests_validate(schemas, manifests):
    kinds = []
    for path, docs in manifests.items():
        for doc in docs:
            errors = manifest_errors(doc, schemas)
            check(not errors, f"deploy/{path} ({doc.get('kind')}): {errors}")
            kinds.append(doc["kind"])
            print(f"deploy/{path}: {doc['kind']} {doc['metadata']['name']} valid")
    for kind in ("ClusterServingRuntime", "InferenceService", "Deployment", "Service",
                 "HorizontalPodAutoscaler", "PodDisruptionBudget", "InferencePool"):
        check(kind in kinds, f"no {kind} among the manifests")
    # The checks can fail: a misspelt field is refused, by the CRD schema and by Kubernetes'.
    runtime = manifests["kserve/cluster-serving-runtime.yaml"][0]
    bad = copy.deepcopy(runtime)
    bad["spec"]["containers"][0]["readinesProbe"] = bad["spec"]["containers"][0]["readinessProbe"]
    check(manifest_errors(bad, schemas), "a misspelt runtime field (readinesProbe) validated")
    bad = copy.deepcopy(manifests["kserve/resnet18.yaml"][0])
    bad["spec"]["predictor"]["scaleMetric"] = "queue-depth"
    check(manifest_errors(bad, schemas), "an InferenceService scaleMetric outside the enum validated")
    bad = copy.deepcopy(manifests["k8s/deployment.yaml"][0])
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    check(manifest_errors(bad, schemas), "a misspelt Deployment field validated")
    pool = manifests["gateway/smollm2-inferencepool.yaml"][0]
    bad = copy.deepcopy(pool)
    bad["spec"]["endpointPickerRef"]["failureMode"] = "FailSoft"
    check(manifest_errors(bad, schemas), "an InferencePool failureMode outside the enum validated")
    bad = copy.deepcopy(pool)
    bad["spec"]["targetPort"] = bad["spec"].pop("targetPorts")
    check(manifest_errors(bad, schemas), "an InferencePool without targetPorts validated")
    # The pool selects the smollm2 InferenceService's pods on the port the runtime serves HTTP on.
    runtime_ports = [p["containerPort"] for p in runtime["spec"]["containers"][0]["ports"]
                     if p.get("name") != "h2c"]
    check(pool["spec"]["selector"]["matchLabels"] ==
          {"serving.kserve.io/inferenceservice": manifests["kserve/smollm2.yaml"][0]["metadata"]["name"]}
          and [t["number"] for t in pool["spec"]["targetPorts"]] == runtime_ports[:1],
          f"the InferencePool's selector and port: {pool['spec']}, runtime ports {runtime_ports}")
    print("a misspelt field is refused by both validators")


# --- 2. the manifests against the binary -------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`sluice serve` with the given args; stopped by its PID."""

    def __init__(self, sluice, args):
        self.process = subprocess.Popen([sluice, *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.output = []
        self.listening = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.output.append(line)
            if "Sluice listening on" in line:
                self.listening.set()

    def wait_listening(self, timeout=120):
        if not self.listening.wait(timeout):
            self.stop()
            sys.exit(f"FAIL: sluice serve did not start:\n{''.join(self.output)}")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            sys.exit(f"FAIL: sluice serve did not exit:\n{''.join(self.output)}")
        self.reader.join(timeout=10)
        return code


def request(port, method, path, body=None, connection=None, headers=None):
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    if connection is None:
        conn.close()
    return response.status, data, response


def single_model_dir(test_models, model, parent):
    """A copy of test_models/model as KServe mounts one model: its files at the root of a folder
    named like KServe's (not like the model)."""
    target = os.path.join(parent, "mnt-models")
    shutil.copytree(os.path.join(test_models, model), target)
    return target


def runtime_args(container, model_dir, model_name, http_port, grpc_port):
    """The runtime container's args with KServe's substitutions made, and the ports made free."""
    args = []
    for arg in container["args"]:
        arg = arg.replace("{{.Name}}", model_name).replace("/mnt/models", model_dir)
        arg = re.sub(r"^--port=8080$", f"--port={http_port}", arg)
        arg = re.sub(r"^--grpc-port=8081$", f"--grpc-port={grpc_port}", arg)
        args.append(arg)
    check(f"--port={http_port}" in args and f"--grpc-port={grpc_port}" in args,
          f"the runtime's args do not set --port=8080 and --grpc-port=8081: {container['args']}")
    return args


def probe_port(probe, container_port, http_port):
    port = probe["httpGet"]["port"]
    check(port == container_port, f"a probe on port {port}, not the container's {container_port}")
    return http_port


def v2_infer_identity(port, model, connection=None):
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                   "data": list(range(16))}]})
    return request(port, "POST", f"/v2/models/{model}/infer", body, connection)


def test_runtime_args_serve_a_tensor_model(sluice, test_models, manifests, tmp):
    runtime = manifests["kserve/cluster-serving-runtime.yaml"][0]
    container = runtime["spec"]["containers"][0]
    container_port = container["ports"][0]["containerPort"]
    http_port, grpc_port = free_port(), free_port()
    model_dir = single_model_dir(test_models, "identity", tmp)
    server = Server(sluice, runtime_args(container, model_dir, "identity-isvc", http_port,
                                         grpc_port))
    server.wait_listening()
    try:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            port = probe_port(container[probe], container_port, http_port)
            status, body, _ = request(port, "GET", container[probe]["httpGet"]["path"])
            check(status == 200, f"{probe} {container[probe]['httpGet']['path']}: {status} {body}")
        annotations = runtime["spec"]["annotations"]
        check(int(annotations["prometheus.kserve.io/port"]) == container_port,
              "the Prometheus port is not the container's")
        status, body, _ = request(http_port, "GET", annotations["prometheus.kserve.io/path"])
        check(status == 200 and b"sluice_requests_total" in body, f"metrics: {status}")
        status, body, _ = v2_infer_identity(http_port, "identity-isvc")
        check(status == 200, f"v2 infer under the InferenceService's name: {status} {body}")
        outputs = json.loads(body)["outputs"]
        check(outputs[0]["data"] == list(range(16)), f"identity outputs: {outputs}")
        status, body, _ = request(http_port, "GET", "/v2/models/identity")
        check(status == 404, f"the directory's own name should not be served: {status}")
        status, body, _ = request(http_port, "POST", "/v2/repository/index")
        names = [m["name"] for m in json.loads(body)]
        check(names == ["identity-isvc"], f"repository index: {names}")
        # The gRPC port the runtime declares for grpc-v2 answers too.
        import tritonclient.grpc as grpcclient
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        check(client.is_server_ready() and client.is_model_ready("identity-isvc"),
              "gRPC: not ready")
        print(f"runtime args serve a single-model directory as 'identity-isvc': probes, metrics, "
              f"v2 REST and gRPC answer")
    finally:
        check(server.stop() == 0, f"exit code:\n{''.join(server.output)}")


def test_runtime_args_serve_a_language_model(sluice, test_models, manifests, tmp):
    container = manifests["kserve/cluster-serving-runtime.yaml"][0]["spec"]["containers"][0]
    http_port, grpc_port = free_port(), free_port()
    model_dir = single_model_dir(test_models, "tiny_llm", os.path.join(tmp, "llm"))
    server = Server(sluice, runtime_args(container, model_dir, "smollm2", http_port, grpc_port))
    server.wait_listening()
    try:
        status, body, _ = request(http_port, "GET", container["readinessProbe"]["httpGet"]["path"])
        check(status == 200, f"readiness of a language model's server: {status} {body}")
        status, body, _ = request(http_port, "GET", "/v1/models")
        ids = [m["id"] for m in json.loads(body)["data"]]
        check(ids == ["smollm2"], f"/v1/models: {ids}")
        status, body, _ = request(http_port, "POST", "/v1/chat/completions", json.dumps(
            {"model": "smollm2", "max_tokens": 4,
             "messages": [{"role": "user", "content": "Hello"}]}))
        check(status == 200, f"chat completion: {status} {body}")
        usage = json.loads(body)["usage"]
        check(usage["completion_tokens"] >= 1, f"usage: {usage}")
        print("runtime args serve a language model's directory as 'smollm2' on the OpenAI routes")
    finally:
        check(server.stop() == 0, f"exit code:\n{''.join(server.output)}")


def test_deployment_args_serve_a_repository(sluice, test_models, manifests, tmp):
    deployment = manifests["k8s/deployment.yaml"][0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    repository = os.path.join(tmp, "repository")
    os.makedirs(repository)
    shutil.copytree(os.path.join(test_models, "identity"), os.path.join(repository, "identity"))
    http_port, grpc_port = free_port(), free_port()
    args = [a.replace("/mnt/models", repository).replace(f"--port={ports['http']}",
                                                         f"--port={http_port}")
            .replace(f"--grpc-port={ports['grpc']}", f"--grpc-port={grpc_port}")
            for a in container["args"]]
    server = Server(sluice, args)
    server.wait_listening()
    try:
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        check(int(annotations["prometheus.io/port"]) == ports["http"], "scrape port")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            check(container[probe]["httpGet"]["port"] == "http", f"{probe} port")
            status, _, _ = request(http_port, "GET", container[probe]["httpGet"]["path"])
            check(status == 200, f"deployment {probe}: {status}")
        status, body, _ = request(http_port, "GET", annotations["prometheus.io/path"])
        check(status == 200 and b"sluice_requests_total" in body, "deployment metrics")
        status, body, _ = v2_infer_identity(http_port, "identity")
        check(status == 200, f"deployment infer: {status} {body}")
        print("the Deployment's args serve a repository: probes, metrics, v2 answer")
    finally:
        check(server.stop() == 0, "deployment server exit code")


# --- 3. readiness leads shutdown ---------------------------------------------------------------

def test_readiness_leads_shutdown(sluice, test_models):
    http_port, grpc_port = free_port(), free_port()
    drain = 2.0
    server = Server(sluice, ["serve", "--model-repository", test_models, "--model", "identity",
                             "--model", "busy", "--port", str(http_port), "--grpc-port",
                             str(grpc_port), "--drain-delay", str(drain), "--shutdown-grace",
                             "20"])
    server.wait_listening()
    import tritonclient.grpc as grpcclient
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    check(grpc_client.is_server_ready(), "gRPC ready before SIGTERM")
    keep_alive = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
    status, _, response = v2_infer_identity(http_port, "identity", keep_alive)
    check(status == 200 and response.getheader("Connection", "").lower() != "close",
          "keep-alive before SIGTERM")
    # A client sending requests back to back on new connections from SIGTERM until the listener
    # refuses it: every connection accepted gets its answer.
    outcomes = {"answered": 0, "failed": [], "refused": False}

    def client_loop():
        body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                       "data": [0.5] * 16}]})
        while time.monotonic() - sigterm_at < drain + 10:
            try:
                conn = socket.create_connection(("127.0.0.1", http_port), timeout=30)
            except ConnectionRefusedError:
                outcomes["refused"] = True
                return
            # The request goes on the connection just made: one the listener took before it
            # closed is answered (a second connect could come after the close and be refused).
            client = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            client.sock = conn
            try:
                status, data, _ = request(http_port, "POST", "/v2/models/busy/infer", body, client)
                if status == 200:
                    outcomes["answered"] += 1
                else:
                    outcomes["failed"].append((status, data[:200]))
            except (OSError, http.client.HTTPException) as e:
                outcomes["failed"].append(repr(e))
            finally:
                conn.close()

    sigterm_at = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    thread = threading.Thread(target=client_loop)
    thread.start()
    # Readiness fails at once.
    while True:
        status, body, _ = request(http_port, "GET", "/v2/health/ready")
        if status == 503:
            break
        check(time.monotonic() - sigterm_at < 0.5, "readiness still 200 0.5 s after SIGTERM")
        time.sleep(0.01)
    not_ready_after = time.monotonic() - sigterm_at
    check(json.loads(body) == {"ready": False}, f"readiness body: {body}")
    check(not grpc_client.is_server_ready(), "gRPC ServerReady still true while draining")
    status, _, _ = request(http_port, "GET", "/v2/health/live")
    check(status == 200, "liveness must stay 200 while draining")
    # Requests are still answered: on the old keep-alive connection (which then closes), and on
    # a new connection.
    status, _, response = v2_infer_identity(http_port, "identity", keep_alive)
    check(status == 200, f"infer on a kept-alive connection while draining: {status}")
    check(response.getheader("Connection", "").lower() == "close",
          "no Connection: close while draining")
    keep_alive.close()
    status, _, response = v2_infer_identity(http_port, "identity")
    check(status == 200, f"infer on a new connection while draining: {status}")
    # After the delay the listener closes.
    while time.monotonic() - sigterm_at < drain + 5:
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=1).close()
        except OSError:
            break
        time.sleep(0.05)
    closed_after = time.monotonic() - sigterm_at
    check(drain - 0.1 <= closed_after <= drain + 3,
          f"the listener closed {closed_after:.2f} s after SIGTERM, drain delay {drain} s")
    thread.join(timeout=30)
    check(not outcomes["failed"] and outcomes["refused"] and outcomes["answered"] > 0,
          f"requests across the drain: {outcomes}")
    code = server.stop(timeout=30)
    check(code == 0, f"exit code {code}:\n{''.join(server.output)}")
    print(f"drain: not ready {not_ready_after * 1000:.0f} ms after SIGTERM, requests answered "
          f"with Connection: close, listener closed after {closed_after:.2f} s, "
          f"{outcomes['answered']} requests on new connections all answered until refused, exit 0")


def test_model_dir_errors(sluice, test_models, tmp):
    cases = [
        (["--model-name", "x"], "--model-name needs --model-dir"),
        (["--model-dir", os.path.join(tmp, "absent")], "is not a directory"),
        (["--model-dir", tmp, "--model-name", "empty"], "holds neither a config.yaml"),
        (["--model-dir", os.path.join(test_models, "identity"), "--model-name", "bad/name"],
         "not a valid model name"),
    ]
    for args, message in cases:
        result = subprocess.run([sluice, "serve", "--port", "0", *args], capture_output=True,
                                text=True, timeout=60)
        check(result.returncode == 2 and message in result.stderr,
              f"{args}: exit {result.returncode}, {result.stderr!r}")
    print("--model-dir / --model-name errors are clear")


def main():
    sluice, test_models, crd_dir = sys.argv[1:4]
    schemas = crd_schemas(crd_dir)
    manifests = load_manifests()
    test_manifests_validate(schemas, manifests)
    with tempfile.TemporaryDirectory() as tmp:
        test_model_dir_errors(sluice, test_models, tmp)
        test_runtime_args_serve_a_tensor_model(sluice, test_models, manifests, tmp)
        test_runtime_args_serve_a_language_model(sluice, test_models, manifests, tmp)
        test_deployment_args_serve_a_repository(sluice, test_models, manifests, tmp)
    test_readiness_leads_shutdown(sluice, test_models)
    print("deploy_test: all passed")


if __name__ == "__main__":
    main()
