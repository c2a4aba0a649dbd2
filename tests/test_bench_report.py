"""The report layer: divergence flagging and near-tie classification from token lists, medians, JSON, Markdown,
the terminal table and the chart (or the message when matplotlib is missing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from localspec.bench import formats, output
from localspec.bench import report as rep
from localspec.bench.compare import NEAR_TIE_MARGIN, Divergence, annotate, first_divergence, first_text_divergence
from localspec.bench.records import RunRecord

MACHINE = rep.Machine("Test CPU (2 cores)", 2, 0, "0.0.0")
BASE = [10, 11, 12, 13, 14, 15]


def _run(prompt: str, cat: str, drafter: str, repeat: int, tokens: list[int], tps: float) -> RunRecord:
    drafted = drafter != "none"
    return RunRecord(prompt, cat, drafter, repeat, tokens, " ".join(map(str, tokens)), len(tokens), 1.0, tps,
                     0.5 if drafted else None, 2.0 if drafted else None, "length")


def _records() -> list[RunRecord]:
    return [
        _run("p1", "grounded", "none", 0, BASE, 10.0),
        _run("p1", "grounded", "ngram", 0, [10, 11, 99, 13, 14, 15], 30.0),  # deliberately different at 2
        _run("p2", "chat", "none", 0, BASE, 20.0),
        _run("p2", "chat", "ngram", 0, BASE, 20.0),
        _run("p1", "grounded", "none", 1, BASE, 12.0),
        _run("p1", "grounded", "ngram", 1, BASE, 24.0),
        _run("p2", "chat", "none", 1, BASE, 20.0),
        _run("p2", "chat", "ngram", 1, [10, 11, 12, 13, 77, 15], 10.0),  # different at 4
    ]


def _gap(baseline: RunRecord, run: RunRecord, div: Divergence) -> float:
    # stands in for the model re-decode: p1's divergence is a near-tie, p2's is far outside the noise
    return 0.3 if run.prompt_id == "p1" else 5.0


def _report(records: list[RunRecord], **kw: object) -> rep.Report:
    return rep.build_report(records, model="toy", machine=MACHINE, suite="test", command="localspec bench",
                            drafters=["none", "ngram"], repeat=2, **kw)  # type: ignore[arg-type]


def test_first_divergence() -> None:
    assert first_divergence(BASE, BASE) is None
    assert first_divergence(BASE, [10, 11, 7]) == Divergence(2, 12, 7)
    assert first_divergence(BASE, BASE[:4]) == Divergence(4, 14, None)  # the run ended early
    assert first_divergence(BASE[:3], BASE) == Divergence(3, None, 13)
    assert first_text_divergence("abcdef", "abXdef") == Divergence(2, unit="char")
    assert first_text_divergence("same", "same") is None


def test_divergences_are_flagged_with_position_and_near_tie() -> None:
    records = _records()
    annotate(records, _gap)
    by = {(r.prompt_id, r.drafter, r.repeat): r for r in records}
    near = by[("p1", "ngram", 0)].divergence
    assert near is not None and near.position == 2 and near.baseline_token == 12 and near.token == 99
    assert near.near_tie is True and near.gap == pytest.approx(0.3)
    far = by[("p2", "ngram", 1)].divergence
    assert far is not None and far.position == 4 and far.near_tie is False and far.gap == 5.0
    assert by[("p1", "ngram", 1)].identical is True
    assert by[("p1", "none", 0)].identical is True  # the baseline itself
    assert by[("p1", "none", 1)].identical is True  # later target-only repeats are checked for determinism
    assert "near-tie" in near.describe() and "NOT a near-tie" in far.describe()


def test_unclassified_without_a_gap_and_no_baseline_means_not_compared() -> None:
    records = [_run("p1", "g", "none", 0, BASE, 10.0), _run("p1", "g", "ngram", 0, [1], 10.0),
               _run("p9", "g", "ngram", 0, BASE, 10.0)]
    annotate(records)
    assert records[1].divergence is not None and records[1].divergence.near_tie is None
    assert records[2].compared is False and records[2].identical is None


def test_anchor_runs_are_compared_by_text() -> None:
    base = _run("p1", "g", "none", 0, BASE, 10.0)
    same = RunRecord("p1", "g", "anchor:create_completion", 0, [], base.text, 6, 1.0, 9.0, anchor=True)
    other = RunRecord("p1", "g", "anchor:prompt-lookup", 0, [], base.text[:3] + "!", 6, 1.0, 9.0, anchor=True)
    annotate([base, same, other])
    assert same.identical is True
    assert other.divergence == Divergence(3, unit="char")


def test_json_schema_medians_and_summary() -> None:
    records = _records()
    annotate(records, _gap)
    doc = formats.to_json(_report(records, categories=["grounded", "chat"], planned_runs=8))
    assert set(doc) >= {"model", "machine", "results", "summary"}
    assert doc["machine"] == {"cpu": "Test CPU (2 cores)", "threads": 2, "device": "", "gpu_layers": 0,
                              "llama_cpp_version": "0.0.0"}
    keys = {"prompt_id", "category", "drafter", "tokens_per_second", "speedup", "acceptance_rate",
            "mean_accepted_length", "identical_to_baseline"}
    assert all(keys <= set(r) for r in doc["results"])
    rows = {(r["prompt_id"], r["drafter"]): r for r in doc["results"]}
    p1 = rows[("p1", "ngram")]
    assert p1["speedup"] == pytest.approx(2.5)  # median of the paired ratios 30/10 and 24/12
    assert p1["tokens_per_second"] == pytest.approx(27.0)
    assert p1["identical_to_baseline"] is False
    assert p1["divergences"] == [{"repeat": 0, "unit": "token", "position": 2, "baseline_token": 12, "token": 99,
                                  "logit_gap": 0.3, "near_tie": True, "gap_measured_on": "prefill"}]
    assert rows[("p1", "none")]["speedup"] == 1.0 and rows[("p1", "none")]["acceptance_rate"] is None
    assert doc["summary"]["ngram"]["grounded"] == {"median_speedup": 2.5, "median_tokens_per_second": 27.0}
    assert doc["summary"]["ngram"]["chat"]["median_speedup"] == pytest.approx(0.75)
    assert doc["complete"] is True and doc["near_tie_margin"] == NEAR_TIE_MARGIN
    json.dumps(doc)  # serialisable as is


def test_table_and_markdown_show_counts_and_divergences() -> None:
    records = _records()
    annotate(records, _gap)
    report = _report(records, categories=["grounded", "chat"], interrupted=True, planned_runs=12)
    console = Console(record=True, width=200)
    console.print(formats.render_table(report))
    table = console.export_text()
    assert "PARTIAL: 8/12 runs" in table
    assert "1/2 (1 near-tie)" in table and "1/2 (1 NOT near-tie)" in table
    assert "(all)" in table
    md = formats.to_markdown(report, chart="bench.png")
    assert "Produced by `localspec bench`" in md and "![speedup by category and drafter](bench.png)" in md
    assert "| grounded | ngram | 27.0 | 2.50x | 50% | 2.00 | 1/2 (1 near-tie) |" in md
    assert "p2 · ngram · repeat 2: differs at token 4: NOT a near-tie" in md
    assert "**partial**" in md


def test_chart_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    records = _records()
    annotate(records, _gap)
    files, warning = output.write_outputs(_report(records), tmp_path)
    assert warning is None
    png = tmp_path / output.CHART_NAME
    assert png in files and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(png).shape[0] > 100


def _matplotlib_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A `matplotlib` package first on the PYTHONPATH that the chart's child process inherits, whose import runs
    ``body``."""
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")])))


def test_missing_matplotlib_gives_a_clear_message_and_still_writes(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _matplotlib_stub(tmp_path, monkeypatch, "raise ImportError('No module named matplotlib')\n")
    records = _records()
    annotate(records)
    files, warning = output.write_outputs(_report(records), tmp_path / "out")
    assert warning is not None and "pip install 'localspec[plot]'" in warning
    assert {f.name for f in files} == {output.JSON_NAME, output.MARKDOWN_NAME}
    assert "![" not in (tmp_path / "out" / output.MARKDOWN_NAME).read_text()


def test_a_chart_that_crashes_its_process_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as `import matplotlib.pyplot` did after llama.cpp's CUDA libraries on an H100: a segfault, for real
    _matplotlib_stub(tmp_path, monkeypatch, "import ctypes\nctypes.string_at(0)\n")
    records = _records()
    annotate(records)
    out = tmp_path / "out"
    files, warning = output.write_outputs(_report(records), out)
    assert warning == "no chart: drawing it crashed (SIGSEGV)"
    assert {f.name for f in files} == {output.JSON_NAME, output.MARKDOWN_NAME}
    assert json.loads((out / output.JSON_NAME).read_text())["results"] and "![" not in (out / "bench.md").read_text()


def test_repeats_that_disagree_beyond_noise_are_flagged() -> None:
    def runs(second_ngram_tps: float) -> list[RunRecord]:
        return [_run("a", "grounded", "none", 0, [1], 10.0), _run("a", "grounded", "ngram", 0, [1], 20.0),
                _run("a", "grounded", "none", 1, [1], 10.0), _run("a", "grounded", "ngram", 1, [1], second_ngram_tps)]

    report = _report(runs(12.0), categories=["grounded"])
    (ngram,) = [r for r in report.results if r.drafter == "ngram"]
    assert ngram.spread == pytest.approx(2.0 / 1.2 - 1)
    assert report.unstable() == [ngram]
    assert _report(runs(19.0), categories=["grounded"]).unstable() == []


def test_tree_passes_and_branches_per_tree_pass_in_json_table_and_markdown() -> None:
    def tree_run(prompt: str, repeat: int, passes: int, trees: int, branches: int) -> RunRecord:
        r = _run(prompt, "grounded", "ngram", repeat, BASE, 20.0)
        r.target_passes, r.tree_passes, r.branches = passes, trees, branches
        return r

    records = [
        _run("p1", "grounded", "none", 0, BASE, 10.0), tree_run("p1", 0, 10, 2, 5),
        _run("p1", "grounded", "none", 1, BASE, 10.0), tree_run("p1", 1, 10, 4, 9),
        _run("p2", "grounded", "none", 0, BASE, 10.0), tree_run("p2", 0, 10, 0, 0),
        _run("p2", "grounded", "none", 1, BASE, 10.0), tree_run("p2", 1, 10, 0, 0),
        # a record as older versions wrote it: no pass counts at all
        _run("p1", "grounded", "auto", 0, BASE, 15.0), _run("p1", "grounded", "auto", 1, BASE, 15.0),
    ]
    annotate(records)
    report = rep.build_report(records, model="toy", machine=MACHINE, suite="test", command="localspec bench",
                              drafters=["none", "ngram", "auto"], repeat=2, categories=["grounded"])
    by = {(r.prompt_id, r.drafter): r for r in report.results}
    p1 = by[("p1", "ngram")]
    assert p1.tree_passes == 3 and p1.tree_share == pytest.approx(0.3)
    assert p1.branches_per_tree_pass == pytest.approx(14 / 6)  # over all its repeats' tree passes
    p2 = by[("p2", "ngram")]
    assert p2.tree_share == 0 and p2.branches_per_tree_pass is None  # drafted, but never a tree
    old = by[("p1", "auto")]
    assert old.tree_passes is None and old.tree_share is None and old.branches_per_tree_pass is None
    assert by[("p1", "none")].tree_share is None  # the baseline drafts nothing

    doc = formats.to_json(report)
    rows = {(r["prompt_id"], r["drafter"]): r for r in doc["results"]}
    assert rows[("p1", "ngram")]["tree_passes"] == 3.0
    assert rows[("p1", "ngram")]["tree_pass_share"] == 0.3
    assert rows[("p1", "ngram")]["branches_per_tree_pass"] == 2.33
    assert rows[("p1", "auto")]["tree_pass_share"] is None
    groups = {(g["category"], g["drafter"]): g for g in doc["groups"]}
    tree = groups[("grounded", "ngram")]
    assert tree["median_tree_pass_share"] == 0.15  # median of the prompts' 30% and 0%
    assert tree["median_branches_per_tree_pass"] == 2.33  # the prompts that verified trees
    assert tree["median_tokens_per_pass"] == 2.0 and tree["prompts"] == 2
    assert set(doc["summary"]["ngram"]["grounded"]) == {"median_speedup", "median_tokens_per_second"}
    json.dumps(doc)

    console = Console(record=True, width=200)
    console.print(formats.render_table(report))
    table = console.export_text()
    assert "tree passes" in table and "branches/tree" in table
    md = formats.to_markdown(report)
    assert "| grounded | ngram | 20.0 | 2.00x | 50% | 2.00 | 4/4 | 15% | 2.3 |" in md
    assert "| grounded | auto | 15.0 | 1.50x | 50% | 2.00 | 2/2 | – | – |" in md  # old records: unknown
    assert "| p1 | grounded | ngram | 20.0 | 2.00x | 50% | 2.00 | 2/2 | 30% | 2.3 |" in md
    assert "tree passes is the share of target passes that verified a token tree" in md


def test_a_devices_margin_classifies_and_the_worst_gap_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """The margin a device measured (speculative/noise.py) classifies, is kept in bench.json, and the terminal
    names the worst divergence's prompt, drafter, repeat and position (a count alone named nothing)."""
    from localspec.cli.bench import _print_report

    records = _records()
    annotate(records, _gap, {"prefill": 0.2})  # p1's 0.3 is beyond a margin of 0.2
    by = {(r.prompt_id, r.drafter, r.repeat): r for r in records}
    near = by[("p1", "ngram", 0)].divergence
    assert near is not None and near.near_tie is False and near.margin == 0.2
    report = _report(records, margin=0.2)
    assert formats.to_json(report)["near_tie_margin"] == 0.2
    worst = report.worst_divergence()
    assert worst is not None and (worst[0].prompt_id, worst[1], worst[2].position) == ("p2", 1, 4)
    _print_report(report, None, False, Console(stderr=True))
    err = capsys.readouterr().err
    assert "2 output(s) differ from target-only beyond this device's 0.20-logit noise margin" in err
    assert "worst: p2 · ngram · repeat 2, token 4, logit gap 5.00" in err


def test_a_gap_remeasured_on_target_onlys_path_says_so() -> None:
    records = _records()
    annotate(records, lambda b, r, d: (0.4, "decode"), {"prefill": 0.1, "decode": 0.5})
    div = records[1].divergence
    assert div is not None and div.near_tie is True and div.path == "decode" and div.margin == 0.5
    assert "measured as target-only decoded it" in div.describe()
    assert formats.to_json(_report(records))["results"][1]["divergences"][0]["gap_measured_on"] == "decode"
