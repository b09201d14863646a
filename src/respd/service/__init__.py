"""Responses semantics: state, translation, the generation core both APIs share, and the
event machine. Nothing here knows HTTP or a particular engine.

- `generation/`: the spec → prepare → run pipeline, the output reader, the one vocabulary
  of output events;
- `responses/`, `chat/`: the two APIs as adapters over it (plus stored state, chains,
  background jobs for Responses);
- `tools/`, `reasoning/`: tool definitions and policies, the incremental call parser, the
  thinking splitter;
- `media/`: images and documents in input, resolved and lowered.
"""
