#!/usr/bin/env python3
"""`sluice serve SOURCE`, one model as people name it, through the OpenAI SDK: a GGUF file (served
under its stem), a split model's first part (under its stem without "-00001-of-00003"), a
Hugging Face folder (a sharded checkpoint), and a model id found in a Hugging Face cache laid out
as huggingface_hub lays it out (models--org--name/refs/main, snapshots/<revision>/), with
org/name:TAG picking one of a repository's GGUF files. Each answers greedily exactly as the same
files served from a model repository do. A model missing from the cache, a repository of several
GGUF files without a tag, and a file that is not GGUF are refused at start with an error naming
the problem.

Usage: tests/serve_source_test.py SLUICE TEST_MODELS
"""
import os
import shutil
import subprocess
import sys
import tempfile

import openai

from sluice_server import serving


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


def greedy(port, prompt="hello world", tokens=8):
    """The served model's id and its greedy completion of `prompt`."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    # Loaded ones: a repository's other language models are listed too, as "unloaded".
    ids = [m.id for m in client.models.list().data if m.status["value"] == "loaded"]
    check(len(ids) == 1, f"one model served, got {ids}")
    reply = client.completions.create(model=ids[0], prompt=prompt, max_tokens=tokens,
                                      temperature=0, extra_body={"ignore_eos": True})
    check(reply.usage.completion_tokens == tokens, f"{ids[0]}: {reply.usage}")
    return ids[0], reply.choices[0].text


def refused(sluice, args, env, expected):
    result = subprocess.run([sluice, "serve", "--port", "0", *args], capture_output=True,
                            text=True, timeout=60, env=env)
    output = result.stdout + result.stderr
    check(result.returncode != 0, f"serve {args} started: {output[-500:]}")
    check(expected in output, f"serve {args}: expected {expected!r} in {output[-800:]}")


def main():
    sluice, models = sys.argv[1], os.path.abspath(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="sluice_serve_source_")
    try:
        env = dict(os.environ, HF_HUB_CACHE=os.path.join(tmp, "hub"))
        # The reference: the same files served from a model repository.
        repository = os.path.join(tmp, "repository")
        os.makedirs(repository)
        os.symlink(os.path.join(models, "converted", "gguf_spm_llama_f32"), os.path.join(repository, "spm"))
        os.symlink(os.path.join(models, "tiny_llm"), os.path.join(repository, "tiny_llm"))
        with serving(sluice, ["--model-repository", repository, "--model", "spm"], env) as port:
            _, spm_text = greedy(port)
        with serving(sluice, ["--model-repository", repository, "--model", "tiny_llm"],
                     env) as port:
            _, tiny_text = greedy(port)

        # A GGUF file, served under its stem.
        gguf = os.path.join(tmp, "TinySPM-Llama-F32.gguf")
        shutil.copy(os.path.join(models, "converted", "gguf_spm_llama_f32", "model.gguf"), gguf)
        with serving(sluice, [gguf], env) as port:
            name, text = greedy(port)
        check(name == "TinySPM-Llama-F32", f"a file's name: {name}")
        check(text == spm_text, f"{gguf}: {text!r} against the repository's {spm_text!r}")
        with serving(sluice, [gguf, "--model-name", "tiny"], env) as port:
            check(greedy(port) == ("tiny", spm_text), "--model-name")

        # A split model, from its first part.
        split = os.path.join(tmp, "split")
        os.makedirs(split)
        for part in range(1, 4):
            shutil.copy(os.path.join(models, "converted", "gguf_spm_llama_split",
                                     f"model-{part:05d}-of-00003.gguf"),
                        os.path.join(split, f"TinySPM-{part:05d}-of-00003.gguf"))
        with serving(sluice, [os.path.join(split, "TinySPM-00001-of-00003.gguf")], env) as port:
            check(greedy(port) == ("TinySPM", spm_text), "a split model from its first part")
        refused(sluice, [os.path.join(split, "TinySPM-00002-of-00003.gguf")], env,
                "open its first part")

        # A Hugging Face folder: a sharded checkpoint.
        with serving(sluice, [os.path.join(models, "converted", "tiny_llm_sharded")], env) as port:
            check(greedy(port) == ("tiny_llm_sharded", tiny_text), "a sharded HF folder")

        # The Hugging Face cache: refs/main names the snapshot; :TAG picks a GGUF file.
        cached = os.path.join(tmp, "hub", "models--acme--TinySPM-GGUF")
        snapshot = os.path.join(cached, "snapshots", "4d1f2c9e")
        os.makedirs(snapshot)
        os.makedirs(os.path.join(cached, "snapshots", "0aa0b0c0"))  # An older revision.
        os.makedirs(os.path.join(cached, "refs"))
        with open(os.path.join(cached, "refs", "main"), "w") as f:
            f.write("4d1f2c9e")
        shutil.copy(gguf, os.path.join(snapshot, "TinySPM-F32.gguf"))
        shutil.copy(gguf, os.path.join(snapshot, "TinySPM-Q8_0.gguf"))
        with serving(sluice, ["acme/TinySPM-GGUF:f32"], env) as port:
            check(greedy(port) == ("acme/TinySPM-GGUF:f32", spm_text), "org/name:TAG")
        refused(sluice, ["acme/TinySPM-GGUF"], env, "holds 2 GGUF files")
        refused(sluice, ["acme/TinySPM-GGUF:Q2_K"], env, "0 GGUF files match 'Q2_K'")
        refused(sluice, ["acme/not-downloaded"], env, "not in the Hugging Face cache")
        refused(sluice, ["acme/not-downloaded"], env, "downloads nothing")
        # A folder holding one model, under its id.
        hf = os.path.join(tmp, "hub", "models--acme--tiny-llm")
        os.makedirs(os.path.join(hf, "snapshots", "c0ffee"))
        for name in os.listdir(os.path.join(models, "converted", "tiny_llm_sharded")):
            shutil.copy(os.path.join(models, "converted", "tiny_llm_sharded", name),
                        os.path.join(hf, "snapshots", "c0ffee", name))
        with serving(sluice, ["acme/tiny-llm"], env) as port:
            check(greedy(port) == ("acme/tiny-llm", tiny_text), "org/name of a HF folder")

        not_gguf = os.path.join(tmp, "notes.txt")
        with open(not_gguf, "w") as f:
            f.write("not a model")
        refused(sluice, [not_gguf], env, "not a GGUF model")
        print("serve sources: a GGUF file, a split model, a sharded HF folder and HF cache ids "
              "serve as the repository does; missing and ambiguous sources refused")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
