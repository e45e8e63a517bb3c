"""The round loop: rank 0 serves, ranks >= 1 host clients (one process: rank 0 does both).

build (set-up on every rank) -> loop (the rounds) -> report (each round's metrics to the result file);
worker, server, placement, resume, lock, memory and provenance serve them."""
