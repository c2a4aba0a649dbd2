"""Do agent libraries land their tool loops on a model? openai-agents (through chat completions and through the
Responses API, each run whole and streamed) and the anthropic SDK's own loop, over 10 weather questions, against a
real `localspec serve` (or any server: --url).

    .venv/bin/python tools/agent_loops.py --profile qwen2.5-coder-1.5b
    .venv/bin/python tools/agent_loops.py --url http://127.0.0.1:8080/v1 --modes chat,chat-stream   # llama-server

A loop lands where the model called get_weather with arguments that parse and name a city (the tool ran), and then
answered the user in text that is not itself a call (no JSON, no `<tool_call>`) within the run's turns. The calls and
answers are printed, so the judge can be read by hand. Exit 1 where a mode lands fewer than --need of the prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "What's the weather in Paris?", "Is it raining in Tokyo right now?", "How warm is it in Cairo today?",
    "What's the weather like in London today?", "What's the temperature in New York?",
    "Tell me the weather in Berlin.", "Is it sunny in Madrid?", "How cold is it in Oslo?",
    "Weather for Sydney please.", "How is the weather in Toronto?",
]
# the words, and "call them, do not describe them": without it the 1.5B tells the user how to call the tool
# on 7 of 10 of these questions (it means to explain, and its answer is text); with it, it calls on all 10
INSTRUCTIONS = ("Answer with the help of the tools: call them, do not describe them. After a tool result, write the "
                "final answer for the user as a sentence.")
MODES = ("chat", "chat-stream", "responses", "responses-stream", "anthropic")
# checks of one request each, run once (--checks): a forced call's cost, and a code answer streamed with tools offered
CHECKS = ("required", "code-stream")
CODE_PROMPT = "Write a Python function that reverses a string, in a ```python block."
WEATHER = {"Paris": "18 C, clear", "Tokyo": "22 C, light rain", "Cairo": "31 C, sunny", "London": "12 C, showers",
           "New York": "15 C, cloudy", "Berlin": "10 C, overcast", "Madrid": "25 C, sunny", "Oslo": "-3 C, snow",
           "Sydney": "20 C, windy", "Toronto": "2 C, cloudy"}


def weather_of(city: str) -> str:
    return json.dumps({"city": city, "weather": WEATHER.get(city.split(",")[0].strip(), "14 C, fair")})


def is_text_answer(text: str) -> bool:
    """A final answer for the user: words, not a call written as text."""
    stripped = text.strip().strip("`").strip()
    return bool(stripped) and "<tool_call>" not in text and not re.match(r"^(json\s*)?[\[{]", stripped)


async def agents_loop(base_url: str, prompt: str, responses: bool, stream: bool, max_tokens: int) -> dict[str, Any]:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(city)
        return weather_of(city)

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    model: Any = (OpenAIResponsesModel("default", client) if responses
                  else OpenAIChatCompletionsModel("default", client))
    agent = Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather], model=model,
                  model_settings=ModelSettings(temperature=0, max_tokens=max_tokens))
    try:
        if stream:
            result: Any = Runner.run_streamed(agent, prompt, max_turns=4)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, prompt, max_turns=4)
        final = str(result.final_output or "")
        error = None
    except Exception as e:  # MaxTurnsExceeded, a protocol error: the loop did not land
        final, error = "", f"{type(e).__name__}: {e}"[:200]
    return {"calls": calls, "final": final, "error": error}


def anthropic_loop(base_url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=600)
    tools = [{"name": "get_weather", "description": "Get the current weather for a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    calls: list[str] = []
    try:
        for _ in range(4):
            reply = client.messages.create(model="default", max_tokens=max_tokens, system=INSTRUCTIONS,
                                           messages=messages, tools=tools,  # type: ignore[arg-type]
                                           extra_body={"temperature": 0})  # this SDK has no temperature
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                text = "".join(b.text for b in reply.content if b.type == "text")
                return {"calls": calls, "final": text, "error": None}
            messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
            results = []
            for use in uses:
                city = str(use.input.get("city", ""))  # type: ignore[union-attr]
                calls.append(city)
                results.append({"type": "tool_result", "tool_use_id": use.id, "content": weather_of(city)})
            messages.append({"role": "user", "content": results})
        return {"calls": calls, "final": "", "error": "no answer within 4 turns"}
    except Exception as e:
        return {"calls": calls, "final": "", "error": f"{type(e).__name__}: {e}"[:200]}


def forced_call(base_url: str, max_tokens: int = 300) -> str:
    """tool_choice "required" through the openai client: the call, and the completion tokens it cost."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a "
            "city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}}
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": PROMPTS[0]}],
                                       tools=[tool], tool_choice="required", max_tokens=max_tokens,
                                       temperature=0)  # type: ignore[arg-type,call-overload]
    calls = r.choices[0].message.tool_calls or []
    said = [f"{c.function.name}({c.function.arguments})" for c in calls] or [repr(r.choices[0].message.content)]
    return (f"{', '.join(said)}; finish_reason {r.choices[0].finish_reason}; "
            f"{r.usage.completion_tokens if r.usage else '?'} of {max_tokens} completion tokens")


def code_stream(base_url: str, max_tokens: int = 120) -> str:
    """A code answer streamed with a tool offered: how many chunks carried text, and how much of the text came in
    the last of them (everything, where a server holds a possible call back)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    tool = {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": CODE_PROMPT}], tools=[tool], max_tokens=max_tokens,
        temperature=0, stream=True) if c.choices]  # type: ignore[arg-type,call-overload]
    texts = [p for p in pieces if p]
    whole = "".join(texts)
    return f"{len(texts)} text chunks, the largest {max(map(len, texts), default=0)} of {len(whole)} characters"


def landed(run: dict[str, Any]) -> bool:
    return bool(run["calls"]) and all(c.strip() for c in run["calls"]) and is_text_answer(run["final"])


@contextmanager
def server(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url
        return
    from tests.test_serve import start

    extra = ["--profile", args.profile] if args.profile else []
    gen = start(*extra, "--ctx", str(args.ctx))
    yield next(gen).base_url
    gen.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="the server's --profile (default: the embedded model)")
    parser.add_argument("--url", help="a running server's /v1 address instead of starting localspec serve")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)} "
                        "('' for none)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--need", type=int, default=9)
    parser.add_argument("--out", type=Path, help="write every run (calls, answer) here as JSON")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with server(args) as url:
        for check in filter(None, args.checks.split(",")):
            print(f"{check:17} {forced_call(url) if check == 'required' else code_stream(url)}", flush=True)
        for prompt in PROMPTS[:args.prompts]:
            for mode in modes:
                if mode == "anthropic":
                    run = anthropic_loop(url, prompt, args.max_tokens)
                else:
                    run = asyncio.run(agents_loop(url, prompt, mode.startswith("responses"),
                                                  mode.endswith("-stream"), args.max_tokens))
                run["prompt"] = prompt
                runs[mode].append(run)
                print(f"{mode:17} {'LANDED' if landed(run) else 'missed':6} {prompt!r}: calls {run['calls']} → "
                      f"{run['final'][:100]!r}{' ' + run['error'] if run['error'] else ''}", flush=True)
    failed = False
    for mode in modes:
        n = sum(landed(r) for r in runs[mode])
        failed |= n < args.need
        print(f"{mode}: {n}/{len(runs[mode])} loops landed")
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
