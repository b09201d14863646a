"""HTTP layer: routes, body parsing, OpenAI-shaped errors, SSE."""
