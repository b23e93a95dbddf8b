#!/usr/bin/env python3
"""Checks a running Sluice (or any KServe v2 server) with NVIDIA's clients: tritonclient.http
(binary and JSON tensors) and tritonclient.grpc must report the same metadata and return
identical outputs for each model, on the same random inputs.

Usage: tools/tritonclient_check.py HTTP_PORT GRPC_PORT MODEL... [--batch N]
e.g.   build/sluice serve --model-repository models --port 8000 --grpc-port 8001 &
       .venv/bin/python tools/tritonclient_check.py 8000 8001 resnet18 fashion_mnist
"""
import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("http_port", type=int)
    parser.add_argument("grpc_port", type=int)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    http = httpclient.InferenceServerClient(f"127.0.0.1:{args.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{args.grpc_port}")
    rng = np.random.default_rng(3)
    failed = False
    for model in args.models:
        grpc_meta = grpc.get_model_metadata(model, as_json=True)
        http_meta = http.get_model_metadata(model)
        tensors = lambda meta, key: [(t["name"], t["datatype"], [int(d) for d in t["shape"]])
                                     for t in meta[key]]
        same_meta = all(tensors(grpc_meta, k) == tensors(http_meta, k)
                        for k in ("inputs", "outputs"))
        inputs = {}
        for name, dtype, shape in tensors(grpc_meta, "inputs"):
            shape = [args.batch] + shape[1:]
            inputs[name] = (dtype, rng.standard_normal(shape).astype(np.float32) if dtype == "FP32"
                            else rng.integers(0, 100, shape).astype(np.dtype(dtype.lower())))
        outputs = [name for name, _, _ in tensors(grpc_meta, "outputs")]

        def run(module, binary):
            request = []
            for name, (dtype, x) in inputs.items():
                t = module.InferInput(name, list(x.shape), dtype)
                if module is httpclient:
                    t.set_data_from_numpy(x, binary_data=binary)
                else:
                    t.set_data_from_numpy(x)
                request.append(t)
            wanted = [module.InferRequestedOutput(o, binary_data=binary) if module is httpclient
                      else module.InferRequestedOutput(o) for o in outputs]
            client = http if module is httpclient else grpc
            result = client.infer(model, request, outputs=wanted)
            return {o: result.as_numpy(o) for o in outputs}

        by_grpc = run(grpcclient, True)
        by_http = run(httpclient, True)
        by_json = run(httpclient, False)
        same = all(np.array_equal(by_grpc[o], by_http[o]) and np.array_equal(by_grpc[o], by_json[o])
                   for o in outputs)
        shapes = {o: list(by_grpc[o].shape) for o in outputs}
        print(f"{model}: inputs {[(n, list(x.shape)) for n, (_, x) in inputs.items()]}, outputs {shapes}; "
              f"metadata the same: {same_meta}; grpc == http binary == http JSON: {same}")
        failed |= not (same and same_meta)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
