"""The confident early stop: trace-confidence and group stops, the groups of ``n > 1`` children,
and aborts that reach them."""
