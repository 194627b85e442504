"""A real OTLP/gRPC trace receiver: OpenTelemetry's TraceService from opentelemetry-proto."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    start_ns: int
    end_ns: int
    trace_id: bytes
    span_id: bytes
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[str]
    links: list[bytes]


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def start(self) -> OtlpReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.requests += 1
            for rs in request.resource_spans:
                resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            ReceivedSpan(
                                name=s.name,
                                kind=s.kind,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                trace_id=s.trace_id,
                                span_id=s.span_id,
                                status_code=s.status.code,
                                status_message=s.status.message,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                resource=resource,
                                events=[e.name for e in s.events],
                                links=[lk.span_id for lk in s.links],
                            )
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]


class OtlpHttpReceiver:
    """OTLP/HTTP: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        from aiohttp import web

        self.grpc_like = OtlpReceiver.__new__(OtlpReceiver)
        self.grpc_like.spans = []
        self.grpc_like.requests = 0
        self.grpc_like.lock = threading.Lock()
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self.traces)
        self.runner: Any = None
        self.url = ""

    async def start(self) -> OtlpHttpReceiver:
        from aiohttp import web

        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def traces(self, request: Any) -> Any:
        from aiohttp import web

        if request.content_type != "application/x-protobuf":
            return web.Response(status=415)
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(await request.read())
        self.grpc_like.Export(req, None)
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def named(self, name: str) -> list[ReceivedSpan]:
        return self.grpc_like.named(name)
