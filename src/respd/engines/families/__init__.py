"""Model-family knowledge: how a family writes tool calls and thinking, which tokens end its
turns. Read once from the chat template into a `ModelProfile`."""
