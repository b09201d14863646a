"""Model-family knowledge: how a family writes tool calls and thinking, which tokens end its
turns, where images go. Read once from the chat template into a `ModelProfile`."""
