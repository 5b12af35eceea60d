"""Exports spans, metrics and logs with the OpenTelemetry Python SDK to lagscope, once over
OTLP/HTTP (protobuf; spans gzipped, metrics deflated, logs as they are) and once over
OTLP/gRPC, as an instrumented Python service would.

    python export_all.py HTTP_ENDPOINT GRPC_ENDPOINT

HTTP_ENDPOINT is http://host:port (the SDK appends /v1/traces etc. itself only when configured
through the environment, so the signal paths are given here), GRPC_ENDPOINT host:port.
Exits non-zero if any export fails.
"""

import logging
import sys

from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

SPANS_PER_PROTOCOL = 20


FAILURES = []


def checked(exporter):
    """Wraps an exporter so that a failed export fails the script (the SDK's processors only
    log export failures)."""
    original = exporter.export

    def export(batch, *args, **kwargs):
        try:
            result = original(batch, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - reported below, whatever it is
            FAILURES.append(f"{type(exporter).__module__}: {error!r}")
            raise
        if getattr(result, "name", "SUCCESS") != "SUCCESS":
            FAILURES.append(f"{type(exporter).__module__}: export returned {result}")
        return result

    exporter.export = export
    return exporter


def run(protocol, span_exporter, metric_exporter, log_exporter):
    resource = Resource.create(
        {
            "service.name": f"python-client-{protocol}",
            "lagscope.system": "hdfs-rbf",
            "lagscope.cluster": "py-cluster",
            "lagscope.component": "client",
            "team": "storage",
        }
    )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(checked(span_exporter)))
    tracer = tracer_provider.get_tracer("python-hdfs-client")
    for index in range(SPANS_PER_PROTOCOL):
        with tracer.start_as_current_span(
            "getFileInfo",
            kind=SpanKind.CLIENT,
            attributes={
                "lagscope.client.id": f"py-{protocol}",
                "lagscope.namespace": "ns-py",
                "lagscope.op": "read",
                "lagscope.state.carried": 500 + index,
                "rpc.method": "getFileInfo",
                "custom.index": index,
                "custom.protocol": protocol,
                "custom.list": ["x", "y"],
            },
        ):
            pass
    tracer_provider.shutdown()

    reader = PeriodicExportingMetricReader(checked(metric_exporter), export_interval_millis=3_600_000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = meter_provider.get_meter("python-hdfs-router")
    counter = meter.create_counter("router.rpc.requests")
    counter.add(11, {"custom.protocol": protocol, "lagscope.node.id": "router-1"})
    histogram = meter.create_histogram("router.rpc.latency", unit="ms")
    for value in (1.5, 3.0, 250.0):
        histogram.record(value, {"custom.protocol": protocol})
    meter_provider.shutdown()

    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(checked(log_exporter)))
    logger = logging.getLogger(f"lagscope.test.{protocol}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = LoggingHandler(level=logging.INFO, logger_provider=logger_provider)
    logger.addHandler(handler)
    logger.warning(
        "Cannot get available namenode for ns-py",
        extra={"lagscope.client.id": f"py-{protocol}", "custom.protocol": protocol},
    )
    logger_provider.shutdown()


def main():
    http, grpc = sys.argv[1], sys.argv[2]
    run(
        "http",
        HttpSpanExporter(endpoint=f"{http}/v1/traces", compression=Compression.Gzip),
        HttpMetricExporter(endpoint=f"{http}/v1/metrics", compression=Compression.Deflate),
        HttpLogExporter(endpoint=f"{http}/v1/logs"),
    )
    run(
        "grpc",
        GrpcSpanExporter(endpoint=grpc, insecure=True),
        GrpcMetricExporter(endpoint=grpc, insecure=True),
        GrpcLogExporter(endpoint=grpc, insecure=True),
    )
    if FAILURES:
        print("export failures:", *FAILURES, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("exported", flush=True)


if __name__ == "__main__":
    main()
