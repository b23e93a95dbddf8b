#!/usr/bin/env python3
"""gpt-oss's chat format (harmony) through the real `sluice serve` and the OpenAI Python SDK: the
tiny gpt-oss (transformers' GptOssForCausalLM, harmony's markers special tokens, converted/hf_gpt_oss)
under gpt-oss's own chat template (llama.cpp's copy). Its weights are random, so its replies are
what a grammar makes them: tool_choice "required" gives a call of the function, its arguments
under the schema, and the analysis message before it as reasoning_content, streamed and not; the
call sent back with its reasoning and the tool's result (an agent's second turn) is answered; a
json_schema response_format gives a document of the schema as the content; the OpenAI Agents SDK
runs a tool-calling agent (Responses and chat-completions modes) and a structured-output agent;
Anthropic's SDK gets a thinking block and a tool_use, and its agent's second turn is answered;
and an Anthropic `thinking` switch that would turn gpt-oss's reasoning off is refused.

A random model's analysis message ends where it picks <|end|>: some seeds reach the token limit
first, so each check takes the first of several seeds whose reply ends.

Usage: tests/openai_harmony_test.py SLUICE TEST_MODELS CHAT_TEMPLATES
"""
import json
import os
import sys
import tempfile

import jsonschema
import openai

from sluice_server import serving
from openai_api_test import check, raw

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
SCHEMA = WEATHER["function"]["parameters"]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
SEEDS = range(12)


def gpt_oss_folder(test_models, templates, folder):
    """converted/hf_gpt_oss's files linked into `folder`, under gpt-oss's own chat template."""
    source = os.path.join(test_models, "converted", "hf_gpt_oss")
    for name in os.listdir(source):
        if name not in ("chat_template.jinja", "tokenizer_config.json"):
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
    with open(os.path.join(source, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(templates, "openai-gpt-oss-120b.jinja")) as f:
        template = f.read()
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write(template)


def reasoning_of(message):
    return (message.model_extra or {}).get("reasoning_content")


def first_ended(create, finish, reasoned=False):
    """The first reply over SEEDS whose finish_reason is `finish` (and, with `reasoned`, that
    reasoned first: the grammar lets a reply skip its analysis), with its seed."""
    seen = []
    for seed in SEEDS:
        reply = create(seed)
        choice = reply.choices[0]
        if choice.finish_reason == finish and (not reasoned or reasoning_of(choice.message)):
            return reply, seed
        seen.append(choice.finish_reason)
    raise AssertionError(f"no reply of {len(SEEDS)} seeds ended with {finish}: {seen}")


def run(port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    common = dict(model="m", messages=MESSAGES, tools=[WEATHER], max_tokens=400)

    # A required call after the reasoning.
    reply, seed = first_ended(
        lambda s: client.chat.completions.create(**common, tool_choice="required", seed=s),
        "tool_calls", reasoned=True)
    message = reply.choices[0].message
    check(len(message.tool_calls) == 1, f"one call: {message.tool_calls}")
    call = message.tool_calls[0]
    check(call.function.name == "get_weather" and call.id.startswith("call_"), f"call: {call}")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    reasoning = reasoning_of(message)
    check(isinstance(reasoning, str) and reasoning, f"no reasoning_content: {message}")
    check(not message.content, f"content beside the call: {message.content!r}")

    # The same seed streamed: the same reasoning and call, in deltas.
    stream = client.chat.completions.create(**common, tool_choice="required", seed=seed,
                                            stream=True)
    streamed_reasoning, arguments, names, finish = "", "", set(), None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        streamed_reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
        for delta in choice.delta.tool_calls or []:
            check(delta.index == 0, f"a second call: {delta}")
            if delta.function.name:
                names.add(delta.function.name)
            arguments += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    check(finish == "tool_calls", f"streamed finish: {finish}")
    check(names == {"get_weather"}, f"streamed names: {names}")
    check(json.loads(arguments) == json.loads(call.function.arguments),
          f"streamed arguments {arguments} against {call.function.arguments}")
    check(streamed_reasoning == reasoning, "streamed reasoning differs from the reply's")

    # An agent's second turn: the call sent back with its reasoning, then the tool's result.
    history = MESSAGES + [
        {"role": "assistant", "content": None, "reasoning_content": reasoning,
         "tool_calls": [{"id": call.id, "type": "function", "function": {
             "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    second = client.chat.completions.create(model="m", messages=history, tools=[WEATHER],
                                            max_tokens=16, seed=seed)
    check(second.choices[0].finish_reason in ("stop", "length", "tool_calls"),
          f"second turn: {second.choices[0]}")

    # A response format: a document of the schema as the final message.
    reply, _ = first_ended(
        lambda s: client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=400, seed=s,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "weather", "schema": SCHEMA}}),
        "stop")
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)

    agents(port)

    anthropic_messages(port)

    # Anthropic's thinking switch: gpt-oss always reasons.
    status, _, body = raw(port, "POST", "/v1/messages", {
        "model": "m", "max_tokens": 8, "messages": MESSAGES,
        "thinking": {"type": "disabled"}}, key=None)
    check(status == 400 and b"always reasons" in body, f"thinking disabled: {status} {body}")


def agents(port):
    """The OpenAI Agents SDK on gpt-oss, in its Responses mode (the default) and its
    chat-completions mode: a required tool call (the run stops at its output), and in Responses
    mode an agent whose output_type is a schema. Each takes the first of several runs whose reply
    ends (the Agents SDK sends no seed)."""
    import asyncio
    from typing import Literal

    import pydantic
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel,
                        Runner, function_tool, set_tracing_disabled)
    from agents.exceptions import AgentsException
    set_tracing_disabled(True)  # Traces would go to OpenAI's servers.

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather in a city."""
        return f"18 degrees in {city}"

    class Weather(pydantic.BaseModel):
        unit: Literal["c", "f"]

    async def first_good(agent, good):
        outputs = []
        for _ in range(len(SEEDS)):
            try:  # A reply cut by the token limit is an error to the SDK.
                result = await Runner.run(agent, "Weather in Paris?")
            except AgentsException as error:
                outputs.append(type(error).__name__)
                continue
            if good(result.final_output):
                return
            outputs.append(result.final_output)
        raise AssertionError(f"{agent.name}: no good output in {len(SEEDS)} runs: {outputs}")

    async def run_all():
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        settings = ModelSettings(tool_choice="required", max_tokens=400, parallel_tool_calls=False)
        for model in (OpenAIResponsesModel(model="m", openai_client=client),
                      OpenAIChatCompletionsModel(model="m", openai_client=client)):
            agent = Agent(name=type(model).__name__, instructions="Answer with the tool.",
                          tools=[get_weather], model=model, tool_use_behavior="stop_on_first_tool",
                          model_settings=settings)
            await first_good(agent, lambda out: out in ("18 degrees in Paris",
                                                        "18 degrees in Rome"))
        structured = Agent(name="structured", output_type=Weather,
                           model=OpenAIResponsesModel(model="m", openai_client=client),
                           model_settings=ModelSettings(max_tokens=400))
        await first_good(structured, lambda out: isinstance(out, Weather))

    asyncio.run(run_all())


def anthropic_messages(port):
    """Anthropic's SDK on gpt-oss: tool_choice any gives a thinking block (the analysis message)
    and a tool_use valid under the input schema; the content sent back with a tool_result (an
    agent's second turn) is answered."""
    import anthropic
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none")
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": SCHEMA}
    seen = []
    # The first call that reasoned first (the grammar lets a reply skip it); Anthropic's API has
    # no seed, and about a third of these replies reason and call within the limit.
    for _ in range(2 * len(SEEDS)):
        message = client.messages.create(model="m", max_tokens=400, messages=MESSAGES,
                                         tools=[tool], tool_choice={"type": "any"})
        kinds = [block.type for block in message.content]
        seen.append((message.stop_reason, kinds))
        if message.stop_reason == "tool_use":
            check(kinds in (["tool_use"], ["thinking", "tool_use"]), f"blocks: {kinds}")
        if kinds == ["thinking", "tool_use"]:
            break
    check(kinds == ["thinking", "tool_use"], f"no reply of {len(seen)} reasoned, then called the "
          f"tool: {seen}")
    check(message.content[0].thinking, f"an empty thinking block: {message.content[0]}")
    use = message.content[1]
    check(use.name == "get_weather", f"tool_use: {use}")
    jsonschema.validate(use.input, SCHEMA)
    history = [{"role": "user", "content": MESSAGES[0]["content"]},
               {"role": "assistant", "content": message.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "18 C, sunny"}]}]
    answer = client.messages.create(model="m", max_tokens=16, messages=history, tools=[tool])
    check(answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"second turn: {answer}")


def main():
    sluice, test_models, templates = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
    with tempfile.TemporaryDirectory() as model:
        gpt_oss_folder(test_models, templates, model)
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1"]) \
                as port:
            run(port)
    print("openai_harmony_test: all checks passed")


if __name__ == "__main__":
    main()
