"""ASKS: a request reuses what its substitution group computed after another opening (adopt mode
takes a donor's wording, blend mode its KV)."""
