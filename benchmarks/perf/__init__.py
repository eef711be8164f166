"""How fast: decode and prefill throughput against stock (``speed``, ``prefill_compare``), where
the scheduler's time goes per mode (``profile_scheduler``) and the bandwidth a decode-shaped linear
reaches (``gemv_bandwidth``)."""
