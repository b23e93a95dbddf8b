#!/usr/bin/env python3
"""Prompt-lookup speculative decoding against plain decoding, on a summarisation-style workload.

Starts two `sluice serve` processes on 127.0.0.1 for one model directory, one plain and one with
`--llm-speculative-tokens N`, and sends both the same requests, one at a time (1 stream): a chat
asking to summarise a text of a few hundred tokens, quoting it, greedy, streamed. Requests
alternate between the servers (A B B A ...), so drift falls on both alike. Checks that each
prompt's output is the same text from both, and prints for each the output tokens/s (completion
tokens over the request's wall time, prefill included) and the decoding tokens/s (the tokens
after the first over the time after it, the rate llama.cpp's server reports for generation),
their ratios, and the share of drafts kept (from /metrics). With --file-layout, two more servers
run the same pair on the GGUF file's block layout (SLUICE_QUANT_REPACK=0: weights not repacked
at load), in the same rotation. The servers are stopped by their PIDs.

Usage: benchmarks/llm_speculative.py [--sluice build/sluice] [--model-dir models/smollm2]
           [--speculative-tokens 8] [--rounds 3] [--max-tokens 160] [--file-layout]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, free_port, metric  # noqa: E402

TEXTS = [
    "The river begins as snowmelt high in the mountains, where small streams gather in narrow "
    "valleys. Through the spring the water runs fast and cold, carrying gravel and sand down to "
    "the plains. In the lowlands the river slows, spreads into wide bends and feeds the marshes "
    "that shelter birds through the winter. Farmers along its banks have used the floods for "
    "centuries: the silt they leave behind makes the fields rich, and the old canals still carry "
    "water to the orchards. Today the river also turns three power stations, and its lower reach "
    "is a protected park where fishing is allowed only in the autumn.",
    "Bread needs four things: flour, water, salt and yeast. The baker mixes them into a dough and "
    "kneads it until it is smooth and elastic, which builds the gluten that holds the gas the "
    "yeast makes. The dough then rests in a warm place and doubles in size. After it is shaped, it "
    "rises a second time, and a few cuts on the top let it open in the oven. A hot oven with steam "
    "gives a thin, crisp crust; a cooler, dry oven gives a soft one. Good bread cools on a rack "
    "for an hour before it is cut, because the crumb is still setting as the steam escapes.",
    "The library opens at nine in the morning and closes at eight in the evening from Monday to "
    "Friday. On Saturday it opens at ten and closes at four, and on Sunday it is closed. Members "
    "may borrow up to ten books at a time for three weeks, and may renew them twice online unless "
    "another member has reserved them. Late returns cost ten cents a day per book. The reading "
    "room on the second floor is quiet at all times, and the study rooms on the third floor can "
    "be booked for two hours a day. Children's story time is every Wednesday at four.",
    "A good night's sleep starts hours before bed. Daylight in the morning sets the body's clock, "
    "and a walk outside helps more than any supplement. Coffee after lunch stays in the blood "
    "well into the night, so it is best kept to the morning. A cool, dark and quiet bedroom makes "
    "it easier to fall asleep, and screens are best put away an hour before bed. Going to bed "
    "and getting up at the same time every day, weekends included, keeps the clock steady. If "
    "sleep does not come within twenty minutes, getting up and reading for a while helps.",
]


def chat(port, model, text, max_tokens):
    """One streamed request: (content, completion tokens, seconds, seconds to the first token)."""
    body = json.dumps({
        "model": model, "temperature": 0, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content":
                      "Summarise the following text. Quote its key sentences word for word.\n\n"
                      + text}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    first, parts, tokens = None, [], 0
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: "):])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - start
                    parts.append(piece)
    seconds = time.perf_counter() - start
    return "".join(parts), tokens, seconds, first if first is not None else seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-dir", default="models/smollm2")
    parser.add_argument("--speculative-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--file-layout", action="store_true",
                        help="also run both on the file's block layout (SLUICE_QUANT_REPACK=0)")
    args = parser.parse_args()
    name = os.path.basename(os.path.normpath(args.model_dir))
    repository = os.path.dirname(os.path.abspath(args.model_dir))
    servers = {}
    with tempfile.TemporaryFile("w") as log:
        try:
            kinds = [("plain", 0, None), ("speculative", args.speculative_tokens, None)]
            if args.file_layout:
                kinds += [("plain, file layout", 0, {"SLUICE_QUANT_REPACK": "0"}),
                          ("speculative, file layout", args.speculative_tokens,
                           {"SLUICE_QUANT_REPACK": "0"})]
            for label, drafts, env in kinds:
                port = free_port()
                servers[label] = Server(label, [args.sluice, "serve", "--model-repository",
                                                repository, "--model", name, "--port", str(port),
                                                "--llm-speculative-tokens", str(drafts),
                                        # The texts repeat each round: every request pays its
                                        # prompt, as on the first.
                                        "--llm-prefix-caching", "off"],
                                        "/v1/models", port, log, env)
            for server in servers.values():  # Warm-up, untimed.
                chat(server.port, name, TEXTS[0], 8)
            rates = {label: [] for label in servers}
            decode_rates = {label: [] for label in servers}
            outputs = {label: {} for label in servers}
            for round_index in range(args.rounds):
                for i, text in enumerate(TEXTS):
                    order = list(servers)
                    if (round_index + i) % 2:
                        order.reverse()
                    for label in order:
                        content, tokens, seconds, first = chat(servers[label].port, name, text,
                                                               args.max_tokens)
                        rates[label].append(tokens / seconds)
                        decode_rates[label].append((tokens - 1) / (seconds - first))
                        outputs[label].setdefault(i, content)
                        if outputs[label][i] != content:
                            sys.exit(f"{label}: text {i} gave two different outputs")
            same = sum(all(outputs[label][i] == outputs["plain"][i] for label in servers)
                       for i in outputs["plain"])
            proposed = metric(servers["speculative"].port, "sluice_llm_draft_tokens_total")
            kept = metric(servers["speculative"].port, "sluice_llm_accepted_draft_tokens_total")
        finally:
            for server in servers.values():
                server.stop()
    plain, fast = statistics.median(rates["plain"]), statistics.median(rates["speculative"])
    decode = {label: statistics.median(values) for label, values in decode_rates.items()}
    print(f"{args.model_dir}, 1 stream, {len(TEXTS)} texts x {args.rounds} rounds, greedy, "
          f"max_tokens {args.max_tokens}, {args.speculative_tokens} drafts a step")
    print(f"identical outputs (every server): {same} of {len(TEXTS)}")
    print(f"output tokens/s, prefill included (median): plain {plain:.1f}, speculative "
          f"{fast:.1f}: {fast / plain:.2f} x")
    print(f"decoding tokens/s, after the first token (median): plain {decode['plain']:.1f}, "
          f"speculative {decode['speculative']:.1f}: "
          f"{decode['speculative'] / decode['plain']:.2f} x")
    for label in servers:
        if "file layout" in label:
            rate = statistics.median(rates[label])
            print(f"{label}: {rate:.1f} output tokens/s (plain / this: {plain / rate:.2f} x, "
                  f"speculative / this: {fast / rate:.2f} x); decoding {decode[label]:.1f}")
    print(f"drafts kept: {kept:.0f} of {proposed:.0f} ({kept / max(proposed, 1):.0%})")
    if same != len(TEXTS):
        sys.exit("speculative decoding changed an output")


if __name__ == "__main__":
    main()
