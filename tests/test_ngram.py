"""Prompt-lookup drafting: longest suffix first, most recent occurrence, an index that only grows."""

from __future__ import annotations

from localspec.drafters.ngram import NgramDrafter


def test_longest_suffix_match_wins_over_a_more_recent_short_one() -> None:
    d = NgramDrafter(max_n=4)
    #          0  1  2  3  4  5  6  7  8  9
    history = [1, 2, 3, 4, 5, 9, 3, 7, 1, 2, 3]
    d.begin(history)
    draft = d.propose(history, 3)
    # suffix [1, 2, 3] occurred at 0..2 and continued with 4, 5, 9; [3] alone last continued with 7
    assert draft.tokens == [4, 5, 9]
    assert draft.kind == "ngram/3"


def test_the_most_recent_occurrence_is_preferred() -> None:
    d = NgramDrafter(max_n=2)
    history = [7, 8, 1, 7, 8, 2, 7, 8]
    d.begin(history)
    assert d.propose(history, 1).tokens == [2]


def test_no_match_is_an_empty_draft_not_an_error() -> None:
    d = NgramDrafter()
    history = [1, 2, 3, 4]
    d.begin(history)
    draft = d.propose(history, 5)
    assert draft.tokens == [] and len(draft) == 0


def test_a_fully_matching_source_is_followed() -> None:
    d = NgramDrafter(max_n=2)
    passage = list(range(100, 130))
    history = passage + [5] + passage[:3]
    d.begin(history)
    first = d.propose(history, 4)
    assert first.tokens == passage[3:7]
    history += first.tokens + [passage[7]]  # all accepted, and the target's own token continues the passage
    d.accept(history, 4)
    second = d.propose(history, 4)
    assert second.kind == "ngram/follow" and second.tokens == passage[8:12]


def test_a_new_unrelated_history_rebuilds_the_index() -> None:
    d = NgramDrafter(max_n=2)
    d.begin([1, 2, 3, 1, 2])
    assert d.propose([1, 2, 3, 1, 2], 1).tokens == [3]
    d.begin([9, 8, 9])
    assert d.propose([9, 8, 9], 1).tokens == [8]


class CountingDict(dict):
    writes = 0

    def __setitem__(self, key: object, value: object) -> None:
        CountingDict.writes += 1
        super().__setitem__(key, value)


def test_a_long_context_is_indexed_incrementally() -> None:
    d = NgramDrafter()
    history = [(i * 7919) % 5003 for i in range(32_000)]
    d.begin(history[:100])
    d._index = [CountingDict(part) for part in d._index]
    CountingDict.writes = 0
    for end in range(100, 32_000, 1000):
        d.accept(history[:end], 0)  # the index catches up with what was appended, never rescans
    d.accept(history, 0)
    repeat = history[:8]
    history = history + repeat
    assert d.propose(history, 4).tokens == history[8:12]
    # each appended token registers the max_n n-grams that end before it, once: a rescan would write ~32x more
    assert CountingDict.writes <= (len(history) - 100) * d.max_n


def test_tokens_from_another_drafter_do_not_start_a_follow() -> None:
    # under `auto`, a trimmed-away lookup leaves the step to the draft model: its accepted tokens are not the
    # source's, even when the target's own token happens to continue the source where the count lands
    d = NgramDrafter(max_n=2)
    history = [1, 2, 3, 4, 5, 9, 6, 7, 1, 2, 3]
    d.begin(history)
    assert d.propose(history, 4).tokens == [4, 5, 9, 6]
    history += [7, 8, 9]  # the model's 7 and 8 accepted, then the target's 9 (the source's third token)
    d.accept(history, 2)
    assert d.propose(history, 4).kind != "ngram/follow"


def test_a_suffix_that_went_on_in_more_than_one_way_is_a_kind_of_its_own() -> None:
    # a template's slot: after `", "` one line had a key "date", the next "time" (tokens 7 and 8). A copy there is a
    # bet of another worth than one after a suffix that always went on the same way, and is learned apart
    d = NgramDrafter(max_n=2)
    history = [1, 5, 6, 7, 2, 5, 6, 8, 3, 5, 6]
    d.begin(history)
    assert d.propose(history, 2).kind == "ngram/2~"
    d = NgramDrafter(max_n=2)
    history = [1, 5, 6, 7, 2, 5, 6, 7, 3, 5, 6]
    d.begin(history)
    assert d.propose(history, 2).kind == "ngram/2"


def test_a_follow_into_a_slot_is_marked_too() -> None:
    # the follow copies an earlier line past its shared start: where the line's suffix went on differently
    # elsewhere, so is the follow's draft
    d = NgramDrafter(max_n=2)
    line = [10, 11, 12, 13]
    history = [*line, 20, 1, 12, 13, 21, 2, 10, 11]
    d.begin(history)
    first = d.propose(history, 1)
    assert first.tokens == [12] and not first.kind.endswith("~")
    history += [12, 13]  # accepted whole, the target's own token continues the source: followed
    d.accept(history, 1)
    second = d.propose(history, 2)
    # [12, 13] went on with 20 (the first line) and 21: the follow's next token is a guess between them
    assert second.kind == "ngram/follow~" and second.tokens == [20, 1]
