#!/usr/bin/env bash
# Starts `sluice serve` with a language model on 127.0.0.1 (a free port), has a short streamed
# chat with it through the OpenAI Python SDK, prints it with the time to first token and the
# tokens per second, and stops the server by its PID. With SLUICE_URL (http://127.0.0.1:PORT), the
# server already running there is used instead (and left running).
# The chat is greedy, under a system prompt asking for brief, accurate answers: SmolLM2-135M's
# greedy answer without one (its template's default) to "What is the capital of France?" is a
# loop of French words; with it, "The capital of France is Paris."
# With RESULTS_DIR, a short `sluice bench --llm` (1 and 4 streams) follows, its results there.
# Usage: scripts/llm-chat-demo.sh SLUICE_BINARY MODEL_REPOSITORY MODEL [PYTHON [RESULTS_DIR]]
set -euo pipefail

sluice=$1
repository=$2
model=$3
python=${4:-.venv/bin/python}
results=${5:-}

. "$(dirname "$0")/lib/serve.sh"
use_or_start_server "$sluice" --model-repository "$repository" --model "$model"

"$python" - "$port" "$model" <<'PY'
import sys, time
import openai

port, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
messages = [{"role": "system",
             "content": "You are a helpful assistant. Answer briefly and accurately."}]
for question in ["What is the capital of France?", "Name three things to see there."]:
    messages.append({"role": "user", "content": question})
    print(f"\nuser: {question}\nassistant: ", end="", flush=True)
    start = time.time()
    first = None
    reply = ""
    usage = None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=96,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.time()
                reply += choice.delta.content
                print(choice.delta.content, end="", flush=True)
    end = time.time()
    messages.append({"role": "assistant", "content": reply})
    decode = (usage.completion_tokens - 1) / (end - first) if first and usage.completion_tokens > 1 else 0
    print(f"\n  [{usage.prompt_tokens} prompt tokens, {usage.completion_tokens} generated; "
          f"first token after {1000 * (first - start):.0f} ms, then {decode:.1f} tokens/s]")
PY

if [[ -n $results ]]; then
  "$sluice" bench --llm --url "http://127.0.0.1:$port" --model "$model" --concurrency 1,4 \
      --requests 4 --prompt-tokens 64 --output-tokens 32 --results-dir "$results"
fi
