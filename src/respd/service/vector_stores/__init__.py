"""The Vector Stores API: stores of chunked, indexed files, ingested in the background and
searched by hybrid ranking (full-text, fused with vector similarity when an embedding
model is configured). `service.VectorStores` is the entry point, for the HTTP routes and
the `file_search` tool alike."""
