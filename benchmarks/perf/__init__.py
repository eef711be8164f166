"""How fast: decode and prefill throughput against stock (``speed``, ``prefill_compare``) and
where the scheduler's time goes per mode (``profile_scheduler``)."""
