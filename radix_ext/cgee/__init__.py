"""CGEE's layer exit in the scheduler: flagged verification requests stop at their exit layer."""
