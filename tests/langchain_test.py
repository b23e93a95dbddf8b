#!/usr/bin/env python3
"""LangChain's ChatOpenAI against the real `sluice serve`, as LangChain users write it: a named
tool bound with bind_tools (its call, then the tool's ToolMessage and the answer), a required call
streamed and rebuilt from its chunks, with_structured_output on a pydantic model, and the same tool
call through ChatOpenAI's Responses API mode.

Usage: tests/langchain_test.py SLUICE TEST_MODELS
"""
import os
import sys
from typing import Literal

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from sluice_server import HERMES_TEMPLATE, serving, templated_model
from openai_api_test import check


@tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Weather in a city."""
    return f"18 degrees in {city}"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


def run(port):
    common = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key": "unused", "model": "m",
              "max_tokens": 80, "temperature": 0}
    llm = ChatOpenAI(**common)
    ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    check(len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather" and
          ai.tool_calls[0]["args"]["city"] in ("Paris", "Rome"), f"bind_tools: {ai}")
    answer = llm.bind(max_tokens=8).invoke([
        ("user", "Weather in Paris?"), ai,
        ToolMessage(content=get_weather.invoke(ai.tool_calls[0]["args"]),
                    tool_call_id=ai.tool_calls[0]["id"])])
    check(answer.content and not answer.tool_calls, f"answer: {answer}")

    full = None
    for chunk in llm.bind_tools([get_weather], tool_choice="required").stream("Weather?"):
        full = chunk if full is None else full + chunk
    check(len(full.tool_calls) == 1 and full.tool_calls[0]["args"]["city"] in ("Paris", "Rome"),
          f"streamed: {full}")

    verdict = llm.with_structured_output(Verdict).invoke("Yes or no?")
    check(isinstance(verdict, Verdict), f"structured output: {verdict!r}")

    responses = ChatOpenAI(**common, use_responses_api=True)
    ai = responses.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Rome?")
    check(len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather",
          f"Responses API: {ai}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with templated_model(test_models, HERMES_TEMPLATE) as model:
        with serving(sluice, ["--model-dir", model, "--model-name", "m", "--llm-threads", "1",
                              "--llm-context-length", "512"]) as port:
            run(port)
    print("langchain_test: all checks passed")


if __name__ == "__main__":
    main()
