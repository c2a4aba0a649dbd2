"""llama.cpp's backend sampler: a greedy sampler chain that runs inside the graph, so a pass returns token ids, not
logits (engine/context.py attaches and detaches it)."""

from __future__ import annotations

import llama_cpp


def backend_sampling_available() -> bool:
    """Whether this llama-cpp-python exposes llama.cpp's backend sampling (checked once per context)."""
    fields = {name for name, *_ in llama_cpp.llama_context_params._fields_}
    return {"samplers", "n_samplers", "n_outputs_max_per_seq"} <= fields and all(
        hasattr(llama_cpp, f) for f in ("llama_set_sampler", "llama_get_sampled_token_ith", "llama_sampler_chain_get")
    )


def greedy_chain() -> llama_cpp.llama_sampler_p:
    """A sampler chain of one greedy stage (a chain can be attached to a context once: make one per attach)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return chain


def stage_name(chain: llama_cpp.llama_sampler_p) -> bytes:
    """The first stage's name: b"+greedy" once llama.cpp has taken the chain into its graph."""
    return llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, 0)) or b""
