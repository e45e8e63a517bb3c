"""Real data sets read offline from a data root, and their split across federated clients."""
