"""`localspec run`: scripted, offline generation; text streams to stdout, stats go to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from localspec.opening import Checks
    from localspec.runtime import Runtime

from localspec.cli import app, ctrl_c_as_request, user_errors
from localspec.cli.options import generation_options
from localspec.cli.render import json_document, stats_lines
from localspec.cli.structured import constraint_from_options
from localspec.errors import UserError
from localspec.events import Finished, Notice, Stats, Step, Token
from localspec.schema.spec import follow_prompt
from localspec.settings import Settings


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt_file is not None:
        if prompt is not None:
            raise UserError("give the prompt either as an argument or with --file, not both")
        try:
            text = decode_text(prompt_file.read_bytes(), f"--file {prompt_file}")
        except OSError as exc:
            raise UserError(f"cannot read --file {prompt_file}: {exc.strerror}") from None
    elif prompt is None:
        raise UserError("no prompt: pass it as an argument, '-' to read stdin, or --file PATH")
    elif prompt == "-":
        text = decode_text(sys.stdin.buffer.read(), "stdin")
    else:
        text = decode_argument(prompt, "the prompt")
    if not text.strip():
        raise UserError("the prompt is empty: pass some text, '-' to read it from stdin, or --file PATH")
    return text


def read_prediction(path: str | None, *, stdin_taken: bool) -> str | None:
    """``--prediction``'s text: a file, or - for stdin where the prompt and the schema are not read from it."""
    if path is None:
        return None
    if path == "-":
        if stdin_taken:
            raise UserError("stdin is read for the prompt or the schema already: give --prediction a file")
        text = decode_text(sys.stdin.buffer.read(), "stdin")
    else:
        try:
            text = decode_text(Path(path).read_bytes(), f"--prediction {path}")
        except OSError as exc:
            raise UserError(f"cannot read --prediction {path}: {exc.strerror}") from None
    return text


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 text; invalid bytes become U+FFFD and the user is told once (a prompt is not worth refusing)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        print(f"localspec: {where} is not valid UTF-8: its invalid bytes were replaced with U+FFFD", file=sys.stderr)
        return data.decode("utf-8", "replace")


def decode_argument(value: str, where: str) -> str:
    # Python hands over undecodable argv bytes as lone surrogates, which no encoder accepts: get the bytes back.
    return decode_text(value.encode("utf-8", "surrogateescape"), where)


@app.command()
@generation_options("run")
def run(
    prompt: Annotated[str | None, typer.Argument(help="The prompt; '-' reads it from stdin.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the prompt from a file.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template.")] = False,
    system: Annotated[str | None, typer.Option("--system", help="System message (implies --chat).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, tokens, stats).")] = False,
    json_schema: Annotated[str | None, typer.Option(
        "--json-schema", metavar="FILE|-",
        help="Hold the answer to this JSON Schema (a file, or - for stdin). Lossless: the text is what "
             "--drafter none gives under the same schema; the tokens it forces are drafted. docs/structured.md.",
        rich_help_panel="Structured output")] = None,
    grammar: Annotated[Path | None, typer.Option(
        "--grammar", metavar="FILE", help="Hold the answer to a grammar: llama.cpp's GBNF or Lark.",
        rich_help_panel="Structured output")] = None,
    regex: Annotated[str | None, typer.Option(
        "--regex", metavar="PATTERN", help="Hold the answer to a regular expression.",
        rich_help_panel="Structured output")] = None,
    prediction: Annotated[str | None, typer.Option(
        "--prediction", metavar="FILE|-",
        help="What the answer will mostly be (a file, or - for stdin), e.g. the file you ask to change: drafted "
             "from where the answer follows it, found again after each edit (OpenAI's Predicted Outputs). "
             "Lossless: the text is the target's with or without it.",
        rich_help_panel="Speculation")] = None,
    *,
    options: Settings,
) -> None:
    """Generate text from PROMPT, faster through lossless speculative decoding.

    Examples:

      localspec run $'Question: What is the capital of France?\\nAnswer:'

      cat notes.txt | localspec run - --drafter ngram --max-tokens 200

      localspec run "Write a haiku" --chat --temperature 0.8 --seed 1 --json

      localspec run "$(cat invoice.txt)" --chat --json-schema invoice.schema.json

      localspec run "Rename total to subtotal: $(cat cart.py)" --chat --prediction cart.py
    """
    from localspec.runtime import Runtime

    with user_errors():
        prompt_stdin = prompt == "-" and not prompt_file
        spec = constraint_from_options(json_schema, grammar, regex, stdin_taken=prompt_stdin)
        predicted = read_prediction(prediction, stdin_taken=prompt_stdin or json_schema == "-")
        text = read_prompt(prompt, prompt_file)
        if system is not None:  # a system message only exists inside a chat template
            system = decode_argument(system, "--system")
            chat = True
        if spec is not None:  # its JSON spaced as the prompt's own (schema/json_style.py)
            spec = follow_prompt(spec, [system or "", text])
            options = replace(options, generation=replace(options.generation, constraint=spec))
            options.generation.validate()
        tokens_in: list[int] = []

        def check(c: Checks) -> None:
            """The prompt's tokens and the prediction's, checked before this machine is measured, and kept."""
            nonlocal options
            tokens_in.extend(c.prompt_tokens(text, chat=chat, system=system))
            c.fits(tokens_in)
            options = replace(options, generation=replace(options.generation,
                                                          prediction=c.prediction_tokens(predicted)))

        # from here on a first Ctrl-C is a request: it stops a model load, or the generation after its step
        with ctrl_c_as_request() as cancelled, Runtime.open(options, cancelled=cancelled, check=check) as rt:
            for notice in rt.notices:
                print(f"localspec: {notice}", file=sys.stderr)
            if chat and rt.chat_template.source != "model":
                print(f"localspec: chat template: {rt.chat_template.source}", file=sys.stderr)
            finished = _generate(rt, tokens_in, options, as_json, cancelled)
    if finished.reason == "interrupted":
        raise typer.Exit(130)


def _generate(
    rt: Runtime, prompt_tokens: list[int], options: Settings, as_json: bool, cancelled: Callable[[], bool]
) -> Finished:
    out = sys.stdout
    tokens: list[Token] = []
    pieces: list[str] = []
    finished: Finished | None = None
    for event in rt.generate(prompt_tokens, options.generation, cancelled):
        if isinstance(event, Step):
            for token in event.emitted:
                tokens.append(token)
                pieces.append(token.text)
                if not as_json and token.text:
                    out.write(token.text)
                    out.flush()
        elif isinstance(event, Notice):
            print(f"\nlocalspec: {event.message}", file=sys.stderr)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    pieces.append(finished.tail)
    if as_json:
        doc = json_document(rt.model_name, rt.drafter_name, "".join(pieces), tokens, finished.stats,
                            device=rt.device.description)
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out.write(finished.tail + "\n")
    out.flush()
    for line in stats_lines(finished.stats, rt.drafter_name, device=rt.device.description):
        print(line, file=sys.stderr)
    off = switched_off(rt.drafter_name, options.speculation.k, finished.stats)
    if off:
        print(f"localspec: {off}", file=sys.stderr)
    return finished


def switched_off(drafter: str, k: int | None, stats: Stats) -> str | None:
    """A notice when the policy kept the drafter the user asked for (almost) off: its drafts did not pay here.
    (Off, a drafter is still probed now and then, so "almost": fewer drafted tokens than a quarter of the steps.)"""
    if drafter not in ("draft", "early-exit", "layer-skip") or k is not None or stats.target_passes < 4:
        return None
    if stats.drafted * 4 >= stats.target_passes:
        return None
    return (f"--drafter {drafter} drafted {stats.drafted} token(s) in {stats.target_passes} steps: on this machine "
            "its drafts cost more than they save, so the policy decoded plainly (--k N forces drafts of N tokens; "
            "--drafter ngram or auto may pay)")
