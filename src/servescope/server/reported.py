"""What a live server reports about its own configuration, for ``servescope settings``.

Shell twins::

    curl -s URL/version
    curl -s URL/v1/models -H "Authorization: Bearer $KEY"
    curl -s URL/metrics | grep '_info{'
    curl -s 'URL/server_info?config_format=json'     # vLLM with VLLM_SERVER_DEV_MODE=1; SGLang

An endpoint that does not answer is recorded with why (``Endpoint``), never fatal: a loading vLLM refuses
connections for the whole load, and the unit and process are still worth showing.
"""

from __future__ import annotations

from typing import Any

from servescope.core.aio import run_loop
from servescope.core.settings import Endpoint, ServedModel, ServerRecord
from servescope.server.client import ApiKey, ServerClient
from servescope.server.errors import EndpointNotFound, ServerError, ServerTimeout, ServerUnreachable
from servescope.server.metrics import parse_info_gauges

__all__ = ["read_server_record", "read_server_record_async"]

# vLLM serves /server_info only in dev mode; SGLang serves /server_info (newer) or /get_server_info.
_SERVER_INFO_PATHS = ("/server_info?config_format=json", "/get_server_info")


def _models(doc: Any) -> list[ServedModel]:
    data = doc.get("data") if isinstance(doc, dict) else None
    models = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        length = item.get("max_model_len")
        models.append(ServedModel(
            id=item["id"], root=item.get("root") if isinstance(item.get("root"), str) else None,
            parent=item.get("parent") if isinstance(item.get("parent"), str) else None,
            max_model_len=length if isinstance(length, int) and not isinstance(length, bool) else None))
    return models


async def read_server_record_async(url: str, *, api_key: ApiKey | None = None,
                                   timeout_s: float = 10.0) -> ServerRecord:
    """See :func:`read_server_record`."""
    endpoints: list[Endpoint] = []
    version: str | None = None
    models: list[ServedModel] = []
    gauges: dict[str, list[dict[str, str]]] = {}
    info: dict[str, Any] | None = None
    async with ServerClient(url, api_key=api_key, connect_timeout_s=min(timeout_s, 5.0),
                            read_timeout_s=timeout_s) as client:
        try:
            doc = await client.get_json("/version")
            version = str(doc["version"]) if isinstance(doc, dict) and "version" in doc else None
            endpoints.append(Endpoint(path="/version", ok=version is not None,
                                      detail="ok" if version is not None else "no 'version' in the answer"))
        except ServerError as exc:
            endpoints.append(Endpoint(path="/version", ok=False, detail=str(exc)))
            if isinstance(exc, ServerUnreachable | ServerTimeout):
                # Nothing listens (a loading vLLM refuses connections): the other endpoints cannot answer.
                return ServerRecord(url=client.base_url, endpoints=endpoints)
        try:
            models = _models(await client.get_json("/v1/models"))
            endpoints.append(Endpoint(path="/v1/models", ok=True, detail=f"{len(models)} model(s)"))
        except ServerError as exc:
            endpoints.append(Endpoint(path="/v1/models", ok=False, detail=str(exc)))
        try:
            gauges = parse_info_gauges(await client.get_text("/metrics"))
            endpoints.append(Endpoint(path="/metrics", ok=True, detail=f"{len(gauges)} info gauge(s)"))
        except ServerError as exc:
            endpoints.append(Endpoint(path="/metrics", ok=False, detail=str(exc)))
        except ValueError as exc:
            endpoints.append(Endpoint(path="/metrics", ok=False, detail=f"not Prometheus text ({exc})"))
        for path in _SERVER_INFO_PATHS:
            try:
                doc = await client.get_json(path)
            except EndpointNotFound as exc:  # the server answered its other endpoints: it is OpenAI-compatible
                endpoints.append(Endpoint(path=path.split("?")[0], ok=False, detail=f"{exc.source}: HTTP 404: "
                                          "not served here (vLLM serves /server_info only with "
                                          "VLLM_SERVER_DEV_MODE=1; SGLang at /get_server_info)"))
                continue
            except ServerError as exc:
                endpoints.append(Endpoint(path=path.split("?")[0], ok=False, detail=str(exc)))
                continue
            if isinstance(doc, dict):
                info = doc
                endpoints.append(Endpoint(path=path.split("?")[0], ok=True, detail="ok"))
                break
        return ServerRecord(url=client.base_url, version=version, models=models, info_gauges=gauges,
                            server_info=info, endpoints=endpoints)


def read_server_record(url: str, *, api_key: ApiKey | None = None, timeout_s: float = 10.0) -> ServerRecord:
    """The server's version, models, ``*_info`` gauge labels and ``/server_info``, each where it answers.

    Raises:
        InputError: ``url`` is not an ``http(s)://HOST[:PORT]`` URL.
    """
    return run_loop(read_server_record_async(url, api_key=api_key, timeout_s=timeout_s))
