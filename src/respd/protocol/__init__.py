"""Wire types: request bodies clients send, and the errors we answer with."""
