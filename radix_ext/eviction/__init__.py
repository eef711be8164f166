"""RSBCM eviction: the radix cache whose nodes carry branch depth and score, its eviction policy,
and the tree's readback."""
