#!/usr/bin/env python3
"""KV events from the real `sluice serve`, read as a cache-aware router reads vLLM's: a ZeroMQ SUB
socket (pyzmq) on the topic, each payload decoded by msgspec into the EventBatch layout vLLM's
subscribers declare (array_like, tagged events), a DEALER on the replay socket for what the
subscriber missed. While requests run through the OpenAI SDK it checks that the stored blocks
carry the prompts' tokens in whole blocks, chained by their parents' hashes; that a prompt whose
prefix is cached stores no block again; that blocks evicted for other prompts are announced
removed (and were announced stored); that a prompt computed again after its eviction stores the
same hashes; that the replay gives back the very batches the subscriber received, from the
AllBlocksCleared the model's load published before anyone listened; and that unloading the model
clears its topic.

Usage: tests/kv_events_test.py SLUICE TEST_MODELS
"""
import os
import random
import re
import sys
import tempfile
import time

import msgspec
import openai
import zmq

from openai_api_test import check, raw
from sluice_server import serving

BLOCK = 16  # tiny_llm's kv_block_size.


# vLLM's KV-event wire format (vllm.distributed.kv_events), declared as its subscribers declare it.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


class Router:
    """What a router learns from the stream: the cached blocks' hashes, and the tokens of each."""

    def __init__(self, sub, topic):
        self.sub, self.topic = sub, topic
        self.cached = {}    # hash -> (parent hash or None, its block's tokens)
        self.stored = {}    # every hash ever stored -> its tokens
        self.received = {}  # sequence -> payload bytes
        self.last_sequence = -1
        self.batches = []

    def apply(self, batch):
        self.batches.append(batch)
        for event in batch.events:
            if isinstance(event, BlockStored):
                check(event.block_size == BLOCK and event.medium == "CPU" and
                      event.lora_id is None and event.lora_name is None, f"stored: {event}")
                check(len(event.token_ids) == BLOCK * len(event.block_hashes),
                      f"stored tokens are not whole blocks: {event}")
                check(event.parent_block_hash is None or event.parent_block_hash in self.stored,
                      f"a parent never stored: {event}")
                parent = event.parent_block_hash
                for i, block_hash in enumerate(event.block_hashes):
                    check(block_hash not in self.cached, f"stored twice: {block_hash}")
                    tokens = event.token_ids[i * BLOCK:(i + 1) * BLOCK]
                    self.cached[block_hash] = (parent, tokens)
                    self.stored[block_hash] = tokens
                    parent = block_hash
            elif isinstance(event, BlockRemoved):
                check(event.medium == "CPU", f"removed: {event}")
                for block_hash in event.block_hashes:
                    check(block_hash in self.cached, f"removed but not cached: {block_hash}")
                    del self.cached[block_hash]
            else:
                self.cached.clear()

    def drain(self, until=None, timeout=30):
        """Applies batches as they come; returns those received, up to `until` one holding."""
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sub.poll(100 if until else 300):
                if until is None:
                    return got
                continue
            topic, sequence, payload = self.sub.recv_multipart()
            check(topic.decode() == self.topic, f"topic {topic!r}, not {self.topic!r}")
            sequence = int.from_bytes(sequence, "big")
            check(sequence == self.last_sequence + 1 or self.last_sequence < 0,
                  f"sequence {sequence} after {self.last_sequence}")
            self.last_sequence = sequence
            self.received[sequence] = payload
            batch = DECODER.decode(payload)
            self.apply(batch)
            got.append(batch)
            if until is not None and until(batch):
                return got
        check(until is None, "timed out waiting for KV events")
        return got

    def chain_of(self, prompt):
        """The hashes of the cached blocks that hold `prompt`'s prefix, in order."""
        chain, parent = [], None
        for b in range(len(prompt) // BLOCK):
            block = prompt[b * BLOCK:(b + 1) * BLOCK]
            found = [h for h, (p, tokens) in self.cached.items() if p == parent and tokens == block]
            if not found:
                break
            chain.append(found[0])
            parent = found[0]
        return chain


def stores(batch):
    return [e for e in batch.events if isinstance(e, BlockStored)]


def replay(context, endpoint, start, topic):
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big"), topic.encode()])
    out = {}
    while dealer.poll(10000):
        empty, sequence, payload = dealer.recv_multipart()
        check(empty == b"", "replay: no empty delimiter")
        sequence = int.from_bytes(sequence, "big", signed=True)
        if sequence == -1:
            check(payload == b"", "replay: the end mark has a payload")
            dealer.close(linger=0)
            return out
        out[sequence] = payload
    raise AssertionError("replay: no end mark")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    rng = random.Random(7)
    # Prompts of 100 token ids (6 whole blocks); 16 blocks in all (1 slot x 256 tokens), so the
    # third distinct prompt evicts blocks of the first.
    prompts = [[rng.randrange(10, 380) for _ in range(100)] for _ in range(3)]
    with tempfile.TemporaryDirectory() as repository:
        os.symlink(os.path.join(test_models, "tiny_llm"), os.path.join(repository, "tiny"))
        startup = []
        with serving(sluice, ["--model-repository", repository, "--model", "tiny",
                              "--model-control", "--llm-slots", "1", "--llm-threads", "1",
                              "--kv-events", "tcp://127.0.0.1:*",
                              "--kv-events-replay", "tcp://127.0.0.1:*",
                              "--kv-events-topic", "kv@test@{model}"],
                     startup=startup) as port:
            match = re.search(r"KV events on (tcp://127\.0\.0\.1:\d+), replay on "
                              r"(tcp://127\.0\.0\.1:\d+)", "".join(startup))
            check(match, f"no KV events line: {''.join(startup)}")
            context = zmq.Context()
            sub = context.socket(zmq.SUB)
            sub.connect(match.group(1))
            sub.setsockopt(zmq.SUBSCRIBE, b"kv@test@tiny")
            router = Router(sub, "kv@test@tiny")
            time.sleep(0.5)  # The subscription reaches the publisher.

            # What was published before the subscriber connected, from the replay socket: the
            # load's AllBlocksCleared first.
            early = replay(context, match.group(2), 0, "kv@test@tiny")
            check(0 in early, f"replay from 0: {sorted(early)}")
            first = DECODER.decode(early[0])
            check(len(first.events) == 1 and isinstance(first.events[0], AllBlocksCleared) and
                  first.data_parallel_rank == 0 and abs(first.ts - time.time()) < 120,
                  f"the first batch: {first}")
            for sequence in sorted(early):
                router.apply(DECODER.decode(early[sequence]))
                router.received[sequence] = early[sequence]
                router.last_sequence = sequence

            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")

            def complete(prompt):
                reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                                  temperature=0)
                check(reply.usage.prompt_tokens == len(prompt), f"usage: {reply.usage}")

            # Prompt 0: its 6 whole blocks stored, tokens and chain as sent.
            complete(prompts[0])
            router.drain(until=lambda b: stores(b))
            router.drain()
            chain0 = router.chain_of(prompts[0])
            check(len(chain0) == 6, f"prompt 0's cached chain: {len(chain0)} blocks")
            stored_tokens = [t for b in router.batches for e in stores(b) for t in e.token_ids]
            check(stored_tokens[:96] == prompts[0][:96], "the stored tokens are not prompt 0's")
            check(router.stored[chain0[0]] == prompts[0][:BLOCK], "the first block's tokens")

            # Prompt 0 again: its prefix is cached, so nothing of it is stored again.
            before = len(router.batches)
            complete(prompts[0])
            complete(prompts[1])
            router.drain(until=lambda b: any(e.token_ids[:BLOCK] == prompts[1][:BLOCK]
                                             for e in stores(b)))
            router.drain()
            again = [e for b in router.batches[before:] for e in stores(b)
                     if set(e.block_hashes) & set(chain0)]
            check(not again, f"prompt 0's cached blocks stored again: {again}")

            # Prompt 2 needs blocks the pool only has by evicting: prompt 0's oldest go, and the
            # router is told.
            complete(prompts[2])
            router.drain(until=lambda b: any(isinstance(e, BlockRemoved) for e in b.events))
            router.drain()
            removed = [h for b in router.batches for e in b.events
                       if isinstance(e, BlockRemoved) for h in e.block_hashes]
            check(set(removed) & set(chain0), f"none of prompt 0's blocks removed: {removed}")
            check(len(router.chain_of(prompts[2])) == 6, "prompt 2's chain is not cached")
            check(len(router.cached) <= 16, f"{len(router.cached)} cached blocks of 16")
            check(len(router.chain_of(prompts[0])) < 6, "prompt 0 still wholly cached")

            # Prompt 0 once more: computed again, its blocks stored under the same hashes.
            complete(prompts[0])
            router.drain(until=lambda b: any(e.token_ids[:BLOCK] == prompts[0][:BLOCK]
                                             for e in stores(b)) or
                         len(router.chain_of(prompts[0])) == 6)
            router.drain()
            check(router.chain_of(prompts[0]) == chain0,
                  "prompt 0 computed again is not stored under the same hashes")

            # The replay gives back byte for byte what the subscriber received.
            replayed = replay(context, match.group(2), 0, "kv@test@tiny")
            check(replayed == router.received,
                  f"replay: {len(replayed)} batches, received {len(router.received)}; sequences "
                  f"{sorted(set(replayed) ^ set(router.received))} differ")

            # Unloading the model clears its topic.
            status, _, data = raw(port, "POST", "/v2/repository/models/tiny/unload", {}, key=None)
            check(status == 200, f"unload: {status} {data[:200]}")
            router.drain(until=lambda b: any(isinstance(e, AllBlocksCleared) for e in b.events))
            check(not router.cached, "blocks left cached after the unload")
            print(f"kv_events: {len(router.received)} batches, {len(router.stored)} blocks stored, "
                  f"{len(removed)} removed, replay matched")
            sub.close(linger=0)
            context.term()


if __name__ == "__main__":
    main()
