"""The round loop: rank 0 serves, ranks >= 1 host clients (one process: rank 0 does both)."""
