"""Several sequences in one context: a lane per sequence, and passes that carry rows of many lanes.

A batch job runs up to ``n_lanes`` generations at once. Each is a llama.cpp sequence (lane i is seq id i) in one
unified KV cache, so a pass can hold every lane's rows (each attends to its own sequence's cells only) and a prefix
two prompts share can be given to a second lane without computing it again (``share``: ``seq_cp``). A lane is the
speculation loop's ``Target`` for its sequence: it tracks what its sequence caches and rolls back with ``seq_rm`` of
its own id, never ``seq_keep`` or a clear, which would drop its neighbours.

Rows come back per lane as the lane wants them: token ids from llama.cpp's backend greedy sampler for a greedy lane
(where this build has one), logits for a sampling one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from localspec.engine.context import Context
from localspec.engine.model import Model
from localspec.passes import Outputs, Part, reads_ids
from localspec.settings import GenerationSettings, SamplingSettings


class _Job(Protocol):
    """What a lane needs of the job it starts (speculative.scheduler.Job)."""

    sampling: SamplingSettings
    settings: GenerationSettings


class Lane:
    """One sequence of a shared context, behind the loop's ``Target`` protocol (chains only: a lane has one seq id)."""

    def __init__(self, lanes: Lanes, seq: int) -> None:
        self.lanes, self.seq = lanes, seq
        self.tokens: list[int] = []
        self.n_ctx = lanes.n_ctx
        self.greedy = True  # its rows come back as token ids; set by the scheduler for each generation
        # whose text its cache holds (Job.scope): a prefix is reused only by a job of the same scope, whichever
        # scheduler runs it (the scope lives with the cache it guards)
        self.scope: str | None = None

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        out = self.lanes.decode([Part(self.seq, tokens, "logits")])[0]
        assert isinstance(out, np.ndarray)
        return out if all_logits else out[-1:]

    def decode_argmax(self, tokens: Sequence[int]) -> list[int]:
        out = self.lanes.decode([Part(self.seq, tokens, "ids")])[0]
        return out if isinstance(out, list) else out.argmax(axis=1).tolist()

    def feed(self, tokens: Sequence[int]) -> None:
        step = self.lanes.context.n_batch
        for start in range(0, len(tokens), step):
            self.lanes.decode([Part(self.seq, tokens[start : start + step], None)])

    def truncate(self, n_keep: int) -> None:
        if n_keep >= len(self.tokens):
            return
        self.lanes.context.seq_drop(self.seq, n_keep)
        del self.tokens[n_keep:]

    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        raise NotImplementedError("a lane verifies chains: token trees need seq ids of their own")

    decode_tree_argmax = decode_tree

    def keep_path(self, rows: Sequence[int]) -> None:
        raise NotImplementedError("a lane verifies chains: token trees need seq ids of their own")


class Lanes:
    """``n_lanes`` sequences of up to ``n_ctx`` tokens each in one context; a pass outputs at most ``max_rows`` rows."""

    def __init__(
        self, model: Model, n_lanes: int, *, n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512,
        max_rows: int = 64,
    ) -> None:
        # one cache for all lanes: n_ctx cells each (a lane never holds more; the scheduler keeps to that)
        self.context = Context(model, n_ctx=n_ctx * n_lanes, n_threads=n_threads, n_batch=n_batch,
                               greedy_rows=max_rows, n_seq=n_lanes)
        self.n_ctx = min(n_ctx, self.context.n_ctx // n_lanes)
        self.n_batch = self.context.n_batch
        self.max_rows = self.context.max_rows
        self.lanes = [Lane(self, seq) for seq in range(n_lanes)]

    def __len__(self) -> int:
        return len(self.lanes)

    def __getitem__(self, i: int) -> Lane:
        return self.lanes[i]

    def begin(self, lane: int, job: _Job) -> None:
        """``job`` starts on ``lane``: a greedy job's rows come back as token ids (backend-sampled where this build
        can), a sampling one's as logits."""
        greedy = reads_ids(job.sampling.greedy, job.settings.constraint is not None)
        self.lanes[lane].greedy = greedy
        if self.context.backend_sampling:
            self.context.set_backend_greedy(lane, greedy)

    def decode(self, parts: Sequence[Part]) -> list[Outputs | None]:
        """One pass over every part's tokens; each lane's cache grows by its part. Returns each part's outputs."""
        context = self.context
        # a lane may have several parts in one pass (a catch-up that wants only its last row's output): each starts
        # where the one before it ends
        ends: dict[int, int] = {}
        spans = []
        for p in parts:
            start = ends.get(p.lane, len(self.lanes[p.lane].tokens))
            ends[p.lane] = start + len(p.tokens)
            spans.append((p.lane, start, p.tokens, p.want is not None))
        starts = context.decode_parts(spans)
        for part in parts:  # the cache holds them now, whatever reading an output below does
            self.lanes[part.lane].tokens.extend(part.tokens)
        out: list[Outputs | None] = []
        for part, start in zip(parts, starts, strict=True):
            n = len(part.tokens)
            if part.want is None:
                out.append(None)
            elif part.want == "ids" and context.backend_sampling and self.lanes[part.lane].greedy:
                out.append(context.sampled_rows(start, n))
            else:
                logits = context.logits_rows(start, n)
                out.append(logits.argmax(axis=1).tolist() if part.want == "ids" else logits)
        return out

    def share(self, src: int, dst: int, n: int) -> None:
        """Lane ``dst`` (emptied) starts with lane ``src``'s first ``n`` cached tokens, computed once."""
        target = self.lanes[dst]
        target.truncate(0)
        self.context.seq_share(src, dst, n)
        target.tokens = self.lanes[src].tokens[:n]

    def close(self) -> None:
        self.context.close()

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
