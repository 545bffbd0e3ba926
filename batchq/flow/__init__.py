"""Flow control: limits, their read model and metrics, circuit breakers."""
