#!/usr/bin/env python3
"""Tool calling through the real `sluice serve` and the OpenAI Python SDK: a model whose chat
template renders tools (Hermes / Qwen2.5's shape); tool_choice "required" and a named function,
streamed and not, each call's arguments valid under its function's schema; parallel_tool_calls;
an agent's round trip (call, tool message, answer) with the history rendered through the
template; a strict function under "auto" (constrained once the reply opens a call); and the
refusals.

The tiny test model's weights are random: it never chooses to call a tool by itself, so "auto"
replies here are text. Finding calls in a model's own text is covered by generation_service_test
(a scripted model) and tool_calls_test.

Usage: tests/openai_tools_test.py SLUICE TEST_MODELS
"""
import json
import os
import sys

import jsonschema
import openai

from sluice_server import HERMES_TEMPLATE, serving, templated_model
from openai_api_test import check, raw

# Small: the tiny model's context is 512 tokens of about a character each.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def valid_calls(calls, names=("get_weather", "get_time")):
    check(calls, "no tool calls")
    for call in calls:
        check(call.type == "function" and call.id.startswith("call_"), f"call: {call}")
        check(call.function.name in names, f"name {call.function.name} not in {names}")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed_calls(stream):
    """The calls and finish reason a stream gives, rebuilt as a client does from its deltas."""
    calls, finish, content = {}, None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                # A call's first delta carries its id, type and name.
                check(delta.id and delta.type == "function" and delta.function.name,
                      f"first delta of call {delta.index}: {delta}")
                calls[delta.index] = {"id": delta.id, "name": delta.function.name,
                                      "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


def run(port):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused") as client:
        checks(client, port)


def checks(client, port):
    # One call a reply (parallel_tool_calls false): a random model that may always add another
    # call could otherwise run out of tokens before closing the array.
    common = {"model": "m", "max_tokens": 100, "temperature": 1.0, "parallel_tool_calls": False}

    # "required": a call of one of the tools, its arguments valid under the tool's schema.
    for seed in range(4):
        reply = client.chat.completions.create(messages=MESSAGES, tools=[WEATHER, TIME],
                                               tool_choice="required", seed=seed, **common)
        choice = reply.choices[0]
        check(choice.finish_reason == "tool_calls", f"required: {choice}")
        check(choice.message.content is None, f"required: content {choice.message.content!r}")
        valid_calls(choice.message.tool_calls)
        # The same request streamed gives the same calls, in deltas.
        calls, finish, content = streamed_calls(client.chat.completions.create(
            messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required", seed=seed,
            stream=True, **common))
        check(finish == "tool_calls" and content == "", f"streamed: {finish} {content!r}")
        check([(c["name"], json.loads(c["arguments"])) for c in calls] ==
              [(c.function.name, json.loads(c.function.arguments))
               for c in choice.message.tool_calls], f"streamed {calls} against {choice}")

    # A named function: that function, whatever else is offered.
    for seed in range(3):
        reply = client.chat.completions.create(
            messages=MESSAGES, tools=[WEATHER, TIME], seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_time"}}, **common)
        valid_calls(reply.choices[0].message.tool_calls, names=("get_time",))
        check(reply.choices[0].finish_reason == "tool_calls", f"named: {reply}")

    # parallel_tool_calls false: one call a reply.
    for seed in range(3):
        reply = client.chat.completions.create(messages=MESSAGES, tools=[WEATHER, TIME],
                                               tool_choice="required", seed=seed, **common)
        check(len(reply.choices[0].message.tool_calls) == 1, f"one call: {reply}")
    # Allowed (the default), a reply may hold several calls, numbered in order when streamed.
    most = 0
    for seed in range(8):
        calls, finish, content = streamed_calls(client.chat.completions.create(
            messages=MESSAGES, tools=[TIME], tool_choice="required", seed=seed, stream=True,
            **{**common, "parallel_tool_calls": True, "max_tokens": 240}))
        if finish == "tool_calls":
            most = max(most, len(calls))
            for c in calls:
                jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
        else:  # Cut short: the calls it completed, never the unfinished array as text.
            check(finish == "length" and content == "", f"{finish} {content!r}")
            for c in calls:
                jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    check(most >= 2, f"no reply made parallel calls (most: {most})")

    # An agent's round trip: the call, the tool's answer, then the model answers in text.
    reply = client.chat.completions.create(messages=MESSAGES, tools=[WEATHER],
                                           tool_choice="required", seed=1, **common)
    call = reply.choices[0].message.tool_calls[0]
    history = MESSAGES + [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    answer = client.chat.completions.create(messages=history, tools=[WEATHER], tool_choice="none",
                                            seed=1, **common)
    check(answer.choices[0].message.tool_calls is None, f"answer: {answer}")
    check(answer.choices[0].finish_reason in ("stop", "length") and
          answer.choices[0].message.content, f"answer: {answer}")
    # The history went through the model's template: the call as the template writes calls, and
    # the tool's answer in its tool_response block.
    status, _, body = raw(port, "POST", "/tokenize", {"model": "m", "messages": history}, key=None)
    check(status == 200, f"tokenize: {status} {body[:200]}")
    status, _, body = raw(port, "POST", "/detokenize",
                          {"model": "m", "tokens": json.loads(body)["tokens"]}, key=None)
    prompt = json.loads(body)["prompt"]
    check(f'{{"name": "get_weather", "arguments": {json.dumps(json.loads(call.function.arguments))}}}'
          in prompt, f"the call in the prompt: {prompt}")
    check("<tool_response>\n18 degrees, sunny\n</tool_response>" in prompt, f"prompt: {prompt}")

    # A required reply cut by max_tokens: its complete calls (a model repeating its call, as
    # small models do), finish_reason length, never the array's text as content.
    cut = 0
    for seed in range(8):
        reply = client.chat.completions.create(
            messages=MESSAGES, tools=[TIME], tool_choice="required", seed=seed,
            **{**common, "parallel_tool_calls": True, "max_tokens": 60})
        choice = reply.choices[0]
        if choice.finish_reason == "length":
            cut += 1
            check(choice.message.content in (None, ""), f"cut: {choice}")
            if choice.message.tool_calls:
                valid_calls(choice.message.tool_calls, names=("get_time",))
    check(cut > 0, "no reply was cut by max_tokens")

    # "auto": the random model answers in text; no call is invented.
    reply = client.chat.completions.create(messages=MESSAGES, tools=[WEATHER], tool_choice="auto",
                                           seed=3, **common)
    check(reply.choices[0].message.tool_calls is None and
          reply.choices[0].finish_reason in ("stop", "length"), f"auto: {reply}")

    # What is not served is refused by name.
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    for body, param in [
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}}, "tool_choice"),
            ({"tools": [WEATHER], "tool_choice": "required",
              "response_format": {"type": "json_object"}}, "response_format"),
            ({"tools": [{"type": "file_search"}]}, "tools")]:
        status, _, data = raw(port, "POST", "/v1/chat/completions",
                              {"model": "m", "messages": MESSAGES, **body}, key=None)
        error = json.loads(data).get("error", {})
        check(status == 400 and error.get("param") == param, f"{body}: {status} {data[:300]}")
    # A strict function under "auto": the reply is free until it opens a call, which then
    # follows the schema.
    for seed in (1, 2):
        reply = client.chat.completions.create(messages=MESSAGES, tools=[strict],
                                               tool_choice="auto", seed=seed, **common)
        if reply.choices[0].message.tool_calls:
            valid_calls(reply.choices[0].message.tool_calls, names=("get_weather",))
    # A strict function under "required" is served (every call follows its schema).
    reply = client.chat.completions.create(messages=MESSAGES, tools=[strict],
                                           tool_choice="required", seed=5, **common)
    valid_calls(reply.choices[0].message.tool_calls, names=("get_weather",))


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with templated_model(test_models, HERMES_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1",
                              "--llm-context-length", "512"]) as port:
            run(port)
    print("openai_tools_test: all checks passed")


if __name__ == "__main__":
    main()
