"""Do `required` and a named function give a valid call on a model? 20 varied prompts, each asked whole and
streamed through the official `openai` client against a real `localspec serve`, at 96 tokens.

    .venv/bin/python tools/tool_choice_check.py                      # the embedded model
    .venv/bin/python tools/tool_choice_check.py --profile qwen2.5-coder-1.5b --out calls.json

A call counts as valid where finish_reason is "tool_calls", its name is a tool of the request (the named one where
one is named) and its arguments parse and hold every required parameter with a value of its type and enum. The
streamed answer must carry the same calls as the whole one (greedy: the same text). Prints a line a prompt and the
totals; exit 1 where fewer than --need of the 20 are valid in a mode.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_soak import TOOLS  # noqa: E402  (the soak's two tools: weather and currency)

from tests.test_serve import start  # noqa: E402  (the suite's own server starter: the real command, loopback)

PROMPTS = [
    "What's the weather in Paris?", "Is it raining in Tokyo right now? Answer in fahrenheit.",
    "How warm is it in Cairo today?", "Weather for Oslo please, in celsius.", "Do I need a coat in Chicago?",
    "Tell me the temperature in Lima.", "What is the forecast for Berlin, in fahrenheit?",
    "How hot is Dubai at the moment?", "Check the weather in Sydney.", "Is it snowing in Montreal?",
    "Convert 100 dollars to euros.", "How many yen is 250 USD?", "Change 40 pounds into dollars.",
    "What is 1200 euros in Swiss francs?", "Convert 15.5 GBP to EUR.", "I have 3000 rupees; how many dollars is that?",
    "Exchange 80 Canadian dollars to US dollars.", "How much is 999 euros in pounds?",
    "Convert 1 bitcoin worth 60000 USD into euros.", "Turn 75 Australian dollars into yen.",
]
TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool}


def valid(call: dict[str, Any], name: str | None) -> bool:
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    fn = call.get("function", {})
    if fn.get("name") not in tools or (name is not None and fn["name"] != name):
        return False
    try:
        args = json.loads(fn.get("arguments", ""))
    except ValueError:
        return False
    schema = tools[fn["name"]]
    if not isinstance(args, dict) or any(k not in args for k in schema["required"]):
        return False
    for key, prop in schema["properties"].items():
        if key in args:
            if "enum" in prop and args[key] not in prop["enum"]:
                return False
            if "type" in prop and (not isinstance(args[key], TYPES[prop["type"]]) or isinstance(args[key], bool)):
                return False
    return True


def ask(client: Any, prompt: str, choice: Any, stream: bool, max_tokens: int) -> tuple[str | None, list[dict]]:
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": max_tokens, "temperature": 0}
    if not stream:
        r = client.chat.completions.create(**body)
        return r.choices[0].finish_reason, [c.model_dump() for c in r.choices[0].message.tool_calls or []]
    reason, calls = None, []
    for chunk in client.chat.completions.create(stream=True, **body):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for c in delta.tool_calls or []:
            calls.append({"id": c.id, "type": "function",
                          "function": {"name": c.function.name, "arguments": c.function.arguments}})
        reason = chunk.choices[0].finish_reason or reason
    return reason, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="a models.toml profile (default: the embedded model)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--need", type=int, default=19, help="valid calls of the 20 a mode must give (default 19)")
    parser.add_argument("--out", type=Path, help="write every answer here as JSON")
    args = parser.parse_args()
    flags = ["--parallel", "2", "--ctx", "2048", "--drafter", "ngram", *(["--profile", args.profile] if args.profile
                                                                        else [])]
    server_gen = start(*flags)
    server = next(server_gen)
    client = server.client()
    modes = {"required": "required", "named": None}
    totals = {mode: 0 for mode in modes}
    same = 0
    records = []
    try:
        for i, prompt in enumerate(PROMPTS):
            name = "get_weather" if i < 10 else "convert_currency"
            row = []
            for mode in modes:
                choice: Any = "required" if mode == "required" else {"type": "function", "function": {"name": name}}
                whole = ask(client, prompt, choice, False, args.max_tokens)
                streamed = ask(client, prompt, choice, True, args.max_tokens)
                ok = whole[0] == "tool_calls" and bool(whole[1]) and all(
                    valid(c, name if mode == "named" else None) for c in whole[1])
                match = [c["function"] for c in whole[1]] == [c["function"] for c in streamed[1]] and \
                    whole[0] == streamed[0]
                totals[mode] += ok
                same += match
                row.append(f"{mode}: {'valid' if ok else 'INVALID'}{'' if match else ' (stream differs)'}")
                records.append({"prompt": prompt, "mode": mode, "finish_reason": whole[0], "calls": whole[1],
                                "streamed": streamed[1], "valid": ok, "stream_same": match})
            print(f"{i + 1:2d}. {prompt[:48]:48s} " + "; ".join(row), flush=True)
    finally:
        server_gen.close()
    print(f"valid calls: required {totals['required']}/20, named {totals['named']}/20; streamed = whole in "
          f"{same}/40 ({args.profile or 'the embedded model'}, {args.max_tokens} tokens)")
    if args.out:
        args.out.write_text(json.dumps(records, indent=1))
    return 0 if min(totals.values()) >= args.need else 1


if __name__ == "__main__":
    raise SystemExit(main())
