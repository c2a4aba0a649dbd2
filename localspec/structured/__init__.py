"""Structured output: answers held to what a request asked (localspec/schema), and verified drafts that the grammar
forces. ``constraint`` is one generation's live state, consulted by the speculation loop; ``grammars`` builds those
per model; ``tools`` and ``tool_prompt`` put tool calls to the model and read them back."""
