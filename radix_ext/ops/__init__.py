"""The operator's side: request and batch guards, Prometheus metrics, and the KV pool readback."""
