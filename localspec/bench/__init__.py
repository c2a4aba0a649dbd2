"""`localspec bench`: measure drafters on a suite of prompts and check every greedy run is lossless.

suite (JSONL parsing) → runner (interleaved runs on one loaded model) → compare (divergences, near-ties)
→ report (table, JSON, Markdown, PNG). anchors times llama-cpp-python's high-level API for comparison.
"""
