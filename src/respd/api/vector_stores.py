"""`/v1/vector_stores` routes (the Vector Stores API): stores, their files, file batches
and search. HTTP only: `service/vector_stores/` does the rest."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from respd.api.body import parse_body
from respd.api.identity import owner_of
from respd.protocol.errors import APIError
from respd.protocol.vector_stores import (
    CreateFileBatchRequest,
    CreateVectorStoreFileRequest,
    CreateVectorStoreRequest,
    SearchVectorStoreRequest,
    UpdateVectorStoreFileRequest,
    UpdateVectorStoreRequest,
)
from respd.service.vector_stores.service import VectorStores

router = APIRouter()

STORES = "/v1/vector_stores"
STORE = STORES + "/{store_id}"
FILES = STORE + "/files"
FILE = FILES + "/{file_id}"
BATCHES = STORE + "/file_batches"
BATCH = BATCHES + "/{batch_id}"
JSONObject = dict[str, Any]


class VectorStoresOff(APIError):
    status_code = 404


def _service(request: Request) -> VectorStores:
    service: VectorStores | None = getattr(request.app.state, "vector_stores", None)
    if service is None:
        raise VectorStoresOff("This server does not serve vector stores.", code="not_found")
    return service


def _unversioned(path: str) -> str:
    return path.removeprefix("/v1")


def _route(method: str, path: str) -> Any:
    """The route at `path` and at its unversioned alias, like every other API here."""

    def register(fn: Any) -> Any:
        add = getattr(router, method)
        add(_unversioned(path), include_in_schema=False)(fn)
        return add(path)(fn)

    return register


@_route("post", STORES)
async def create_vector_store(request: Request) -> JSONObject:
    body = await parse_body(request, CreateVectorStoreRequest)
    return await _service(request).create(
        owner_of(request),
        name=body.name,
        file_ids=body.file_ids,
        chunking_strategy=body.chunking_strategy,
        metadata=body.metadata,
        expires_after=body.expires_after,
    )


@_route("get", STORES)
async def list_vector_stores(
    request: Request,
    limit: int | None = None,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> JSONObject:
    return await _service(request).list_stores(
        owner_of(request), limit=limit, order=order, after=after, before=before
    )


@_route("get", STORE)
async def retrieve_vector_store(request: Request, store_id: str) -> JSONObject:
    return await _service(request).retrieve(owner_of(request), store_id)


@_route("post", STORE)
async def update_vector_store(request: Request, store_id: str) -> JSONObject:
    body = await parse_body(request, UpdateVectorStoreRequest)
    given = {
        k: getattr(body, k)
        for k in ("name", "metadata", "expires_after")
        if k in body.model_fields_set
    }
    return await _service(request).update(owner_of(request), store_id, **given)


@_route("delete", STORE)
async def delete_vector_store(request: Request, store_id: str) -> JSONObject:
    return await _service(request).delete(owner_of(request), store_id)


@_route("post", STORE + "/search")
async def search_vector_store(request: Request, store_id: str) -> JSONObject:
    body = await parse_body(request, SearchVectorStoreRequest)
    return await _service(request).search_page(
        owner_of(request),
        store_id,
        body.query,
        max_num_results=body.max_num_results,
        filters=body.filters,
        ranking_options=body.ranking_options,
    )


@_route("post", FILES)
async def create_vector_store_file(request: Request, store_id: str) -> JSONObject:
    body = await parse_body(request, CreateVectorStoreFileRequest)
    return await _service(request).create_file(
        owner_of(request),
        store_id,
        body.file_id,
        attributes=body.attributes,
        chunking_strategy=body.chunking_strategy,
    )


@_route("get", FILES)
async def list_vector_store_files(
    request: Request,
    store_id: str,
    limit: int | None = None,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> JSONObject:
    return await _file_page(request, store_id, None, limit, order, after, before)


@_route("get", FILE)
async def retrieve_vector_store_file(request: Request, store_id: str, file_id: str) -> JSONObject:
    return await _service(request).retrieve_file(owner_of(request), store_id, file_id)


@_route("post", FILE)
async def update_vector_store_file(request: Request, store_id: str, file_id: str) -> JSONObject:
    body = await parse_body(request, UpdateVectorStoreFileRequest)
    return await _service(request).update_file(
        owner_of(request), store_id, file_id, body.attributes
    )


@_route("delete", FILE)
async def delete_vector_store_file(request: Request, store_id: str, file_id: str) -> JSONObject:
    return await _service(request).delete_file(owner_of(request), store_id, file_id)


@_route("get", FILE + "/content")
async def vector_store_file_content(request: Request, store_id: str, file_id: str) -> JSONObject:
    return await _service(request).file_content(owner_of(request), store_id, file_id)


@_route("post", BATCHES)
async def create_file_batch(request: Request, store_id: str) -> JSONObject:
    body = await parse_body(request, CreateFileBatchRequest)
    return await _service(request).create_batch(
        owner_of(request),
        store_id,
        file_ids=body.file_ids,
        files=body.files,
        attributes=body.attributes,
        chunking_strategy=body.chunking_strategy,
    )


@_route("get", BATCH)
async def retrieve_file_batch(request: Request, store_id: str, batch_id: str) -> JSONObject:
    return await _service(request).retrieve_batch(owner_of(request), store_id, batch_id)


@_route("post", BATCH + "/cancel")
async def cancel_file_batch(request: Request, store_id: str, batch_id: str) -> JSONObject:
    return await _service(request).cancel_batch(owner_of(request), store_id, batch_id)


@_route("get", BATCH + "/files")
async def list_file_batch_files(
    request: Request,
    store_id: str,
    batch_id: str,
    limit: int | None = None,
    order: str = "desc",
    after: str | None = None,
    before: str | None = None,
) -> JSONObject:
    return await _file_page(request, store_id, batch_id, limit, order, after, before)


async def _file_page(
    request: Request,
    store_id: str,
    batch_id: str | None,
    limit: int | None,
    order: str,
    after: str | None,
    before: str | None,
) -> JSONObject:
    """A page of a store's files (of one batch's, with `batch_id`), `filter` by status."""
    return await _service(request).list_files(
        owner_of(request),
        store_id,
        status=request.query_params.get("filter"),
        batch_id=batch_id,
        limit=limit,
        order=order,
        after=after,
        before=before,
    )
