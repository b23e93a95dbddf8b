#!/usr/bin/env python3
"""OpenAI's Responses API through the real `sluice serve`, as its users run it: the OpenAI SDK's
client.responses (create and stream: OpenAI's event sequence with sequence numbers, output
items, usage), a conversation continued by previous_response_id, GET and DELETE of stored
responses, store false keeping nothing, function tools and their call -> output round trip,
text.format's JSON schema, the refusals; the OpenAI Agents SDK running a tool in its Responses
mode (its default) and in its chat-completions mode, streamed and not; and the store's bound
held while 10,000 responses are stored (its count, and the server's RSS flat).

Usage: tests/responses_api_test.py SLUICE TEST_MODELS
"""
import asyncio
import json
import os
import sys
import time
from typing import Literal

import jsonschema
import openai

from sluice_server import HERMES_TEMPLATE, serving, templated_model
from openai_api_test import THINKING_TEMPLATE, check, raw

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}


def text_items(response):
    return [item for item in response.output if item.type == "message"]


def calls_of(response):
    return [item for item in response.output if item.type == "function_call"]


def responses(client, port):
    # create: a response object of output items; the SDK's output_text joins their text.
    response = client.responses.create(model="m", input="Hello", max_output_tokens=12,
                                       temperature=0)
    check(response.id.startswith("resp_") and response.object == "response", f"{response}")
    check(response.status in ("completed", "incomplete") and response.output_text and
          text_items(response)[0].role == "assistant", f"create: {response}")
    if response.status == "incomplete":
        check(response.incomplete_details.reason == "max_output_tokens", f"{response}")
    check(response.usage.output_tokens == 12 or response.status == "completed",
          f"usage: {response.usage}")
    # stream: the same greedy text, in OpenAI's event sequence.
    with client.responses.stream(model="m", input="Hello", max_output_tokens=12,
                                 temperature=0) as stream:
        events = list(stream)
    types = [e.type for e in events]
    check(types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"], f"events: {types}")
    check(types[-1] in ("response.completed", "response.incomplete") and
          "response.output_text.done" in types and "response.output_item.done" in types,
          f"events: {types}")
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == response.output_text == events[-1].response.output_text,
          f"streamed {deltas!r} against {response.output_text!r}")

    # A conversation continued by previous_response_id: the earlier turn is in the prompt (its
    # prefix found in the cache), and GET finds the stored response.
    first = client.responses.create(model="m", input="My name is Ada.", max_output_tokens=4,
                                    temperature=0)
    second = client.responses.create(model="m", input="What is my name?", max_output_tokens=4,
                                     temperature=0, previous_response_id=first.id)
    check(second.previous_response_id == first.id and second.instructions is None, f"{second}")
    check(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens and
          second.usage.input_tokens_details.cached_tokens > 0,
          f"continued: {first.usage} then {second.usage}")
    status, _, body = raw(port, "POST", "/tokenize", {"model": "m", "messages": [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}]}, key=None)
    check(json.loads(body)["count"] == second.usage.input_tokens,
          f"the continued prompt is the conversation: {body[:60]} against {second.usage}")
    check(client.responses.retrieve(first.id).output_text == first.output_text, "retrieve")
    # Its input items, as the SDK pages them (newest first by default).
    items = client.responses.input_items.list(first.id)
    check(len(items.data) == 1 and items.data[0].type == "message" and
          items.data[0].role == "user" and items.data[0].id.startswith("msg_") and
          items.data[0].content[0].text == "My name is Ada." and not items.has_more,
          f"input items: {items}")
    several = client.responses.create(model="m", max_output_tokens=2, input=[
        {"role": "user", "content": f"item {i}"} for i in range(5)])
    page = client.responses.input_items.list(several.id, limit=2, order="asc")
    check([item.content[0].text for item in page.data] == ["item 0", "item 1"] and page.has_more,
          f"first page: {page}")
    rest = [item.content[0].text
            for item in client.responses.input_items.list(several.id, order="asc").data]
    check(rest == [f"item {i}" for i in range(5)], f"all items: {rest}")
    after = client.responses.input_items.list(several.id, limit=2, order="asc",
                                               after=page.last_id)
    check([item.content[0].text for item in after.data] == ["item 2", "item 3"], f"{after}")
    newest = client.responses.input_items.list(several.id, limit=1)
    check(newest.data[0].content[0].text == "item 4", f"newest first: {newest}")
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("include=x", "include")):
        status, _, body = raw(port, "GET", f"/v1/responses/{several.id}/input_items?{query}",
                              key=None)
        check(status == 400 and json.loads(body)["error"]["param"] == param, f"{query}: {body}")
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id),
                 lambda: client.responses.create(model="m", input="x", max_output_tokens=2,
                                                 previous_response_id=first.id)):
        try:
            call()
            check(False, "a deleted response was found")
        except (openai.NotFoundError, openai.BadRequestError) as error:
            check(first.id in error.body["message"], f"{error.body}")
    unstored = client.responses.create(model="m", input="x", max_output_tokens=2, store=False,
                                       instructions="Be brief.")
    check(unstored.instructions == "Be brief." and not unstored.store, f"{unstored}")
    try:
        client.responses.retrieve(unstored.id)
        check(False, "store false kept the response")
    except openai.NotFoundError:
        pass

    # Function tools: a required call, streamed alike; its output sent back as an item.
    for stream in (False, True):
        body = {"model": "m", "input": "Weather in Paris?", "tools": [WEATHER],
                "tool_choice": "required", "parallel_tool_calls": False,
                "max_output_tokens": 80}
        if stream:
            with client.responses.stream(**body) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(**body)
        calls = calls_of(response)
        check(len(calls) == 1 and calls[0].name == "get_weather" and
              calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_"),
              f"required: {response.output}")
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    answer = client.responses.create(
        model="m", tools=[WEATHER], tool_choice="none", max_output_tokens=6, temperature=0,
        input=[{"role": "user", "content": "Weather in Paris?"}, *response.output,
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 degrees"}])
    check(answer.output_text and not calls_of(answer), f"answer: {answer.output}")

    # text.format's JSON schema: the reply is a document of it.
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    response = client.responses.create(
        model="m", input="Yes or no?", max_output_tokens=80, temperature=0,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema}})
    check(response.status == "completed", f"text.format: {response}")
    jsonschema.validate(json.loads(response.output_text), schema)

    # What is not served is refused by name.
    for body, param in [({"tools": [{"type": "web_search"}]}, "tools"),
                        ({"background": True}, "background"),
                        ({"truncation": "auto"}, "truncation"),
                        ({"conversation": "conv_1"}, "conversation"),
                        ({"input": [{"role": "user", "content": [
                            {"type": "input_image", "image_url": "http://x"}]}]}, "input"),
                        ({"reasoning": {"effort": "high"}}, "reasoning")]:
        status, _, data = raw(port, "POST", "/v1/responses",
                              {"model": "m", "input": "x", **body}, key=None)
        error = json.loads(data).get("error", {})
        check(status == 400 and error.get("param") == param, f"{body}: {status} {data[:300]}")


def agents(port):
    """The OpenAI Agents SDK as its users run it, in its Responses mode (the default) and its
    chat-completions mode: a tool called (a required call; the run stops at its output)."""
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                        Runner, function_tool, set_tracing_disabled)
    set_tracing_disabled(True)  # Traces would go to OpenAI's servers.
    called = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather in a city."""
        called.append(city)
        return f"18 degrees in {city}"

    async def run_all():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        for model in (OpenAIResponsesModel(model="m", openai_client=client),
                      OpenAIChatCompletionsModel(model="m", openai_client=client)):
            name = type(model).__name__
            agent = Agent(name="weather", instructions="Answer with the tool.",
                          tools=[get_weather], model=model, tool_use_behavior="stop_on_first_tool",
                          model_settings=ModelSettings(tool_choice="required", max_tokens=80,
                                                       parallel_tool_calls=False))
            before = len(called)
            result = await Runner.run(agent, "Weather in Paris?")
            check(len(called) == before + 1 and
                  result.final_output == f"18 degrees in {called[-1]}",
                  f"{name}: {result.final_output!r} {called}")
            run = Runner.run_streamed(agent, "Weather in Rome?")
            kinds = [event.type async for event in run.stream_events()]
            check(len(called) == before + 2 and run.final_output == f"18 degrees in {called[-1]}"
                  and "raw_response_event" in kinds,
                  f"{name} streamed: {run.final_output!r} {set(kinds)}")

    asyncio.run(run_all())


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def store_bound(sluice, model):
    """10,000 stored responses against a bound of 200: the store keeps 200, the server's RSS
    stays flat, the newest are found and the oldest are not."""
    # Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before reuse:
    # a small one, so the RSS measures what the server keeps (the release build ignores it).
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4"
    with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1",
                          "--responses-store-max", "200"], env=env, with_process=True) \
            as (port, process):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        ids, samples = [], {}
        started = time.monotonic()
        for i in range(10000):
            ids.append(client.responses.create(model="m", input=f"note {i} " + "x" * 150,
                                               max_output_tokens=1).id)
            if i + 1 in (2000, 10000):
                samples[i + 1] = rss_kib(process.pid)
        seconds = time.monotonic() - started
        with open(f"/proc/{process.pid}/maps") as f:
            sanitized = "libasan" in f.read()
        # AddressSanitizer's allocator keeps its own metadata per allocation (about 3 KiB a
        # request here even with a small quarantine): its RSS says nothing of what the server
        # holds, and LeakSanitizer checks that at exit instead.
        check(sanitized or samples[10000] - samples[2000] < 4 * 1024,
              f"RSS grew from {samples[2000]} KiB at 2,000 responses to {samples[10000]} KiB")
        check(client.responses.retrieve(ids[-1]).id == ids[-1], "the newest response is stored")
        for old in (ids[0], ids[-201]):
            try:
                client.responses.retrieve(old)
                check(False, f"{old} outlived the bound")
            except openai.NotFoundError:
                pass
        print(f"responses_api_test: 10,000 stored in {seconds:.1f} s; RSS {samples[2000]} KiB "
              f"at 2,000, {samples[10000]} KiB at 10,000")


def thinking(sluice, test_models):
    """A thinking template: the reasoning as a reasoning item (streamed as reasoning_text
    deltas), sent back as an input item; reasoning.effort "none" turns it off."""
    with templated_model(test_models, THINKING_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1"]) \
                as port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            body = {"model": "m", "input": "2 + 2?", "max_output_tokens": 8, "temperature": 0}
            response = client.responses.create(**body)
            # The random model does not close the block in 8 tokens: all of it is reasoning.
            check([item.type for item in response.output] == ["reasoning"] and
                  response.output[0].content[0].text and
                  response.usage.output_tokens_details.reasoning_tokens > 0, f"{response}")
            with client.responses.stream(**body) as stream:
                deltas = "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta")
            check(deltas == response.output[0].content[0].text, f"{deltas!r} against {response}")
            off = client.responses.create(**body, reasoning={"effort": "none"})
            check([item.type for item in off.output] == ["message"], f"effort none: {off}")
            again = client.responses.create(**{**body, "input": [
                {"role": "user", "content": "2 + 2?"}, *response.output,
                {"role": "user", "content": "And 3 + 3?"}]})
            check(again.output, f"second turn: {again}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with templated_model(test_models, HERMES_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1",
                              "--llm-context-length", "512"]) as port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            responses(client, port)
            agents(port)
        store_bound(sluice, model)
    thinking(sluice, test_models)
    print("responses_api_test: all checks passed")


if __name__ == "__main__":
    main()
