"""Replays on cost tables: loading the tables, pricing a generation, and the policy's learned step cost."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.bench.replay import (
    CostTable,
    Known,
    load_cost_table,
    replay,
    replay_batch,
    replay_oracle,
    shipped_tables,
)
from localspec.bench.runner import split_variant
from localspec.bench.suite import load_suite
from localspec.drafters.base import Draft
from localspec.errors import UserError
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.shapes import AFTER_CHANGE, CAPTURE, Warmup

# a copied passage, then the same passage again: prompt lookup can draft the second copy
PASSAGE = list(range(100, 160))
PROMPT, OUTPUT = PASSAGE + [7], PASSAGE[:40]


def test_shipped_tables_load_by_name_and_cover_three_devices() -> None:
    assert {"h100", "epyc-avx2-2t", "spr-2t"} <= set(shipped_tables())
    h100 = load_cost_table("h100")
    assert h100.device.startswith("NVIDIA H100") and h100.bare(1) == pytest.approx(0.0011)
    assert h100.step(1) > h100.bare(1)  # fitted to live runs: a live step costs more than the bare pass
    # a pass right after a change of size runs without a CUDA graph; the one after it captures one
    assert h100.step(8, CAPTURE) > h100.step(8, AFTER_CHANGE) > h100.step(8)
    assert load_cost_table("spr-2t").step(8, AFTER_CHANGE) == load_cost_table("spr-2t").step(8)  # a CPU: no graphs
    # rows spread over 8 sequences cost more than one sequence's (measured); 4 sequences, in between
    assert h100.spread(16, 8) == pytest.approx(0.0042) and h100.bare(16) < h100.spread(16, 4) < h100.spread(16, 8)
    assert load_cost_table("spr-2t").spread(16, 8) == load_cost_table("spr-2t").bare(16)  # no such figures: as one
    spr = load_cost_table("spr-2t")
    assert spr.bare(6) == pytest.approx((0.031 + 0.049) / 2)  # between measured sizes: interpolated
    assert spr.bare(17) == pytest.approx(0.073 + (0.073 - 0.060) / 4)  # past the last: its slope


def test_a_calibration_cache_file_reads_as_a_table(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"1": 0.02, "2": 0.03, "4": 0.04}))
    table = load_cost_table(path)
    assert table.seconds_by_batch == {1: 0.02, 2: 0.03, 4: 0.04} and table.step(3) == pytest.approx(0.035)


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "expected a JSON object"),
    ('{"seconds_by_batch": {"1": 0.01}}', "at least one more size"),
    ('{"seconds_by_batch": {"one": 0.01, "2": 0.02}}', "must map batch sizes to seconds"),
    ('{"1": 0.01, "2": -1}', "positive seconds"),
    ("{oops", "cannot read cost table"),
])
def test_bad_tables_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_cost_table(path)


def test_replay_prices_passes_on_the_table() -> None:
    flat = CostTable("flat", {1: 1.0, 2: 1.0, 17: 1.0})  # every pass costs the same: drafting is free
    plain = replay("none", PROMPT, OUTPUT, flat)
    assert (plain.target_passes, plain.decode_seconds) == (40, 40.0)
    fixed = replay("ngram", PROMPT, OUTPUT, flat, k=4)
    assert fixed.drafted <= 4 * fixed.target_passes and fixed.target_passes == fixed.decode_seconds
    # every pass emits its accepted draft + one token
    assert fixed.accepted == fixed.generated_tokens - fixed.target_passes
    adaptive = replay("ngram", PROMPT, OUTPUT, flat)
    assert adaptive.target_passes < fixed.target_passes < plain.target_passes
    oracle = replay_oracle(PROMPT, OUTPUT, flat)
    assert oracle.target_passes <= adaptive.target_passes and oracle.acceptance_rate == 1.0
    linear = CostTable("linear", {1: 1.0, 2: 2.0})  # a pass of n costs n singles: drafting can only lose
    assert replay("ngram", PROMPT, OUTPUT, linear).decode_seconds <= plain.decode_seconds * 1.05


def test_model_drafters_cannot_be_replayed() -> None:
    with pytest.raises(UserError, match="cannot be replayed"):
        replay("draft", PROMPT, OUTPUT, load_cost_table("h100"))


def test_drafter_variants() -> None:
    assert split_variant("ngram") == ("ngram", None, None)
    assert split_variant("ngram:k7") == ("ngram", 7, None)
    assert split_variant("ngram:b4") == ("ngram", None, 4)
    assert split_variant("ngram:k3b2") == ("ngram", 3, 2)
    for bad in ("ngram:7", "ngram:k", "ngram:k99", "ngram:kx", "ngram:b0", "ngram:b9", "ngram:b4k3"):
        with pytest.raises(UserError, match="NAME:kN"):
            split_variant(bad)


def test_sizes_never_seen_live_are_no_cheaper_than_a_live_draft_step() -> None:
    # calibrated bare passes; live, a pass that verifies a draft costs 3 ms more. A size the policy has not used
    # must not look cheaper than it will be, or the policy drifts to it (seen on an H100: passes past 8)
    c = DraftPolicy(k_max=16)
    bare = {n: 0.001 * n for n in range(1, 18)}
    c.calibrate(bare)
    for _ in range(30):
        c.observe(Draft([1, 2, 3], None, "ngram", "ngram/4+"), 3, 0.0, bare[4] + 0.003, [1, 2, 3, 4])
    assert c.costs(4) == pytest.approx(bare[4] + 0.003)
    # the calibration's shape at the live level: the seen size's ratio, live ÷ calibrated
    assert c.costs(12) == pytest.approx(bare[12] * 7 / 4) and c.costs(12) >= bare[12] + 0.003


def test_records_that_cannot_be_replayed_are_named_not_fatal() -> None:
    from localspec.bench.records import RunRecord
    from localspec.bench.replay import replay_records

    def run(drafter: str, anchor: bool = False) -> RunRecord:
        return RunRecord("p", "grounded", drafter, 0, OUTPUT, "", len(OUTPUT), 1.0, 40.0, stop_reason="length",
                         anchor=anchor)

    records = [run("none"), run("ngram:k3"), run("auto"), run("draft"), run("anchor:create_completion", anchor=True)]
    table = load_cost_table("h100")
    priced, skipped = replay_records(records, {"p": PROMPT}, table, fixed_k=None, with_draft_model=True)
    # anchors carry a ':' but are no variant; auto with a draft model would be replayed as n-gram alone
    assert skipped == ["auto", "draft", "anchor:create_completion"]
    assert [r.drafter for r in priced] == ["none", "oracle", "ngram:k3"]
    _, kept = replay_records(records[:3], {"p": PROMPT}, table, fixed_k=None, with_draft_model=False)
    assert kept == []


def test_the_pass_that_ends_a_generation_is_priced() -> None:
    flat = CostTable("flat", {1: 1.0, 2: 1.0, 17: 1.0})
    ended, cut = replay("none", PROMPT, OUTPUT, flat, eog=True), replay("none", PROMPT, OUTPUT, flat)
    assert ended.target_passes == cut.target_passes + 1
    assert replay("ngram", PROMPT, OUTPUT, flat, eog=True).generated_tokens == len(OUTPUT)  # the end is no token
    ended, cut = replay_oracle(PROMPT, OUTPUT, flat, eog=True), replay_oracle(PROMPT, OUTPUT, flat)
    assert ended.target_passes == cut.target_passes + 1


def test_the_oracle_copies_only_what_has_been_generated() -> None:
    flat = CostTable("flat", {1: 1.0, 2: 1.0, 17: 1.0})
    # after [5, 6] a run of 7s: each step can copy only the 7s already there, so the copies double in length
    assert replay_oracle([5, 6], [7] * 20, flat).target_passes >= 4


def test_a_replayed_tree_pass_answers_on_the_replayed_path_only_and_costs_all_its_nodes() -> None:
    from localspec.bench.replay import _Clock, _KnownTarget

    table = load_cost_table("h100")
    clock = _Clock()
    target = _KnownTarget([1, 2, 3, 4, 5], table, clock, eog=False)
    target.feed([1])  # the cache holds the prompt but its last token, 2, which is pending
    # rows: 2 (pending), 3 (right), 9 (wrong), 4 (right, after 3), 8 (after the wrong 9)
    best = target.decode_tree_argmax([2, 3, 9, 4, 8], [-1, 0, 0, 1, 2])
    assert best == [3, 4, -1, 5, -1]
    # the context's first pass: right after a change of shape, without a CUDA graph
    assert clock.now == pytest.approx(table.step(5, AFTER_CHANGE))
    assert table.step(5, AFTER_CHANGE) > table.step(5)
    target.keep_path([0, 1, 3])
    assert target.tokens == [1, 2, 3, 4]


def test_with_one_candidate_a_step_allowed_trees_is_exactly_the_chain() -> None:
    """Every n-gram of the passage occurs once: there is never a second candidate, so --branches 4 must replay
    exactly as one chain, pass for pass (a chain without pass shapes: trees are never padded)."""
    table = load_cost_table("h100")
    chain = replay("ngram", PROMPT, OUTPUT, table, branches=1, shapes=False)
    tree = replay("ngram", PROMPT, OUTPUT, table, branches=4, shapes=False)
    assert tree.tree_passes == 0
    assert (tree.target_passes, tree.drafted, tree.accepted) == (chain.target_passes, chain.drafted, chain.accepted)
    assert tree.decode_seconds == chain.decode_seconds


def test_on_a_gpu_table_the_oracle_weighs_a_change_of_size() -> None:
    """Copies of 8 tokens with a new token between, at most 7 drafted: drafting exactly each copy alternates passes
    of 8 rows and 1, each after a change (no CUDA graph); the oracle pads the gaps instead, which costs less, and
    never less than the same passes all steady."""
    table = load_cost_table("h100")
    text = list(range(100, 228))
    output = [t for i in range(0, 128, 8) for t in [*text[i : i + 8], 500 + i]]
    oracle = replay_oracle(text, output, table, k_max=7)
    warmup, exact, pos = Warmup(), 0.0, 0
    while pos < len(output):  # the exact-length schedule: 7 drafted where a copy goes on, none at a new token
        n = 8 if output[pos] < 500 and pos + 8 <= len(output) else 1
        exact += table.step(n, warmup.step(n))
        pos += n
    assert oracle.decode_seconds < exact
    steady = replace(table, after_change={}, capture=0.0)
    assert oracle.decode_seconds > replay_oracle(text, output, steady, k_max=7).decode_seconds


def test_a_table_can_price_a_batch_s_prompts_and_the_replay_then_pays_for_them() -> None:
    # unpriced, a batch's prompt chunks cost nothing and its replay ran 12% above what this CPU lived
    table = load_cost_table("h100")
    assert table.prompt(8, 32) == 0.0  # no shipped table prices them yet
    priced = replace(table, prompt_share=0.4)
    assert priced.prompt(8, 32) == pytest.approx(0.4 * (table.bare(40) - table.bare(8)))
    assert priced.prompt(0, 32) == pytest.approx(0.4 * table.bare(32)) and priced.prompt(8, 0) == 0.0
    known = [Known([7, 8, 9] * 20, OUTPUT, eog=False), Known([4, 5] * 30, OUTPUT, eog=False)]
    free, paid = (replay_batch("ngram", known, t, 2) for t in (table, priced))
    assert paid.generated_tokens == free.generated_tokens and paid.seconds > free.seconds


def test_the_loop_before_pass_shapes_decides_by_what_its_calibration_measured_there() -> None:
    # be0108d's policy on the H100 believed its interleaved calibration (1 row 2.12 ms, where a repeated pass cost
    # 1.10 and one without a graph 1.65): a replay of that loop decides by those figures and prices by the passes
    table = load_cost_table("h100")
    believed = table.calibration(17, steady=False)
    assert believed[1] == pytest.approx(0.00212) and believed[17] == pytest.approx(0.00611)
    assert table.calibration(17) == {n: table.bare(n) for n in range(1, 18)}  # the loop now: steady passes
    without = replace(table, interleaved={})
    assert without.calibration(3, steady=False) == {n: table.unsteady(n) for n in (1, 2, 3)}
    known = [Known([7, 8, 9] * 20, OUTPUT, eog=False)]
    assert replay_batch("ngram", known, table, 1, shapes=False).seconds != \
        replay_batch("ngram", known, without, 1, shapes=False).seconds
    one = known[0]
    assert replay("ngram", one.prompt, one.output, table, shapes=False).decode_seconds != \
        replay("ngram", one.prompt, one.output, without, shapes=False).decode_seconds
    assert table.calibration(20, steady=False)[20] == believed[17]  # past what it measured: flat, not its cliff


def test_the_replay_scripts_price_shipped_outputs_of_every_suite_prompt() -> None:
    # the replayed figures in docs/performance.md are reproducible on any machine only while every prompt of the
    # suites has its shipped greedy output (a prompt changed without `replay_tables.py --ship-outputs` would be
    # generated on the machine at hand, whose near-ties differ). The built-in suite is this repository's; the
    # held-out one beside it (../shared) may change under us, and then only its figures lose that.
    from tests.script_modules import load_script

    replay_tables = load_script("replay_tables")
    shipped = json.loads(replay_tables.SHIPPED_OUTPUTS.read_text())["by_prompt"]
    prompts = list(load_suite(None).prompts)
    missing = [p.id for p in prompts if replay_tables._key(p) not in shipped]
    assert not missing, f"no shipped replay output for {missing}: run tools/replay_tables.py --ship-outputs"
    for prompt_tokens, output in shipped.values():
        assert prompt_tokens and all(isinstance(t, int) for t in prompt_tokens + output)
    outs = replay_tables.outputs(prompts)  # all shipped: nothing is generated (no model is loaded here)
    assert {p.id for p in prompts} == set(outs)


def test_the_replay_scripts_price_another_machine_s_texts_where_told(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # a GPU's greedy texts drafted a third further than the shipped CPU ones (gpu_replay.py --check): saved by
    # gpu_live.sh 9, REPLAY_OUTPUTS=FILE prices them in every replay script
    from tests.script_modules import load_script

    replay_tables = load_script("replay_tables")
    shipped = json.loads(replay_tables.SHIPPED_OUTPUTS.read_text())["by_prompt"]
    prompts = list(load_suite(None).prompts)
    first = replay_tables._key(prompts[0])
    theirs = {**shipped, first: [shipped[first][0], [7, 7, 7]]}
    (tmp_path / "gpu.json").write_text(json.dumps({"by_prompt": theirs}))
    monkeypatch.setenv("REPLAY_OUTPUTS", str(tmp_path / "gpu.json"))
    outs = replay_tables.outputs(prompts)
    assert outs[prompts[0].id][1] == [7, 7, 7] and outs[prompts[1].id][1] == shipped[replay_tables._key(prompts[1])][1]
    monkeypatch.setenv("REPLAY_OUTPUTS", str(tmp_path / "none.json"))
    with pytest.raises(SystemExit, match="REPLAY_OUTPUTS=.*no such file"):
        replay_tables.outputs(prompts)


def test_a_run_that_parted_at_a_near_tie_is_priced_over_target_only_s_text() -> None:
    from localspec.bench.compare import Divergence
    from localspec.bench.records import RunRecord
    from localspec.bench.replay import replay_records

    flipped = OUTPUT[:5] + [OUTPUT[5] + 1000] + OUTPUT[:34]  # parts at token 5, then a text of its own

    def run(drafter: str, tokens: list[int], divergence: Divergence | None = None) -> RunRecord:
        return RunRecord("p", "grounded", drafter, 0, tokens, "", len(tokens), 1.0, 40.0, stop_reason="length",
                         compared=True, divergence=divergence)

    table = load_cost_table("h100")
    tie, real = Divergence(5, OUTPUT[5], flipped[5], gap=0.1, near_tie=True), Divergence(5, gap=3.0, near_tie=False)
    priced, _ = replay_records([run("none", OUTPUT), run("ngram", flipped, tie), run("ngram:k3", flipped, real)],
                               {"p": PROMPT}, table, fixed_k=None, with_draft_model=False)
    by = {r.drafter: r for r in priced}
    over_target_only = replay("ngram", PROMPT, OUTPUT, table).decode_seconds
    assert by["ngram"].decode_seconds == pytest.approx(over_target_only)
    # a real divergence is the run's own text (and a bug to report): priced as it ran
    assert by["ngram:k3"].decode_seconds == pytest.approx(replay("ngram", PROMPT, flipped, table, k=3).decode_seconds)
    assert by["ngram:k3"].decode_seconds != pytest.approx(replay("ngram", PROMPT, OUTPUT, table, k=3).decode_seconds)
