"""Structured output: specs and their errors (no model), then the real model under JSON schemas, a grammar and a
regex: lossless against constrained target-only for every drafter, valid answers, forced tokens drafted, and the
sampled distribution the grammar's mask defines (chi-square)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import localspec as api
from localspec.cli import app
from localspec.drafters.base import Draft, Drafter
from localspec.events import Finished, Step
from localspec.openai_body import BodyError, parse_body
from localspec.runtime import Runtime
from localspec.sampling import Distribution, shape
from localspec.schema import ConstraintError, ConstraintSpec
from localspec.schema.spec import follow_prompt
from localspec.settings import (
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.survival import Survival
from tests.conftest import assert_one_line_error
from tests.lossless import assert_lossless, margin
from tests.stats_helpers import chi_square, chi_square_critical, told_apart

runner = CliRunner()

# -- specs, without a model --


@pytest.mark.parametrize(("schema", "where", "why"), [
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, "properties.a", "strin"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "format": "nope"}}}},
     "properties.a.items", "nope"),
])
def test_a_schema_that_cannot_compile_names_its_place(schema: dict, where: str, why: str) -> None:
    with pytest.raises(ConstraintError) as e:
        ConstraintSpec.json_schema(schema).grammar()
    assert f"(at {where})" in str(e.value) and why in str(e.value)


def test_a_gbnf_error_gives_its_line_and_a_bad_regex_its_position() -> None:
    with pytest.raises(ConstraintError, match="line 2"):
        ConstraintSpec("grammar", 'root ::= "a" item\nitem ::= "b" | + "c"\n').grammar()
    with pytest.raises(ConstraintError, match="position"):
        ConstraintSpec("regex", "(ab").grammar()
    assert ConstraintSpec("grammar", 'root ::= "yes" | "no"').grammar()
    assert ConstraintSpec("grammar", 'start: "yes" | "no"').grammar()  # Lark


def test_response_format_in_a_body() -> None:
    chat = {"messages": [{"role": "user", "content": "x"}]}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = parse_body({**chat, "response_format": response_format}, None, "1")
    assert body.request.constraint == ConstraintSpec.json_schema(schema, "s")
    assert parse_body({**chat, "response_format": {"type": "json_object"}}, None, "1").request.constraint.kind \
        == "json_object"
    assert parse_body({**chat, "response_format": {"type": "text"}}, None, "1").request.constraint is None
    with pytest.raises(BodyError) as e:
        parse_body({**chat, "response_format": {"type": "regex", "regex": ""}}, None, "1")
    assert e.value.param == "response_format.regex"


def test_run_options_are_checked_before_the_model_loads(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"a": {"type": "strin"}}}')
    for args, fragment in [
        (["--json-schema", str(bad)], "properties.a"),
        (["--json-schema", str(tmp_path / "missing.json")], "cannot read --json-schema"),
        (["--regex", "a", "--grammar", str(bad)], "not --grammar and --regex"),
        (["--regex", "(a"], "regex does not compile"),
    ]:
        result = runner.invoke(app, ["run", "hello", *args])
        assert_one_line_error(result.exit_code, result.stderr, fragment)


# -- the real model --

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer",
          "minimum": 0, "maximum": 130}, "city": {"type": "string", "maxLength": 20}},
          "required": ["name", "age", "city"], "additionalProperties": False}
INVOICE = {"type": "object", "properties": {"vendor": {"type": "string", "maxLength": 24},
           "total": {"type": "number"}, "currency": {"enum": ["EUR", "USD", "GBP"]}},
           "required": ["vendor", "total", "currency"], "additionalProperties": False}
TICKET = {"type": "object", "properties": {"priority": {"enum": ["low", "medium", "high"]},
          "product": {"type": "string", "maxLength": 20}, "summary": {"type": "string", "maxLength": 40}},
          "required": ["priority", "product", "summary"], "additionalProperties": False}
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
        "maxItems": 4}}, "required": ["tags"], "additionalProperties": False}
MEETING = {"type": "object", "properties": {"day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
           "hour": {"type": "integer", "minimum": 0, "maximum": 23}, "room": {"type": "string", "maxLength": 12}},
           "required": ["day", "hour", "room"], "additionalProperties": False}
BOOK = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30}, "author": {"type": "string",
        "maxLength": 24}, "year": {"type": "integer"}}, "required": ["title", "author", "year"],
        "additionalProperties": False}

# a worked example each, as a base model needs (without one it runs numbers and strings to the limit)
CASES: list[tuple[dict, str, list[str]]] = [
    (PERSON, 'Text: Anna Schmidt, 34, lives in Berlin.\nJSON: {"name":"Anna Schmidt","age":34,"city":"Berlin"}',
     ["Marco Rossi is 51 and lives in Rome.", "Li Wei (27) moved to Shanghai.", "Berlin is home to Jonas, 40.",
      "Sara Lopez, aged 63, Madrid.", "Tom Baker lives in Leeds and is 19."]),
    (INVOICE, 'Text: Invoice from ACME GmbH, total 120.50 EUR.\nJSON: {"vendor":"ACME GmbH","total":120.5,'
     '"currency":"EUR"}', ["Bill from Northwind, 99.99 USD due.", "Globex Ltd invoiced 4500 GBP.",
                           "Amount 12.00 EUR, vendor Initech.", "Umbrella Corp: total 300 USD.",
                           "Stark Industries charged 75.25 EUR."]),
    (TICKET, 'Text: The printer app crashes on start, urgent!\nJSON: {"priority":"high","product":"printer app",'
     '"summary":"crashes on start"}', ["Minor typo in the billing page footer.", "Login fails for all users now.",
                                       "Dark mode colours look a bit off in Mail.", "Export to CSV is slow sometimes.",
                                       "Payments down for every customer!"]),
    (TAGS, 'Text: A recipe for vegan chocolate cake.\nJSON: {"tags":["recipe","vegan","cake"]}',
     ["A guide to hiking in the Alps.", "Review of a budget laptop.", "News about interest rates.",
      "Tips for learning Spanish fast.", "A story about a lost dog."]),
    (MEETING, 'Text: Let us meet Tuesday at 14 in room B2.\nJSON: {"day":"Tuesday","hour":14,"room":"B2"}',
     ["Friday 9 am, room A1.", "See you Monday at 16 in C3.", "Wednesday, 11 o\'clock, room D4.",
      "Thursday at 8 in the lab.", "Monday 13h in room 101."]),
    (BOOK, 'Text: Dune by Frank Herbert, published 1965.\nJSON: {"title":"Dune","author":"Frank Herbert","year":1965}',
     ["1984 by George Orwell (1949).", "Emma, a novel by Jane Austen from 1815.", "Neuromancer, William Gibson, 1984.",
      "Ulysses (1922), James Joyce.", "The Hobbit by J. R. R. Tolkien, 1937."]),
]
PAIRS = [(schema, f"Extract the fields as JSON.\n{example}\nText: {text}\nJSON: ") for schema, example, texts in CASES
         for text in texts]


def spec_for(schema: dict, prompt: str) -> ConstraintSpec:
    """The schema's spec as every face builds it for this prompt: spaced as the prompt's JSON (compact here)."""
    spec = follow_prompt(ConstraintSpec.json_schema(schema), [prompt])
    assert spec is not None
    return spec
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def rt(model_path: Path) -> Iterator[Runtime]:
    runtime = Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="none"),
                                    history=HistorySettings("memory")))
    yield runtime
    runtime.close()


def constrained(rt: Runtime, prompt: str, spec: ConstraintSpec, drafter: str, k: int | None = None,
                max_tokens: int = MAX_TOKENS) -> tuple[list[int], str, Finished]:
    rt.set_drafter(drafter)
    rt.fresh(k=k)
    ids: list[int] = []
    text: list[str] = []
    finished: Finished | None = None
    for event in rt.generate(rt.prompt_tokens(prompt), GenerationSettings(max_tokens=max_tokens, constraint=spec)):
        if isinstance(event, Step):
            ids += [t.id for t in event.emitted]
            text += [t.text for t in event.emitted]
        elif isinstance(event, Finished):
            finished = event
            text.append(event.tail)
    assert finished is not None
    return ids, "".join(text), finished


def lossless_under(rt: Runtime, prompt: str, spec: ConstraintSpec, ids: list[int], label: str = "") -> None:
    """Every token of the answer within this device's margin of the best the grammar allows there."""
    assert_lossless(rt.model, rt.prompt_tokens(prompt), ids, margin(rt.model),
                    constraint=rt.generator.grammars.start(spec), label=label)


def whole(schema: dict, text: str) -> None:
    assert set(json.loads(text)) == set(schema["required"]), text


def test_thirty_pairs_under_ngram_drafts_are_lossless_under_their_grammar(rt: Runtime) -> None:
    assert len(PAIRS) >= 30
    forced = accepted = passes = tokens = 0
    for schema, prompt in PAIRS:
        spec = spec_for(schema, prompt)
        ids, text, finished = constrained(rt, prompt, spec, "ngram")
        assert finished.reason == "eog", (prompt, text)
        whole(schema, text)
        lossless_under(rt, prompt, spec, ids, prompt[:30])
        forced += finished.stats.forced_drafted
        accepted += finished.stats.forced_accepted
        passes += finished.stats.target_passes
        tokens += finished.stats.generated_tokens
    assert forced and accepted >= 0.9 * forced  # forced tokens are drafts the target nearly always takes
    assert tokens / passes > 1.5  # drafts under a schema pay in tokens a pass


class _Memo(dict):
    """A spec memo's forced tokens that counts the byte strings it answered; with ``wrong``, answers each with it."""

    def __init__(self, known: dict | None = None, wrong: list[int] | None = None) -> None:
        super().__init__(known or {})
        self.wrong = tuple(wrong) if wrong is not None else None
        self.hits = 0

    def get(self, key: bytes, default: object = None) -> object:  # type: ignore[override]
        if self.wrong is not None:
            return self.wrong
        found = super().get(key, default)
        self.hits += found is not None
        return found


def test_a_specs_later_answers_reuse_what_its_first_learned_and_check_it(rt: Runtime) -> None:
    # a spec's forced byte strings are tokenized once (llguidance's tokenizing costs ~0.2 ms a step) and the ids its
    # grammar allows first are read once (most answers start with a token the grammar forbids): a later answer under
    # the same spec takes both from the spec's memo, and the forced tokens are validated like any draft
    zzz = rt.model.vocab.tokenize("zzz", add_special=False, parse_special=False)
    specs = list({spec_for(schema, prompt): prompt for schema, prompt in PAIRS}.items())[:3]
    planted = 0
    for spec, prompt in specs:
        memo = rt.generator.grammars.memo(spec)
        kept = memo.forced, memo.first
        try:
            memo.forced, memo.first = _Memo(), None  # as new: this module's other tests ran the same specs
            first = constrained(rt, prompt, spec, "ngram")
            assert memo.forced and first[2].stats.forced_drafted, prompt
            memo.forced = _Memo(memo.forced)
            again = constrained(rt, prompt, spec, "ngram")
            assert again[0] == first[0] and again[2].stats.forced_drafted and memo.forced.hits, prompt
            # a memo that no longer fits (another tokenization, another state): its tokens are never drafted
            memo.forced = _Memo(wrong=zzz)
            ids, text, finished = constrained(rt, prompt, spec, "ngram")
            assert ids == first[0] and finished.stats.forced_drafted == 0, text
            if memo.first is not None:  # the answer's first token was forbidden: the memo's first ids decide it
                memo.forced, memo.first = _Memo(), np.array([zzz[0]])
                assert constrained(rt, prompt, spec, "ngram")[0][0] == zzz[0], prompt
                planted += 1
        finally:
            memo.forced, memo.first = kept
    assert planted, "no answer started with a token its grammar forbids: the first ids were never read"


def _lookup_acceptance(policy: DraftPolicy) -> tuple[float, float]:
    """(accepted, reached) over every draft position of the sequence's own lookups, as the policy learned them."""
    survivals = [s for kind, s in policy.learned.items() if kind.startswith("ngram")]
    return sum(sum(s.accepted) for s in survivals), sum(sum(s.reached) for s in survivals)


class _Recorded:
    """The real lookup drafter, with what it proposed after which history written down."""

    def __init__(self, inner: Drafter) -> None:
        self.inner, self.name, self.lookup = inner, inner.name, inner.lookup
        self.proposals: list[tuple[str, int, list[int]]] = []

    def begin(self, history: Sequence[int]) -> None:
        self.inner.begin(history)

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        draft = self.inner.propose(history, cap, width)
        self.proposals.append((draft.kind, len(history), list(draft.tokens)))
        return draft

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        self.inner.accept(history, n_accepted, verified)

    def close(self) -> None:
        self.inner.close()


def test_lookups_under_a_schema_learn_what_their_proposals_earn(model_path: Path) -> None:
    # a lookup under a grammar proposes after the forced tokens; scored against the emitted tokens from the first
    # forced one, its first position was a miss whenever a forced token led, and the lookups were trimmed away under
    # schemas. Each proposal is scored here against the text from where it was made, in the order made
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="ngram"),
                        history=HistorySettings("off"))
    learned, truth = [0.0, 0.0], [0.0, 0.0]
    with Runtime.open(settings) as rt:
        for schema, prompt in PAIRS[::3]:
            recorded = _Recorded(rt.generator.drafters[0])
            rt.generator.drafters = [recorded]
            rt.fresh()
            prompt_ids = rt.prompt_tokens(prompt)
            spec = spec_for(schema, prompt)
            text = list(prompt_ids)
            forced, ended = 0, ""
            for event in rt.generate(prompt_ids, GenerationSettings(max_tokens=MAX_TOKENS, constraint=spec)):
                if isinstance(event, Step):
                    text += [t.id for t in event.emitted]
                    forced += event.forced
                elif isinstance(event, Finished):
                    ended = event.reason
            assert forced
            by_kind: dict[str, Survival] = {}  # learned per kind, as the policy learns them
            for kind, at, tokens in recorded.proposals:
                ahead = text[at:at + len(tokens)]
                matched = next((j for j, (a, b) in enumerate(zip(tokens, ahead)) if a != b), len(ahead))
                # a proposal that ran on where the answer ended (its end token, not in the text) missed there
                missed_end = ended == "eog" and matched == len(ahead) < len(tokens)
                by_kind.setdefault(kind, Survival()).update(matched, len(ahead) + missed_end)
            for i, v in enumerate(_lookup_acceptance(rt.generator.policy)):
                learned[i] += v
            truth[0] += sum(sum(s.accepted) for s in by_kind.values())
            truth[1] += sum(sum(s.reached) for s in by_kind.values())
    assert truth[1] > 20  # positions scored: enough to tell 2 points apart
    assert abs(learned[0] / learned[1] - truth[0] / truth[1]) <= 0.02, (learned, truth)


def test_drafts_from_earlier_answers_and_a_draft_model_stay_lossless(rt: Runtime, model_path: Path) -> None:
    cached = 0
    for schema, prompt in PAIRS[::5]:
        spec = spec_for(schema, prompt)
        constrained(rt, prompt, spec, "ngram")  # the history (memory) holds this answer now: "auto" drafts it back
        ids, text, finished = constrained(rt, prompt, spec, "auto")
        whole(schema, text)
        lossless_under(rt, prompt, spec, ids, "auto")
        cached += finished.stats.cache_drafted
    assert cached > 0, "nothing was drafted from the earlier answers"
    # the draft: the target's first 12 of 18 layers (early exit), a model that disagrees with it now and then
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="early-exit", k=3,
                                                                                          exit_layer=12),
                        history=HistorySettings("off"))
    drafted = accepted = 0
    with Runtime.open(settings) as other:
        for schema, prompt in PAIRS[::6]:
            spec = spec_for(schema, prompt)
            ids, text, finished = constrained(other, prompt, spec, "early-exit", k=3)
            whole(schema, text)
            lossless_under(rt, prompt, spec, ids, "early exit")
            drafted += finished.stats.drafted - finished.stats.forced_drafted
            accepted += finished.stats.accepted - finished.stats.forced_accepted
    assert 0 < accepted < drafted, "the draft model's tokens were never proposed, or never rejected"


def test_a_grammar_and_a_regex_say_why_they_ended(rt: Runtime) -> None:
    prompt = "Q: Is the sky blue on a clear day? Answer yes or no.\nA:"
    ids, text, finished = constrained(rt, prompt, ConstraintSpec("grammar", 'root ::= " " ("yes" | "no")'), "ngram")
    assert text in (" yes", " no") and finished.reason == "eog"
    spec = ConstraintSpec("regex", r"[0-9]{3}-[0-9]{4}")
    _, text, finished = constrained(rt, "Call me at 555-1234 or at", spec, "ngram")
    assert len(text) == 8 and text[3] == "-" and finished.reason == "eog"
    _, text, finished = constrained(rt, "Count: 1 2 3 4 5", ConstraintSpec("regex", r"( [0-9])+"), "ngram",
                                    max_tokens=6)
    assert finished.reason == "length" and text.startswith(" ")


# no yellow: the target's best next token here ("yellow", then "green", "blue") is one the grammar forbids, so top-k
# before the mask would keep 2 tokens where the mask before top-k keeps 3 (green, blue, red)
COLOURS = ConstraintSpec("regex", "(red|orange|green|blue|indigo|violet|pink|brown|black)")
# the prompt repeats "colour=red\ncolour=": n-gram drafts propose what followed it ("green"), to be verified
COLOUR_PROMPT = "colour=red\ncolour=blue\ncolour=red\ncolour=green\ncolour=red\ncolour="
TOP3 = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
COLOUR_DRAWS = 160


@pytest.fixture(scope="module")
def colour_row(rt: Runtime) -> tuple[np.ndarray, np.ndarray]:
    """The target's logits for the answer's first token (one pass), and the ids the grammar allows there."""
    from localspec.engine import Context

    prompt = rt.prompt_tokens(COLOUR_PROMPT)
    with Context(rt.model, n_ctx=256) as ctx:
        ctx.decode(prompt[:-1])
        row = ctx.decode(prompt[-1:], all_logits=True)[0].copy()
    return row, rt.generator.grammars.start(COLOURS)._allowed_ids()


def _masked_then_top3(row: np.ndarray, allowed: np.ndarray) -> Distribution:
    masked = np.full_like(row, -np.inf)
    masked[allowed] = row[allowed]
    return shape(masked, TOP3)


def _top3_then_masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The wrong order: top-3 of the whole row, then the mask (the ids left)."""
    top = shape(row, TOP3).ids
    return top[np.isin(top, allowed)]


def test_a_sampled_answer_under_a_grammar_follows_the_mask_then_top_k(rt: Runtime, colour_row) -> None:  # type: ignore[no-untyped-def]
    """The first token of 160 seeded answers, top_k = 3, an n-gram draft (k 3, of which max_tokens 2 leaves room
    for one drafted token before the target's own), against
    the target's logits masked by the grammar and then cut to their best 3: the distribution is the mask's, then
    top-k's, whatever the drafts proposed."""
    row, allowed = colour_row
    p = _masked_then_top3(row, allowed)
    counts: dict[int, int] = {}
    drafted = rejected = 0
    prompt = rt.prompt_tokens(COLOUR_PROMPT)
    rt.set_drafter("ngram")
    try:
        for seed in range(COLOUR_DRAWS):
            rt.generator.sampling = replace(TOP3, seed=seed)
            rt.fresh(k=3)
            first = next(e for e in rt.generate(prompt, GenerationSettings(max_tokens=2, constraint=COLOURS))
                         if isinstance(e, Step))
            counts[first.emitted[0].id] = counts.get(first.emitted[0].id, 0) + 1
            drafted += bool(first.accepted or first.rejected)
            rejected += bool(first.rejected) and not first.accepted
    finally:
        rt.generator.sampling = SamplingSettings()
    assert drafted >= COLOUR_DRAWS * 0.9 and rejected > 0, (drafted, rejected)  # drafted, and turned down at times
    assert set(counts) <= set(p.ids.tolist())  # nothing the grammar forbids, nothing past the best 3 it allows
    observed = np.array([counts.get(int(t), 0) for t in p.ids])
    stat, df = chi_square(observed, p.probs)
    assert stat < chi_square_critical(df), (stat, df, counts)


def test_top_k_before_the_mask_would_be_told_apart(colour_row) -> None:  # type: ignore[no-untyped-def]
    """The order matters on this row, and the test above can see it: top-k's best 3 of the whole vocabulary are not
    the grammar's best 3, and 160 draws of the wrong order's distribution fail the right one's chi-square."""
    row, allowed = colour_row
    p = _masked_then_top3(row, allowed)
    wrong_ids = _top3_then_masked(row, allowed)
    assert len(wrong_ids) > 0 and set(wrong_ids.tolist()) < set(p.ids.tolist())
    wrong = np.isin(p.ids, wrong_ids) * np.exp(row[p.ids] - row[p.ids].max())
    assert told_apart(p.probs, wrong, COLOUR_DRAWS) >= 19


def test_many_prompts_in_one_batch_each_under_its_own_schema_are_lossless(rt: Runtime, model_path: Path) -> None:
    from localspec import generate_many

    chosen = list(range(0, len(PAIRS), 5))
    prompts = [{"id": str(i), "prompt": PAIRS[i][1], "max_tokens": MAX_TOKENS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": PAIRS[i][0]}}} for i in chosen]
    results = {r.id: r for r in generate_many(prompts, model=str(model_path), drafter="ngram", parallel=3,
                                              ctx=1024, keep_history=False)}
    for i in chosen:
        result = results[str(i)]
        assert result.finish_reason == "stop"
        whole(PAIRS[i][0], result.text)
        lossless_under(rt, PAIRS[i][1], spec_for(PAIRS[i][0], PAIRS[i][1]), result.tokens, f"batch {i}")


# -- tool calls: what a request allows, and what an answer called --

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"]}}}


def test_tool_choice_and_the_calls_read_out_of_an_answer() -> None:
    from localspec.structured.tools import read_calls, read_tools

    assert read_tools([WEATHER], "none", None) is None
    use = read_tools([WEATHER], "required", False)
    assert use is not None and use.choice == "required" and not use.parallel
    assert read_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None).choice \
        == "get_weather"
    for tools, choice, param in [([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
                                 ([{"type": "function"}], None, "tools.0"), (None, "required", "tool_choice"),
                                 ([WEATHER, WEATHER], None, "tools")]:
        with pytest.raises(ConstraintError) as e:
            read_tools(tools, choice, None)
        assert e.value.param == param
    ok = lambda name, arguments: arguments.get("unit") in ("c", "f")  # noqa: E731
    use = read_tools([WEATHER], "auto", None)
    calls = read_calls('Let me look.<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}'
                       "\n</tool_call>", use, ok)
    assert calls.content == "Let me look." and json.loads(calls.calls[0]["function"]["arguments"])["city"] == "Oslo"
    fenced = read_calls('```json\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}\n```', use, ok)
    assert fenced.content is None and fenced.calls[0]["function"]["name"] == "get_weather"
    bare = read_calls('[{"name": "get_weather", "arguments": {"city": "A", "unit": "c"}}, {"name": "get_weather", '
                      '"arguments": {"city": "B", "unit": "f"}}]', use, ok)
    assert len(bare.calls) == 2 and bare.calls[0]["id"] != bare.calls[1]["id"]
    # a "call" whose arguments do not match its tool, or of a tool not given, stays text
    assert read_calls('{"name": "get_weather", "arguments": {"city": "A", "unit": "k"}}', use, ok).calls == ()
    assert read_calls('{"name": "send_mail", "arguments": {}}', use, ok).calls == ()
    assert read_calls("The weather is fine.", use, ok).calls == ()


def test_run_answers_under_a_schema_file_and_counts_the_forced_tokens(tmp_path: Path, model_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    result = runner.invoke(app, ["run", PAIRS[0][1], "--model", str(model_path), "--json-schema", str(schema),
                                 "--json", "-n", str(MAX_TOKENS), "--ctx", "1024", "--drafter", "ngram"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(json.loads(doc["text"])) == set(PERSON["required"])
    assert doc["stats"]["forced_drafted"] > 0 and doc["stats"]["stop_reason"] == "eog"


# -- promises with drafts on: sampled answers under a schema, and a draft model's drafts under grammars in a batch


def test_sampled_answers_under_a_schema_with_drafts_are_valid(model_path: Path) -> None:
    chosen = PAIRS[::6]
    prompts = [{"id": f"{i}-{seed}", "prompt": prompt, "max_tokens": MAX_TOKENS, "seed": seed, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        for i, (schema, prompt) in enumerate(chosen) for seed in range(3)]
    results = list(api.generate_many(prompts, model=str(model_path), drafter="ngram", k=3, parallel=3, ctx=1024,
                                     temperature=0.8, keep_history=False))
    assert len(results) == len(prompts)
    for r in results:
        assert r.finish_reason == "stop", r
        whole(chosen[int(r.id.split("-")[0])][0], r.text)
    assert sum(r.stats.drafted - r.stats.forced_drafted for r in results) > 0  # the lookup drafted, not only forced
    assert len({r.text for r in results}) > len(chosen)  # sampled: seeds gave other answers


def test_a_draft_models_drafts_under_each_requests_grammar_in_a_batch_are_lossless(rt: Runtime,
                                                                                   model_path: Path) -> None:
    """The draft phase (one draft-model pass a depth for every lane) under each request's own schema: the early-exit
    model at layer 12 of 18, which the target turns down now and then."""
    from localspec.batch.run import run_requests
    from localspec.request import Request
    from localspec.runtime import BatchRuntime

    chosen = list(range(1, len(PAIRS), 6))
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024),
                        SpeculationSettings(drafter="early-exit", k=3, exit_layer=12), history=HistorySettings("off"))
    requests = [Request(str(i), prompt=PAIRS[i][1], max_tokens=MAX_TOKENS,
                        constraint=spec_for(PAIRS[i][0], PAIRS[i][1])) for i in chosen]
    with BatchRuntime.open(settings, 3) as batch:
        assert batch.drafts is not None
        results = {r.id: r for r in run_requests(batch, requests)}
    for i in chosen:
        r = results[str(i)]
        assert r.finish_reason == "stop", r
        whole(PAIRS[i][0], r.text)
        lossless_under(rt, PAIRS[i][1], spec_for(PAIRS[i][0], PAIRS[i][1]), r.tokens, f"early exit {i}")
    model_drafted = sum(r.stats.drafted - r.stats.forced_drafted for r in results.values())
    model_accepted = sum(r.stats.accepted - r.stats.forced_accepted for r in results.values())
    assert 0 < model_accepted < model_drafted, (model_accepted, model_drafted)  # verified; some turned down


def test_a_generation_shares_its_specs_memo_only_with_the_matcher_it_was_kept_with(rt: Runtime) -> None:
    # a server's admission compiles a request's matcher; by the time it runs, the spec may have been dropped from the
    # cache and compiled again: the memo's forced tokens were learned beside one matcher, so another gets its own
    grammars = rt.generator.grammars
    spec = spec_for(*PAIRS[0])
    compiled = grammars.compile(spec)
    memo = grammars.memo(spec)
    assert grammars.start(spec)._memo is memo
    assert grammars.start(spec, compiled)._memo is memo
    elsewhere = compiled.deep_copy()  # stands for a matcher compiled before the spec was dropped
    own = grammars.start(spec, elsewhere)._memo
    assert own is not memo and not own.forced
