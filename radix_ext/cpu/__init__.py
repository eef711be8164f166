"""The CPU path: the rksc_cpu attention backend, its speed settings, and the idle heap trim."""
