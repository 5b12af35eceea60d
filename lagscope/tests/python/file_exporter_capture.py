#!/usr/bin/env python3
"""Writes a capture as the OpenTelemetry Collector's file exporter writes it with `format: proto`
(each export request after its length, 4 bytes big-endian), and again with `compression: zstd`
(each request compressed on its own), from spans and a metric made by the OpenTelemetry Python
SDK and encoded by its own OTLP protobuf encoder.

Usage: file_exporter_capture.py OUT.binpb OUT.binpb-zstd

The history (HDFS RBF, ns1): client py-etl writes through router-1 to nn-active, which returns
state 5120; then it reads through router-2, which forwards the 5120 it carried, and observer
nn-obs1 serves the read at 5100 without requeueing it: a read-your-writes stale read. nn-obs1
reports its applied state (5100) as a gauge, in the same file between the spans.
"""

import struct
import sys
import time

import zstandard
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

MS = 1_000_000
BASE = time.time_ns() // 1_000_000_000 * 1_000_000_000


def resource(service, component, node):
    return Resource.create({"service.name": service, "lagscope.system": "hdfs-rbf",
                            "lagscope.cluster": "py-file-exporter", "lagscope.component": component,
                            "lagscope.node.id": node})


class Process:
    """One process's tracer, exporting into memory."""

    def __init__(self, service, component, node):
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=resource(service, component, node))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("lagscope-file-exporter-test", "1")

    def span(self, name, kind, start_ms, end_ms, attributes, parent=None):
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(name, context=context, kind=kind, start_time=BASE + start_ms * MS,
                                      attributes=attributes)
        span.end(end_time=BASE + end_ms * MS)
        return span


client = Process("hdfs-client", "client", "py-etl-host")
routers = {name: Process("hdfs-router", "router", name) for name in ("router-1", "router-2")}
namenodes = {name: Process("hdfs-namenode", "server", name) for name in ("nn-active", "nn-obs1")}

call = {"lagscope.client.id": "py-etl", "lagscope.namespace": "ns1", "lagscope.attempt": 0}
write = client.span("create", SpanKind.CLIENT, 0, 12, {
    **call, "lagscope.call.id": "w1", "lagscope.op": "write", "rpc.method": "create",
    "lagscope.target.node": "router-1", "lagscope.state.carried": 5000, "lagscope.state.returned": 5120,
    "lagscope.outcome": "ok"})
hop = routers["router-1"].span("create", SpanKind.SERVER, 1, 11, {
    "lagscope.client.id": "py-etl", "lagscope.namespace": "ns1", "lagscope.state.carried": 5000,
    "lagscope.state.router": 5120, "lagscope.target.node": "nn-active"}, parent=write)
namenodes["nn-active"].span("create", SpanKind.SERVER, 2, 10, {
    "lagscope.namespace": "ns1", "lagscope.node.role": "active", "lagscope.state.served": 5120,
    "lagscope.state.returned": 5120, "lagscope.state.committed": 5120}, parent=hop)
read = client.span("getFileInfo", SpanKind.CLIENT, 20, 31, {
    **call, "lagscope.call.id": "r1", "lagscope.op": "read", "rpc.method": "getFileInfo",
    "lagscope.target.node": "router-2", "lagscope.state.carried": 5120, "lagscope.state.returned": 5120,
    "lagscope.consistency": "OBSERVER", "lagscope.outcome": "ok"})
hop = routers["router-2"].span("getFileInfo", SpanKind.SERVER, 21, 30, {
    "lagscope.client.id": "py-etl", "lagscope.namespace": "ns1", "lagscope.state.carried": 5120,
    "lagscope.state.router": 5120, "lagscope.target.node": "nn-obs1"}, parent=read)
namenodes["nn-obs1"].span("getFileInfo", SpanKind.SERVER, 22, 29, {
    "lagscope.namespace": "ns1", "lagscope.node.role": "observer", "lagscope.state.served": 5100,
    "lagscope.state.returned": 5100, "lagscope.requeues": 0}, parent=hop)

reader = InMemoryMetricReader()
meter = MeterProvider(resource=resource("hdfs-namenode", "server", "nn-obs1"),
                      metric_readers=[reader]).get_meter("lagscope-file-exporter-test")
meter.create_gauge("lagscope.server.applied_state").set(5100, {"lagscope.namespace": "ns1"})

# As a Collector's pipelines would hand them over: the servers' and routers' spans in one
# request, the metric between them and the client's.
servers = [span for process in (*namenodes.values(), *routers.values())
           for span in process.exporter.get_finished_spans()]
requests = [encode_spans(servers), encode_metrics(reader.get_metrics_data()),
            encode_spans(client.exporter.get_finished_spans())]
compressor = zstandard.ZstdCompressor()
for path, encode in ((sys.argv[1], lambda body: body), (sys.argv[2], compressor.compress)):
    with open(path, "wb") as out:
        for request in requests:
            body = encode(request.SerializeToString())
            out.write(struct.pack(">I", len(body)) + body)
print(f"wrote {len(requests)} requests ({len(servers) + 2} spans, 1 metric) to {sys.argv[1]} and {sys.argv[2]}")
