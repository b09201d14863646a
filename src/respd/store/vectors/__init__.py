"""Vector stores in the stores: records, lexical terms, and one mixin per store kind
(`sqlite.py`, `postgres.py`, `memory.py`) that the store classes inherit, so the vector
store methods of the `Store` protocol live beside, not inside, each store's module."""
