#!/usr/bin/env python3
"""The prefix cache's disk tier in the real `sluice serve` (--llm-kv-cache-disk): a prompt's
blocks written to disk are read back after the server restarts (the OpenAI SDK's usage counts
them as cached) and give the very tokens and log-probabilities computing them gives; blocks
evicted from memory are read back the same way; a damaged file is dropped and the prompt computed
again, still exactly; another precision (another layout) does not see the files.

Usage: tests/kv_disk_test.py SLUICE TEST_MODELS
"""
import glob
import os
import random
import sys
import tempfile

import openai

from openai_api_test import check
from sluice_server import serving


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    rng = random.Random(11)
    prompt = [rng.randrange(10, 380) for _ in range(200)]  # 12 whole blocks, 8 tokens more.
    others = [[rng.randrange(10, 380) for _ in range(200)] for _ in range(2)]
    with tempfile.TemporaryDirectory() as work:
        repository = os.path.join(work, "models")
        disk = os.path.join(work, "kv")
        os.makedirs(repository)
        os.symlink(os.path.join(test_models, "tiny_llm"), os.path.join(repository, "tiny"))
        base = ["--model-repository", repository, "--llm-threads", "1",
                "--llm-precision", "fp32"]

        def ask(port, tokens):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            reply = client.completions.create(model="tiny", prompt=tokens, max_tokens=8,
                                              temperature=0, logprobs=5)
            return (reply.choices[0].text, reply.choices[0].logprobs.token_logprobs,
                    reply.usage.prompt_tokens_details.cached_tokens)

        # The reference: no disk tier, nothing cached.
        with serving(sluice, base) as port:
            text, logprobs, cached = ask(port, prompt)
            check(cached == 0, f"cached without a tier: {cached}")
        # With the tier: computed, and its 12 whole blocks written.
        with serving(sluice, base + ["--llm-kv-cache-disk", disk]) as port:
            check(ask(port, prompt)[:2] == (text, logprobs), "the first run differs")
        files = glob.glob(os.path.join(disk, "*", "*.kv"))
        check(len(files) >= 12, f"{len(files)} block files written")
        # After a restart: the prefix comes from disk, and the output is the same to the bit.
        with serving(sluice, base + ["--llm-kv-cache-disk", disk]) as port:
            again = ask(port, prompt)
            check(again[2] == 192, f"cached tokens after the restart: {again[2]}")
            check(again[:2] == (text, logprobs),
                  f"read back from disk: {again[:2]} != {(text, logprobs)}")
        # Evicted from memory (2 slots' worth of blocks, three long prompts), then read back.
        with serving(sluice, base + ["--llm-kv-cache-disk", disk, "--llm-slots", "1"]) as port:
            for other in others:
                ask(port, other)
            evicted = ask(port, prompt)
            check(evicted[2] >= 16 and evicted[:2] == (text, logprobs),
                  f"after eviction: cached {evicted[2]}, same output {evicted[:2] == (text, logprobs)}")
        # A damaged block: dropped, the prompt computed from there on, exactly as before.
        first = sorted(glob.glob(os.path.join(disk, "*", "*.kv")))
        for path in first:
            with open(path, "r+b") as f:
                f.seek(-3, os.SEEK_END)
                f.write(b"\xff\xfe\xfd")
        with serving(sluice, base + ["--llm-kv-cache-disk", disk]) as port:
            damaged = ask(port, prompt)
            check(damaged[2] == 0 and damaged[:2] == (text, logprobs),
                  f"damaged files: cached {damaged[2]}, same {damaged[:2] == (text, logprobs)}")
        # Another precision is another layout: nothing of the fp32 files is read.
        bf16 = ["--model-repository", repository, "--llm-threads", "1", "--llm-precision",
                "bf16", "--llm-kv-cache-disk", disk]
        with serving(sluice, bf16) as port:
            check(ask(port, prompt)[2] == 0, "bf16 read fp32 blocks")
        check(len(os.listdir(disk)) == 2, f"layouts: {os.listdir(disk)}")
    print("kv_disk_test: all checks passed")


if __name__ == "__main__":
    main()
