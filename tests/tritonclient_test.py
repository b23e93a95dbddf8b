#!/usr/bin/env python3
"""NVIDIA's Triton clients against the real `sluice serve`: tritonclient.http (KServe v2 REST
with the binary-data extension) and tritonclient.grpc (the KServe v2 gRPC service) give the same
health, metadata and outputs for the test models, and the same errors.

Usage: tests/tritonclient_test.py SLUICE TEST_MODELS
"""
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sluice_server import serving


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def infer(client, module, model, inputs, outputs=None, binary=True):
    """Runs `model` on {name: array} through `client`; returns {output name: array}."""
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = None
    if outputs:
        requested = [module.InferRequestedOutput(name, binary_data=binary)
                     if module is httpclient else module.InferRequestedOutput(name)
                     for name in outputs]
    result = client.infer(model, tensors, outputs=requested, request_id="req-42")
    check(result.get_response()["id"] if module is httpclient else result.get_response().id,
          "the request id is echoed")
    names = outputs or [o["name"] for o in client.get_model_metadata(model)["outputs"]] \
        if module is httpclient else outputs or [o.name for o in client.get_model_metadata(model).outputs]
    return {name: result.as_numpy(name) for name in names}


def main():
    sluice, models = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(7)
    with serving(sluice, ["--model-repository", models, "--grpc-port", "0"]) as (port, grpc_port):
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

        for client in (http, grpc):
            check(client.is_server_live() and client.is_server_ready(), "server live and ready")
            check(client.is_model_ready("identity"), "identity ready")
        http_meta = http.get_model_metadata("tiny_cnn")
        grpc_meta = grpc.get_model_metadata("tiny_cnn", as_json=True)
        for key in ("name", "platform", "inputs", "outputs"):
            check(http_meta[key] == grpc_meta[key] if key != "inputs" and key != "outputs" else
                  [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in http_meta[key]]
                  == [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc_meta[key]],
                  f"metadata {key}: {http_meta[key]} vs {grpc_meta[key]}")
        check(grpc.get_server_metadata().name == http.get_server_metadata()["name"] == "sluice",
              "server metadata")

        cases = [
            ("identity", {"input": rng.standard_normal((5, 16), dtype=np.float32)}, None),
            ("tiny_cnn", {"input": rng.standard_normal((4, 3, 16, 16), dtype=np.float32)}, None),
            ("multi_io", {"a": rng.standard_normal((3, 4), dtype=np.float32),
                          "b": rng.standard_normal((3, 4), dtype=np.float32)}, ["product"]),
        ]
        for model, inputs, outputs in cases:
            by_http = infer(http, httpclient, model, inputs, outputs)
            by_http_json = infer(http, httpclient, model, inputs, outputs, binary=False)
            by_grpc = infer(grpc, grpcclient, model, inputs, outputs)
            check(by_http.keys() == by_grpc.keys() == by_http_json.keys(),
                  f"{model}: outputs {by_http.keys()} vs {by_grpc.keys()}")
            for name in by_http:
                check(by_http[name].shape == by_grpc[name].shape,
                      f"{model}.{name}: shapes {by_http[name].shape} vs {by_grpc[name].shape}")
                check(np.array_equal(by_http[name], by_grpc[name]),
                      f"{model}.{name}: REST and gRPC differ")
                check(np.array_equal(by_http[name], by_http_json[name]),
                      f"{model}.{name}: binary and JSON REST differ")
            if model == "identity":
                check(np.array_equal(by_grpc["output"], inputs["input"]), "identity is identity")
            if model == "multi_io":
                check(np.allclose(by_grpc["product"], inputs["a"] * inputs["b"]), "product")

        # The same refusals through both clients: an unknown model and a wrong datatype.
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            try:
                infer(client, module, "no_such_model", {"input": np.zeros((1, 16), np.float32)})
                check(False, "unknown model accepted")
            except InferenceServerException as e:
                check("unknown model 'no_such_model'" in e.message(), e.message())
                check(e.status() in ("404", "StatusCode.NOT_FOUND"), e.status())
            bad = module.InferInput("input", [1, 16], "INT32")
            bad.set_data_from_numpy(np.zeros((1, 16), np.int32))
            try:
                client.infer("identity", [bad])
                check(False, "wrong datatype accepted")
            except InferenceServerException as e:
                check("does not match the model's FP32" in e.message(), e.message())
                check(e.status() in ("400", "StatusCode.INVALID_ARGUMENT"), e.status())
        grpc.close()
        http.close()
    print("tritonclient http and grpc: same outputs")


if __name__ == "__main__":
    main()
