#!/usr/bin/env python3
"""Anthropic's Messages API through the real `sluice serve` and Anthropic's own Python SDK (as
Claude-Code-style tools and agents speak it): messages.create and messages.stream give the same
text; a tool_use -> tool_result round trip with the history rendered through the model's
template; tool_choice any / tool / disable_parallel_tool_use; output_config's JSON schema;
stop_sequences; count_tokens equal to what a request's usage counts; the prefix cache's hits as
cache_read_input_tokens; x-api-key; a thinking template's thinking blocks; errors in Anthropic's
shape, raised by the SDK as its own exception types.

Usage: tests/anthropic_api_test.py SLUICE TEST_MODELS
"""
import json
import os
import sys

import anthropic
import jsonschema

from sluice_server import HERMES_TEMPLATE, serving, templated_model
from openai_api_test import THINKING_TEMPLATE, check, raw

API_KEY = "anthropic-test-key"
WEATHER = {"name": "get_weather", "description": "Weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
               "required": ["city", "unit"]}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {
    "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}
SCHEMAS = {t["name"]: t["input_schema"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# Greedy: the newest SDK has no temperature parameter; the server's default (1.0) would sample.
GREEDY = {"extra_body": {"temperature": 0}}


def tool_uses(message, names=("get_weather", "get_time")):
    uses = [b for b in message.content if b.type == "tool_use"]
    check(uses, f"no tool_use block: {message}")
    for use in uses:
        check(use.name in names, f"tool {use.name} not in {names}")
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def checks(client, port):
    # create and stream: the same greedy text, the same usage.
    message = client.messages.create(model="m", max_tokens=24, messages=ASK, **GREEDY)
    check(message.type == "message" and message.role == "assistant" and message.id.startswith(
        "msg_"), f"create: {message}")
    check(message.stop_reason in ("end_turn", "max_tokens"), f"stop_reason: {message}")
    check(message.usage.output_tokens > 0, f"usage: {message.usage}")
    pieces = []
    with client.messages.stream(model="m", max_tokens=24, messages=ASK, **GREEDY) as stream:
        for text in stream.text_stream:
            pieces.append(text)
        final = stream.get_final_message()
    check("".join(pieces) == text_of(message) == text_of(final),
          f"streamed {''.join(pieces)!r} against {text_of(message)!r}")
    check(final.stop_reason == message.stop_reason and
          final.usage.output_tokens == message.usage.output_tokens, f"{final} against {message}")

    # count_tokens counts the prompt a request runs: usage's input plus its cache reads.
    counted = client.messages.count_tokens(model="m", messages=ASK, tools=[WEATHER],
                                           system="Be brief.")
    message = client.messages.create(model="m", max_tokens=4, messages=ASK, tools=[WEATHER],
                                     system="Be brief.", **GREEDY)
    used = message.usage.input_tokens + message.usage.cache_read_input_tokens
    check(counted.input_tokens == used > 0, f"count_tokens {counted} against usage {message.usage}")
    # The same prompt again: its prefix comes from the cache, and usage says so.
    again = client.messages.create(model="m", max_tokens=4, messages=ASK, tools=[WEATHER],
                                   system="Be brief.", **GREEDY)
    check(again.usage.cache_read_input_tokens > 0 and
          again.usage.input_tokens + again.usage.cache_read_input_tokens == used,
          f"cache reads: {again.usage}")

    # stop_sequences: a piece of the greedy text ends the reply before it.
    full = text_of(client.messages.create(model="m", max_tokens=24, messages=ASK, **GREEDY))
    stop = next((full[i:i + 2] for i in range(4, len(full) - 2) if full[i:i + 2].isprintable()
                 and full[i:i + 2].strip() == full[i:i + 2]), None)
    check(stop is not None, f"no stop sequence to pick in {full!r}")
    cut = client.messages.create(model="m", max_tokens=24, messages=ASK, stop_sequences=[stop],
                                 **GREEDY)
    check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop and
          text_of(cut) == full[:full.index(stop)], f"stop {stop!r}: {cut} against {full!r}")

    # tool_choice any: a call of one of the tools, valid under its input_schema; streamed alike.
    for seed in range(3):
        body = {"model": "m", "max_tokens": 90, "messages": ASK, "tools": [WEATHER, TIME],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                "extra_body": {"temperature": 0.8 + 0.1 * seed}}
        message = client.messages.create(**body)
        check(message.stop_reason == "tool_use", f"any: {message}")
        check(len(tool_uses(message)) == 1, f"one call: {message}")
        with client.messages.stream(**body) as stream:
            events = [event.type for event in stream]
            streamed = stream.get_final_message()
        check(streamed.stop_reason == "tool_use" and len(tool_uses(streamed)) == 1,
              f"streamed any: {streamed}")
        check(events[0] == "message_start" and "content_block_start" in events and
              events[-1] == "message_stop", f"events: {events}")
    # tool_choice tool: that tool.
    message = client.messages.create(model="m", max_tokens=90, messages=ASK,
                                     tools=[WEATHER, TIME],
                                     tool_choice={"type": "tool", "name": "get_time"}, **GREEDY)
    tool_uses(message, names=("get_time",))

    # The agent's round trip: the assistant's content sent back as it came, then a tool_result.
    message = client.messages.create(model="m", max_tokens=100, messages=ASK, tools=[WEATHER],
                                     tool_choice={"type": "any"}, **GREEDY)
    use = tool_uses(message, names=("get_weather",))[0]
    history = ASK + [
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "18 degrees, sunny"}]}]
    answer = client.messages.create(model="m", max_tokens=16, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, **GREEDY)
    check(answer.stop_reason in ("end_turn", "max_tokens") and text_of(answer) and
          not [b for b in answer.content if b.type == "tool_use"], f"answer: {answer}")
    # The history reached the template: the call as it writes calls, the result as a tool turn.
    status, _, body = raw(port, "POST", "/tokenize", {"model": "m", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "18 degrees, sunny"}]},
        key=API_KEY)
    check(status == 200, f"tokenize: {status}")
    counted = client.messages.count_tokens(model="m", messages=history)
    check(counted.input_tokens == json.loads(body)["count"],
          f"the Anthropic history renders as the OpenAI one: {counted} against {body[:80]}")

    # output_config's JSON schema: the reply is a document of it.
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    message = client.messages.create(model="m", max_tokens=40, messages=ASK, **GREEDY,
                                     output_config={"format": {"type": "json_schema",
                                                               "schema": schema}})
    jsonschema.validate(json.loads(text_of(message)), schema)

    # Refusals, in Anthropic's error shape, as the SDK's own exceptions.
    for body, exception, words in [
            ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
             anthropic.BadRequestError, "read text only"),
            ({"messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
             anthropic.BadRequestError, "built-in tool"),
            ({"messages": ASK, "output_config": {"effort": "high"}},
             anthropic.BadRequestError, "output_config.effort"),
            ({"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 4}},
             anthropic.BadRequestError, "no thinking chat template"),
            ({"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 8}},
             anthropic.BadRequestError, "must be less than 'max_tokens'"),
            ({"messages": [{"role": "system", "content": "x"}]},
             anthropic.BadRequestError, "'system'"),
            ({"messages": ASK, "model": "nope"}, anthropic.NotFoundError, "nope")]:
        try:
            client.messages.create(**{"model": "m", "max_tokens": 8, **body})
            check(False, f"{body} was not refused")
        except exception as error:
            check(error.body["type"] == "error" and words in error.body["error"]["message"],
                  f"{body}: {error.body}")
    status, _, data = raw(port, "POST", "/v1/messages", {"model": "m", "messages": ASK},
                          key=API_KEY)
    check(status == 400 and json.loads(data)["error"]["message"] == "'max_tokens' is required",
          f"no max_tokens: {status} {data}")
    # x-api-key is the key Anthropic's clients send; a wrong one is refused.
    wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="wrong",
                                max_retries=0)
    try:
        wrong.messages.create(model="m", max_tokens=4, messages=ASK)
        check(False, "a wrong x-api-key was accepted")
    except anthropic.AuthenticationError:
        pass


def thinking(sluice, test_models):
    """A thinking template: the reply's reasoning in a thinking block, streamed as thinking
    deltas; thinking disabled closes the block in the prompt; a thinking block sent back in the
    history is accepted."""
    with templated_model(test_models, THINKING_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1"]) \
                as port:
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused")
            body = {"model": "m", "max_tokens": 8, "messages": ASK,
                    "extra_body": {"temperature": 0}}
            message = client.messages.create(**body, thinking={"type": "enabled",
                                                               "budget_tokens": 4})
            # The random model does not close the block in 8 tokens: all of it is thinking.
            check([b.type for b in message.content] == ["thinking"] and
                  message.content[0].thinking, f"thinking: {message}")
            with client.messages.stream(**body) as stream:
                deltas = "".join(e.delta.thinking for e in stream if e.type == "content_block_delta"
                                 and e.delta.type == "thinking_delta")
            check(deltas == message.content[0].thinking, f"{deltas!r} against {message}")
            omitted = client.messages.create(**body, thinking={"type": "adaptive",
                                                               "display": "omitted"})
            check([b.type for b in omitted.content] == ["thinking"] and
                  omitted.content[0].thinking == "", f"omitted: {omitted}")
            plain = client.messages.create(**body, thinking={"type": "disabled"})
            check([b.type for b in plain.content] == ["text"], f"disabled: {plain}")
            history = ASK + [{"role": "assistant", "content": message.content},
                             {"role": "user", "content": "And tomorrow?"}]
            again = client.messages.create(**{**body, "messages": history})
            check(again.content, f"second turn: {again}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with templated_model(test_models, HERMES_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1",
                              "--llm-context-length", "512", "--api-key", API_KEY]) as port:
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
            checks(client, port)
    thinking(sluice, test_models)
    print("anthropic_api_test: all checks passed")


if __name__ == "__main__":
    main()
