"""What runs inside SGLang's scheduler process: the radix-cache backend and its runtime hooks."""
