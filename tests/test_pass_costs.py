"""The pass-cost curve the draft length is chosen on: a calibration corrected by live passes, robust to noise."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from localspec.bench.replay import load_cost_table
from localspec.drafters.base import Draft
from localspec.speculative.costs import LEVEL_WINDOW, MIN_PASSES, STALE_AFTER, PassCosts
from localspec.speculative.policy import DraftPolicy
from tests.test_policy import COSTS, LOOKUP, PASSAGE, policy

QUIET = load_cost_table("epyc-avx2-2t").calibration(17)  # this CPU, measured on a quiet machine


def busy(scale: float = 2.5, seed: int = 0) -> dict[int, float]:
    """A calibration taken beside another job: every figure too high, some more than others."""
    rng = random.Random(seed)
    return {n: s * scale * rng.uniform(0.95, 1.05) for n, s in QUIET.items()}


def noisy(seconds: float, rng: random.Random) -> float:
    """A live pass: a little jitter, and now and then another process takes a core for a while."""
    if rng.random() < 0.08:
        return seconds * rng.uniform(2.0, 8.0)
    return seconds * (1.0 + abs(rng.gauss(0.0, 0.04)))


def test_one_slow_pass_changes_nothing() -> None:
    costs = PassCosts(dict(COSTS))
    for _ in range(MIN_PASSES):
        costs.update(4, COSTS[4])
    before = [costs(n) for n in range(1, 18)]
    costs.update(4, COSTS[4] * 20)
    costs.update(1, COSTS[1] * 20)  # a size with no figure of its own yet
    assert [costs(n) for n in range(1, 18)] == pytest.approx(before)


def test_the_curve_between_and_beyond_measured_sizes() -> None:
    # linear between measured sizes; outside them a fifth of a single pass per row, but never less than the nearest
    # measured size's share per row; and a batch's large sizes, asked for after small ones, priced the same
    costs = PassCosts({1: 1.0, 4: 1.3, 8: 1.6})  # a GPU's: flat
    assert [costs(n) for n in (1, 2, 3, 4, 6, 8)] == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.45, 1.6])
    assert costs(300) == pytest.approx(1.6 + 0.2 * 292)
    assert PassCosts({1: 1.0, 8: 3.0})(300) == pytest.approx(3.0 * 300 / 8)  # more than 3.0 + 0.2 * 292
    assert PassCosts({4: 2.0, 8: 3.0})(2) == pytest.approx(2.0 - 0.2 * 2.0 * 2)
    assert PassCosts({8: 3.0, 16: 5.0})(1) == pytest.approx(3.0 / 8)  # its share: more than 3.0 - 0.2 * 3.0 * 7
    fresh = PassCosts({1: 1.0, 4: 1.3, 8: 1.6})
    assert fresh(300) == costs(300) and fresh(5) == costs(5)


def test_a_gpu_prices_a_batch_s_wide_passes_by_the_slope_of_its_curve() -> None:
    # the H100's passes of 8 sequences, measured: 128 rows 22 ms, where each row's share of 17 says 32; with pass
    # shapes (a GPU) the curve's top slope goes on, nearer the truth; a CPU keeps the share rule (a server's latency)
    h100 = load_cost_table("h100")
    measured = {24: 0.00571, 64: 0.01196, 128: 0.02211}  # the table's seconds_by_batch_8_lanes
    gpu = PassCosts(h100.calibration(17), wide_slope=True)
    cpu = PassCosts(h100.calibration(17))
    for n, seconds in measured.items():
        assert gpu(n) == pytest.approx(seconds, rel=0.2), n
        assert cpu(n) > seconds, n
    assert cpu(128) > 1.4 * measured[128]
    assert [gpu(n) for n in range(1, 18)] == [cpu(n) for n in range(1, 18)]  # within the calibration: the same
    assert all(gpu(n + 1) > gpu(n) for n in range(17, 300))
    # the live passes of a batch's own wide sizes set the slope: a device where they cost more is priced so
    for _ in range(MIN_PASSES):
        gpu.update(128, 0.04)
    assert gpu(256) > 0.04 + 128 * (0.04 - gpu(17)) / 111 * 0.9


def test_the_measured_shape_is_kept_not_flattened() -> None:
    # on this CPU 3 rows cost more than 4, and 5 more than 6, in every calibration: what was measured is used
    costs = PassCosts(dict(QUIET))
    assert costs(3) > costs(4) and costs(5) > costs(6)
    rng = random.Random(1)
    for _ in range(40):
        costs.update(4, noisy(QUIET[4], rng))
    assert costs(3) > costs(4) and costs(5) > costs(6)


@pytest.mark.parametrize("seed", range(4))
def test_a_busy_calibration_converges_to_the_quiet_curve(seed: int) -> None:
    """Live passes at the sizes a policy uses, with noise and bursts of load, bring every size, used or not,
    within 15% of the quiet curve in at most 48 passes (within 5% for the sizes used)."""
    rng = random.Random(seed)
    costs = PassCosts(busy(seed=seed))
    assert costs(1) > 1.8 * QUIET[1]
    used = [1, 4, 8, 5, 1, 1, 4, 9, 12]
    for i in range(48):
        n = used[i % len(used)]
        costs.update(n, noisy(QUIET[n], rng))
    for n in range(1, 18):  # unused sizes: the busy calibration's shape at the live level
        assert costs(n) == pytest.approx(QUIET[n], rel=0.05 if n in used else 0.15), n


def test_a_size_left_while_the_machine_was_busy_is_priced_again_from_the_level() -> None:
    costs = PassCosts(dict(QUIET))
    for _ in range(LEVEL_WINDOW):  # a busy spell while the policy drafted 7 tokens: size 8 (and 1) look dear
        costs.update(8, QUIET[8] * 3)
        costs.update(1, QUIET[1] * 3)
    assert costs(8) == pytest.approx(QUIET[8] * 3)
    for _ in range(LEVEL_WINDOW):  # then plain steps only, on a quiet machine
        costs.update(1, QUIET[1])
    assert costs(8) == pytest.approx(QUIET[8], rel=0.01)


def test_a_size_not_used_for_long_is_priced_again_from_the_level() -> None:
    costs = PassCosts(dict(QUIET))
    for _ in range(MIN_PASSES):  # a short busy spell on one size only: the level hardly moved
        costs.update(8, QUIET[8] * 3)
    assert costs(8) == pytest.approx(QUIET[8] * 3)
    for _ in range(STALE_AFTER):
        costs.update(1, QUIET[1])
    assert costs(8) == pytest.approx(QUIET[8], rel=0.01)


def test_no_calibration_learns_from_the_first_pass() -> None:
    costs = PassCosts()
    assert not costs.known()
    costs.update(1, 0.02)
    assert costs.known() and costs(1) == 0.02


def draft_lengths(slow_pass: int | None, *, reproducible: bool = False,
                  seconds: Callable[[int, int], float] | None = None) -> list[int]:
    """A lookup copying a passage, 60 steps; the pass numbered ``slow_pass`` takes 20 times as long (``seconds``:
    what the pass numbered i of n rows takes instead)."""
    p = policy(reproducible=reproducible)
    pos, lengths = 0, []
    for i in range(60):
        truth = (PASSAGE * 20)[pos:]
        draft = p.trim(Draft(truth[:16], None, "ngram", "ngram/4+"), LOOKUP)
        k = len(draft)
        took = seconds(i, k + 1) if seconds is not None else COSTS[k + 1] * (20 if i == slow_pass else 1)
        p.observe(draft if k else Draft(), k, 0.0, took, truth[: k + 1])
        pos += k + 1
        lengths.append(k)
    return lengths


def test_a_seeded_request_s_draft_lengths_follow_no_live_timing() -> None:
    """Sampled with a seed, the policy prices on the measured figures alone, so its passes are the sizes they were
    on the last run whatever the passes took now (a pass's size moves llama.cpp's logits, and so the text)."""
    def dear_long_passes(i: int, n: int) -> float:  # another program took the machine: long passes cost 3x
        return COSTS[n] * (3 if n > 4 else 1)

    calm = draft_lengths(None, reproducible=True)
    assert draft_lengths(None, reproducible=True, seconds=dear_long_passes) == calm
    assert draft_lengths(3, reproducible=True) == calm
    assert calm == draft_lengths(None)  # priced on the same figures, a quiet machine drafts as it always did
    assert draft_lengths(None, seconds=dear_long_passes) != calm  # unseeded: follows the machine, as it should


@pytest.mark.parametrize("slow_pass", [0, 1, 5, 20])
def test_a_single_slow_pass_does_not_change_the_draft_lengths(slow_pass: int) -> None:
    quiet = draft_lengths(None)
    assert max(quiet[20:]) > 0
    assert draft_lengths(slow_pass) == quiet


def test_pass_costs_survive_a_reset_of_what_drafts_taught() -> None:
    p = DraftPolicy(k_max=16)
    p.calibrate(COSTS)
    for _ in range(MIN_PASSES):
        p.observe(Draft(), 0, 0.0, COSTS[1] / 2, [1])
    p.reset()
    assert p.costs(1) == pytest.approx(COSTS[1] / 2)


def test_a_seeded_request_does_not_learn_a_draft_model_s_cost_live() -> None:
    def k_after(reproducible: bool) -> tuple[int, int]:
        p = policy(reproducible=reproducible)
        p.calibrate_drafter("draft", 0.001)
        draft = Draft([1, 2, 3, 4], None, "draft", "draft")
        for _ in range(10):  # a draft model that is always right, at its calibrated cost
            p.observe(draft, 4, 0.004, COSTS[5], [1, 2, 3, 4, 5])
        before = p.best_k("draft", "draft")
        for _ in range(5):  # then drafting takes a second a token: the machine is busy
            p.observe(draft, 4, 4.0, COSTS[5], [1, 2, 3, 4, 5])
        return before, p.best_k("draft", "draft")

    seeded, unseeded = k_after(True), k_after(False)
    assert seeded[0] == seeded[1] > 0
    assert unseeded[0] > unseeded[1]
