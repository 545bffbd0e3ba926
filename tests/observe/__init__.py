"""What an operator reads: metrics, events, job context and progress, OpenTelemetry,
stats under bad data, the metrics server under load."""
