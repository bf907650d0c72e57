#!/usr/bin/python3
"""CTest fixture: generates the engine tests' datasets and their reference
checksums once, before the tests that share them run (in parallel)."""
from harness import FULL, SMALL, dataset, reference

for name, shape in (("full", FULL), ("small", SMALL)):
    reference(dataset(name, **shape))
