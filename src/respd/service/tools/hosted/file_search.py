"""`file_search` tools: the model's queries run over the request's vector stores.

The model is shown one function taking `queries`; each query is searched (hybrid lexical and
vector ranking, see `service/vector_stores/`), the hits merged by chunk keeping the best
score, and the best `max_num_results` become the call's results: the model reads their text,
the item lists them when `include` asks for `file_search_call.results`, and the answer cites
the files they came from.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from respd.protocol.errors import APIError, InvalidRequest, MissingParameter
from respd.service.tools.hosted.base import JSON, Outcome, Source

if TYPE_CHECKING:
    from respd.service.vector_stores.service import VectorStores

DEFAULT_RESULTS = 10
MAX_RESULTS = 50
RESULTS_INCLUDE = "file_search_call.results"


@dataclass(frozen=True)
class FileSearchTool:
    """One request's `file_search` tool, checked."""

    vector_store_ids: tuple[str, ...]
    max_num_results: int = DEFAULT_RESULTS
    filters: JSON | None = None
    ranking_options: JSON | None = None

    @classmethod
    def from_tool(cls, entry: JSON, param: str) -> FileSearchTool:
        ids = entry.get("vector_store_ids")
        if ids is None:
            raise MissingParameter(f"{param}.vector_store_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise InvalidRequest(
                f"Invalid '{param}.vector_store_ids': expected a non-empty array of vector "
                "store ids.",
                param=f"{param}.vector_store_ids",
                code="invalid_value",
            )
        count = entry.get("max_num_results", DEFAULT_RESULTS)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
            raise InvalidRequest(
                f"Invalid '{param}.max_num_results': expected an integer from 1 to {MAX_RESULTS}.",
                param=f"{param}.max_num_results",
                code="invalid_value",
            )
        for key in ("filters", "ranking_options"):
            if entry.get(key) is not None and not isinstance(entry[key], dict):
                raise InvalidRequest(
                    f"Invalid type for '{param}.{key}': expected an object.",
                    param=f"{param}.{key}",
                    code="invalid_type",
                )
        return cls(tuple(ids), count, entry.get("filters"), entry.get("ranking_options"))


def queries_of(arguments: JSON) -> list[str]:
    """The queries a call asked for (`queries`, or a lone `query` a model may write)."""
    raw: Any = arguments.get("queries")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raw = [arguments.get("query")]
    return [q.strip() for q in raw if isinstance(q, str) and q.strip()]


async def file_search(
    stores: VectorStores | None,
    tool: FileSearchTool,
    owner: str,
    arguments: JSON,
    *,
    timeout: float,
    include_results: bool,
    question: str | None = None,
) -> Outcome:
    """Run the call's queries; when they find nothing, the user's `question` is searched
    too (and listed among the queries): a small model's own queries often miss."""
    queries = queries_of(arguments)
    if stores is None:
        return Outcome.failure("this server has no vector stores", queries=queries)
    best: dict[tuple[str, str], Any] = {}

    async def run(query: str) -> None:
        assert stores is not None
        hits = await stores.search(
            owner,
            list(tool.vector_store_ids),
            query,
            max_num_results=tool.max_num_results,
            filters=tool.filters,
            ranking_options=tool.ranking_options,
        )
        for hit in hits:
            key = (hit.file_id, hit.text)
            if key not in best or best[key].score < hit.score:
                best[key] = hit

    try:
        async with asyncio.timeout(timeout):
            for query in queries:
                await run(query)
            if not best and question and question.strip() and question.strip() not in queries:
                queries.append(question.strip())
                await run(question.strip())
    except TimeoutError:
        return Outcome.failure(f"the search took longer than {timeout:g} seconds", queries=queries)
    except APIError as exc:
        return Outcome.failure(exc.message, queries=queries)
    if not queries:
        return Outcome.failure("no search query was given", queries=[])
    ranked = sorted(best.values(), key=lambda h: -h.score)[: tool.max_num_results]
    results = [
        {
            "file_id": h.file_id,
            "filename": h.filename,
            "score": round(float(h.score), 4),
            "attributes": dict(h.attributes),
            "text": h.text,
        }
        for h in ranked
    ]
    if ranked:
        text = "Search results from the user's files:\n\n" + "\n\n".join(
            f"[{i}] {h.filename} (file {h.file_id})\n{h.text}" for i, h in enumerate(ranked, 1)
        )
    else:
        text = "No results in the user's files for: " + "; ".join(queries)
    fields: JSON = {"queries": queries, "results": results if include_results else None}
    sources = [Source("file", h.file_id, h.filename, h.text) for h in ranked]
    return Outcome("completed", text, fields, sources)
